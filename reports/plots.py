"""Plots for the report, rendered with matplotlib (Agg).

Each plot is a :class:`Plot`: called, it gives the base64 PNG the HTML report embeds; its
``figure`` gives the matplotlib figure itself, which :mod:`reports.figures` saves as PNG and PDF
files — one drawing for both. PNG metadata is stripped of the software version so the same
results give the same bytes.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import math
import typing
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from audit.core.vocabulary import VerdictKind, VerdictStatus  # noqa: E402
from reports.document import Estimate, Experiment  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
#: the colour of a violation, and the cycle without the red that could be mistaken for it
VIOLATION_COLOR = "#b00020"
NOT_RED = [c for c in COLORS if matplotlib.colors.to_hex(c) != "#d62728"]


def plain(text: object) -> str:
    """``text`` as matplotlib draws it literally: labels, names and titles a user wrote are text,
    never markup. Matplotlib reads a string with a pair of unescaped ``$`` as mathtext, and a label
    like ``leak $\\frac{$`` then fails to parse (or ``$x$`` renders as an italic x); each ``$``
    escaped as ``\\$`` is drawn as a plain ``$``, and outside mathtext a backslash is drawn as it is.
    Every string that reaches a figure from a config or a results file goes through here.
    Control characters (a NUL, a bell), which no font draws, are shown as their escapes (``\\x00``)."""
    text = "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in str(text))
    return text.replace("$", r"\$")


@contextlib.contextmanager
def glyphs_may_be_missing() -> Iterator[None]:
    """Draw text the font lacks glyphs for (a label in a script DejaVu Sans does not cover) as
    boxes, without matplotlib's warning for each glyph: the report shows the text itself, and the
    warnings were lines on stderr for a figure that is otherwise fine."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)
        yield


def _png(figure) -> str:
    buffer = io.BytesIO()
    with glyphs_may_be_missing():
        figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class Plot:
    """A drawing function ``draw(...) -> Figure | None`` (None: nothing to draw): calling the plot
    gives the base64 PNG of the figure (None when there is none); :meth:`figure` the figure."""

    def __init__(self, draw: Callable[..., Any]):
        self.figure = _closing_on_error(draw)
        functools.update_wrapper(self, draw)

    def __call__(self, *args: Any, **kwargs: Any) -> str | None:
        figure = self.figure(*args, **kwargs)
        return None if figure is None else _png(figure)


def _closing_on_error(draw: Callable[..., Any]) -> Callable[..., Any]:
    """``draw``, closing the figures it opened when it fails: pyplot keeps every open figure, so a
    process that draws many reports (a test run, a notebook) would otherwise keep each failed one."""

    @functools.wraps(draw)
    def closing(*args: Any, **kwargs: Any) -> Any:
        before = set(plt.get_fignums())
        try:
            return draw(*args, **kwargs)
        except BaseException:
            for number in set(plt.get_fignums()) - before:
                plt.close(number)
            raise

    return closing


@Plot
def roc_plot(experiments: list[Experiment], attack: str) -> Any:
    """Log–log ROC curves of one attack, one line per experiment, with the chance diagonal."""
    figure, axis = plt.subplots(figsize=(5.2, 4.4))
    drawn = False
    for i, experiment in enumerate(experiments):
        for result in experiment.attacks:
            if result.attack != attack:
                continue
            fpr, tpr = result.roc.fpr, result.roc.tpr
            points = [(f, t) for f, t in zip(fpr, tpr) if f > 0 and t > 0]
            if not points:
                continue
            auc = result.metrics["auc"].value if "auc" in result.metrics else None
            axis.plot([p[0] for p in points], [p[1] for p in points], color=COLORS[i % len(COLORS)],
                      label=plain(f"{experiment.label} (AUC {format_number(auc)})"))
            drawn = True
    if not drawn:
        plt.close(figure)
        return None
    axis.plot([1e-5, 1], [1e-5, 1], color="grey", linestyle="--", linewidth=1, label="chance")
    axis.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1.02), xlabel="false positive rate",
             ylabel="true positive rate", title=plain(f"{attack}: ROC (log–log)"))
    for scale in (axis.xaxis, axis.yaxis):
        # plain decimals and no minor ticks: mathtext labels (10⁻⁴) and minor log ticks made saving
        # a ROC plot four times slower, and an audit draws one per attack for the report and its files
        scale.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        scale.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.legend(fontsize=7, loc="lower right")
    axis.grid(True, which="major", alpha=0.3)
    return figure


@Plot
def accuracy_vs_epsilon(experiments: list[Experiment]) -> Any:
    """Test accuracy (mean and 95 % interval over runs) against the claimed ε; non-private
    defenses are drawn as horizontal reference lines."""
    figure, axis = plt.subplots(figsize=(5.2, 4.0))
    by_defense: dict[str, list[tuple[float, Estimate]]] = {}
    baselines = []
    for experiment in experiments:
        accuracy = experiment.utility.test_accuracy
        if not _probability(accuracy.value):
            continue
        epsilon = experiment.claim.epsilon
        if not experiment.claim.is_private:
            baselines.append((experiment.label, accuracy.value))
        elif epsilon > 0:  # the ε axis is logarithmic
            by_defense.setdefault(experiment.defense, []).append((epsilon, accuracy))
    if not by_defense and not baselines:
        plt.close(figure)
        return None
    for i, (defense, points) in enumerate(sorted(by_defense.items())):
        points.sort(key=lambda p: p[0])
        xs = [p[0] for p in points]
        ys, lows, highs = _error_bars([p[1] for p in points])
        axis.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, color=COLORS[i % len(COLORS)], label=plain(defense))
    for j, (label, value) in enumerate(baselines):
        axis.axhline(value, linestyle="--", color=COLORS[(len(by_defense) + j) % len(COLORS)], label=plain(f"{label} (no DP)"))
    if by_defense:
        axis.set_xscale("log")
        ticks = sorted({p[0] for points in by_defense.values() for p in points})
        axis.set_xticks(ticks, [f"{t:.3g}" for t in ticks])
        axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.set(xlabel="claimed ε", ylabel="test accuracy", title="privacy–utility", ylim=(0, 1.02))
    axis.legend(fontsize=7, loc="lower right")
    axis.grid(True, alpha=0.3)
    return figure


def _probability(value: float | None) -> typing.TypeGuard[float]:
    """Whether ``value`` can be drawn on an axis of probabilities (accuracy, AUC, TPR): a results
    file edited by hand may hold anything, and a point off the axis would not be seen anyway."""
    return value is not None and 0.0 <= value <= 1.0


def _error_bars(estimates: list[Estimate]) -> tuple[list[float], list[float], list[float]]:
    """Values (all in [0, 1]) and the distances down and up to their interval's ends, the ends
    clipped to [0, 1] (0 where an end is missing, or lies on the wrong side of its value: a
    percentile bootstrap interval need not contain the point estimate)."""
    values = [float(typing.cast(float, e.value)) for e in estimates]

    def end(bound: float | None, value: float) -> float:
        return value if bound is None or math.isnan(bound) else min(max(bound, 0.0), 1.0)

    lows = [max(v - end(e.ci_low, v), 0.0) for v, e in zip(values, estimates)]
    highs = [max(end(e.ci_high, v) - v, 0.0) for v, e in zip(values, estimates)]
    return values, lows, highs


def _column(rows: list[dict[str, int | float | None]], name: str) -> list[float]:
    """One metric of per-round rows that all carry it."""
    return [float(typing.cast(float, r[name])) for r in rows]


def format_number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


@Plot
def round_curves(experiments: list[Experiment], metric: str, title: str, ylabel: str, band: tuple[str, str] | None = None,
                 log: bool = False) -> Any:
    """A per-round curve (mean over runs) for each experiment, with an optional band (e.g. the IQR)."""
    figure, axis = plt.subplots(figsize=(5.2, 4.0))
    drawn = False
    for i, experiment in enumerate(experiments):
        rows = [r for r in experiment.rounds if r.get(metric) is not None]
        if not rows:
            continue
        xs, ys = _column(rows, "round"), _column(rows, metric)
        color = COLORS[i % len(COLORS)]
        axis.plot(xs, ys, color=color, label=plain(experiment.label), linewidth=1.2)
        if band and all(r.get(band[0]) is not None and r.get(band[1]) is not None for r in rows):
            axis.fill_between(xs, _column(rows, band[0]), _column(rows, band[1]), color=color, alpha=0.15)
        drawn = True
    if not drawn:
        plt.close(figure)
        return None
    if log:
        axis.set_yscale("log")
    axis.set(xlabel="round", ylabel=ylabel, title=title)
    axis.legend(fontsize=6, loc="best")
    axis.grid(True, alpha=0.3)
    return figure


def _epsilon_ticks(axis, epsilons: list[float]) -> None:
    axis.set_xscale("log")
    ticks = sorted(set(epsilons))
    axis.set_xticks(ticks, [f"{t:.3g}" for t in ticks])
    axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


@Plot
def leakage_vs_epsilon(experiments: list[Experiment], metric: str = "auc") -> Any:
    """An attack metric (AUC or TPR at 1 % FPR, with 95 % intervals) against the claimed ε, one line
    per (defense, attack) for the membership attacks; non-private defenses as dashed lines."""
    figure, axis = plt.subplots(figsize=(5.2, 4.0))
    lines: dict[tuple[str, str], list[tuple[float, Estimate]]] = {}
    baselines = []
    for experiment in experiments:
        for attack in experiment.attacks:
            if attack.kind != "membership" or metric not in attack.metrics:
                continue
            estimate = attack.metrics[metric]
            if not _probability(estimate.value):
                continue
            if not experiment.claim.is_private:
                baselines.append((f"{experiment.label}: {attack.attack}", estimate.value))
            elif experiment.claim.epsilon > 0:  # the ε axis is logarithmic
                lines.setdefault((experiment.defense, attack.attack), []).append((experiment.claim.epsilon, estimate))
    if not lines:
        plt.close(figure)
        return None
    for i, ((defense, name), points) in enumerate(sorted(lines.items())):
        points.sort(key=lambda p: p[0])
        values, lows, highs = _error_bars([p[1] for p in points])
        axis.errorbar([p[0] for p in points], values, yerr=[lows, highs], marker="o", capsize=3,
                      color=COLORS[i % len(COLORS)], label=plain(f"{defense}: {name}"))
    for j, (label, value) in enumerate(baselines):
        axis.axhline(value, linestyle="--", linewidth=1, color=COLORS[(len(lines) + j) % len(COLORS)],
                     label=plain(f"{label} (no DP)"))
    if metric == "auc":
        axis.axhline(0.5, color="grey", linewidth=1, linestyle=":", label="chance")
    _epsilon_ticks(axis, [p[0] for points in lines.values() for p in points])
    name = "AUC" if metric == "auc" else "TPR at 1 % FPR"
    axis.set(xlabel="claimed ε", ylabel=name, title=f"membership leakage ({name}) vs claimed ε")
    axis.legend(fontsize=6, loc="best")
    axis.grid(True, alpha=0.3)
    return figure


@Plot
def empirical_vs_claimed(experiments: list[Experiment]) -> Any:
    """Every measured ε lower bound (and Gaussian-fit interval) against what the claim allows for
    its unit, with the diagonal: a point above the diagonal is a violation (or, for an estimate,
    a warning)."""
    figure, axis = plt.subplots(figsize=(5.2, 4.4))
    markers = {VerdictKind.LOWER_BOUND: "o", VerdictKind.ESTIMATE: "s"}
    labelled: set[int] = set()  # one legend entry per experiment
    largest = 0.0
    for i, experiment in enumerate(experiments):
        for attack in experiment.attacks:
            for verdict in attack.verdicts:
                bound, measured = verdict.bound, verdict.measured
                # beyond 1e300 the axis's tick arithmetic overflows (only a hand-edited file holds such ε)
                if bound is None or measured is None or not (abs(bound) <= 1e300 and abs(measured) <= 1e300):
                    continue
                color = VIOLATION_COLOR if verdict.status == VerdictStatus.VIOLATION else NOT_RED[i % len(NOT_RED)]
                axis.scatter([bound], [measured], marker=markers.get(verdict.kind, "D"), color=color, s=22,
                             label=None if i in labelled else plain(experiment.label))
                labelled.add(i)
                largest = max(largest, bound, measured)
    if not labelled:
        plt.close(figure)
        return None
    top = largest * 1.1 + 0.1
    axis.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1, label="measured = claimed")
    axis.set(xlim=(0, top), ylim=(0, top), xlabel="ε the claim allows (2ε for a record under a client claim)",
             ylabel="measured ε (lower bound ●, lower end of the estimate ■)", title="empirical vs claimed ε")
    axis.legend(fontsize=6, loc="upper left")
    axis.grid(True, alpha=0.3)
    return figure
