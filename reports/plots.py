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
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from reports.document import AttackRecord, Estimate, Experiment  # noqa: E402

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


#: the colours of attacks: tab10 without its red (kept for violations) and grey (kept for chance and
#: reference lines), then darker tones of tab20b; an attack's colour is the same in every figure
ATTACK_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
                  "#393b79", "#637939", "#8c6d31", "#7b4173", "#5254a3", "#8ca252", "#bd9e39", "#a55194")
#: line styles and markers that tell configurations apart where the colour is the attack's
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
#: horizontal dodge between attacks drawn at the same ε, in decades of the log ε axis
DODGE_DECADES = 0.035


def attack_colors(experiments: list[Experiment]) -> dict[str, str]:
    """attack name → colour, one per attack throughout a report's figures: in the order the
    attacks first appear in the document (the order the audit ran them: the attack catalog's, as
    configured), so the same results always give the same colours, and no two attacks of a
    document share one (up to :data:`ATTACK_PALETTE`'s 16; beyond, the palette repeats)."""
    names: list[str] = []
    for experiment in experiments:
        names += [a.attack for a in experiment.attacks if a.attack not in names]
    return {name: ATTACK_PALETTE[i % len(ATTACK_PALETTE)] for i, name in enumerate(names)}


def _dodge(index: int, count: int, decades: float = DODGE_DECADES) -> float:
    """The factor that moves the ``index``-th of ``count`` attacks sideways on a log axis, by
    ``decades`` between neighbours: centred, deterministic, so points of different attacks at one
    value stay apart."""
    return float(10.0 ** ((index - (count - 1) / 2.0) * decades))


def _legend_below(axis, columns: int = 2, fontsize: float = 7, **kwargs: Any) -> Any:
    """The legend under the axes, outside them: it never covers a data point. ``columns`` at most."""
    handles, _ = axis.get_legend_handles_labels()
    extra = kwargs.pop("handles", None)
    count = len(extra) if extra is not None else len(handles)
    if not count:
        return None
    if extra is not None:
        kwargs["handles"] = extra
    return axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=max(1, min(columns, count)),
                       fontsize=fontsize, frameon=False, **kwargs)


def _roc_limit(curves: list[tuple[list[float], list[float]]]) -> float:
    """The lowest rate a log–log ROC panel shows: a power of ten just below the smallest non-zero
    FPR or TPR of its curves (the finest step the scores resolve), between 10⁻⁵ and 10⁻²; an FPR of
    0 is drawn on it. A panel of 16 non-member scores thus starts at 0.01, not at 10⁻⁴."""
    positive = [v for fpr, tpr in curves for v in (*fpr, *tpr) if 0.0 < v <= 1.0]
    smallest = min(positive, default=1e-4)
    return min(max(10.0 ** math.floor(math.log10(smallest) - 1e-9), 1e-5), 0.01)


def _roc_curves(experiments: list[Experiment],
                attack: str) -> list[tuple[int, Experiment, AttackRecord, list[float], list[float]]]:
    """(configuration index, experiment, its record of ``attack``, FPR, TPR) of every configuration
    that scored ``attack`` (a curve of at least two points); none when nothing was scored."""
    curves = []
    for i, experiment in enumerate(experiments):
        for result in experiment.attacks:
            if result.attack != attack:
                continue
            points = [(f, t) for f, t in zip(result.roc.fpr, result.roc.tpr)
                      if f is not None and t is not None and 0.0 <= f <= 1.0 and 0.0 <= t <= 1.0]
            if len(points) >= 2:
                curves.append((i, experiment, result, [p[0] for p in points], [p[1] for p in points]))
    return curves


def draw_roc(axis, experiments: list[Experiment], attack: str, color: str, legend_columns: int = 1) -> bool:
    """One log–log ROC panel of ``attack`` on ``axis``: a line per configuration in the attack's
    colour (configurations told apart by line style), the chance diagonal, and margins round the
    unit square, so that a perfect attack's curve (TPR 1 from the smallest FPR on) is seen, not
    hidden under the top border. False (nothing drawn) when no configuration scored the attack."""
    curves = _roc_curves(experiments, attack)
    if not curves:
        return False
    low = _roc_limit([(fpr, tpr) for *_, fpr, tpr in curves])
    for i, experiment, result, fpr, tpr in curves:
        auc = result.metrics["auc"].value if "auc" in result.metrics else None
        # a point of TPR 0 detects nothing and has no place on log axes; one of FPR 0 (a perfect
        # attack's TPR at FPR 0) is drawn on the left edge
        kept = [(max(f, low), t) for f, t in zip(fpr, tpr) if t > 0]
        axis.plot([p[0] for p in kept], [p[1] for p in kept], color=color, linewidth=1.8,
                  linestyle=LINE_STYLES[i % len(LINE_STYLES)], clip_on=False, zorder=3, solid_capstyle="butt",
                  label=plain(f"{experiment.label} (AUC {format_number(auc)})"))
    axis.plot([low, 1], [low, 1], color="grey", linestyle=(0, (2, 2)), linewidth=1, label="chance", zorder=2)
    margin = 1.6  # a factor: on log axes the margin round [low, 1] is multiplicative
    axis.set(xscale="log", yscale="log", xlim=(low / margin, margin), ylim=(low / margin, margin),
             xlabel="false positive rate", ylabel="true positive rate", title=plain(attack))
    ticks = [10.0 ** k for k in range(round(math.log10(low)), 1)]
    for scale in (axis.xaxis, axis.yaxis):
        # plain decimals and no minor ticks: mathtext labels (10⁻⁴) and minor log ticks made saving
        # a ROC plot four times slower, and an audit draws one per attack for the report and its files
        scale.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        scale.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        scale.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.grid(True, which="major", alpha=0.3)
    _legend_below(axis, columns=legend_columns, fontsize=7)
    return True


def roc_attacks(experiments: list[Experiment]) -> list[str]:
    """The attacks with a ROC curve to draw, in document order: an attack without scores (no
    curve in any configuration) gets no panel."""
    names: list[str] = []
    for experiment in experiments:
        names += [a.attack for a in experiment.attacks if a.roc.fpr and a.attack not in names]
    return [name for name in names if _roc_curves(experiments, name)]


@Plot
def roc_plot(experiments: list[Experiment], attack: str) -> Any:
    """Log–log ROC curves of one attack, one line per configuration, with the chance diagonal
    (:func:`draw_roc`); None when no configuration scored it."""
    figure, axis = plt.subplots(figsize=(5.2, 5.6))
    if not draw_roc(axis, experiments, attack, attack_colors(experiments).get(attack, ATTACK_PALETTE[0])):
        plt.close(figure)
        return None
    return figure


@Plot
def roc_grid(experiments: list[Experiment], columns: int = 3) -> Any:
    """Every scored attack's ROC panel (:func:`draw_roc`) in one figure, ``columns`` panels a row:
    only attacks with curves get a panel, and the grid has exactly the rows they fill."""
    names = roc_attacks(experiments)
    if not names:
        return None
    columns = max(1, min(columns, len(names)))
    rows = math.ceil(len(names) / columns)
    legend_lines = len(experiments) + 1
    figure, axes = plt.subplots(rows, columns, figsize=(3.7 * columns, (3.5 + 0.16 * legend_lines) * rows), squeeze=False)
    colors = attack_colors(experiments)
    for axis, name in zip(axes.flat, names):
        draw_roc(axis, experiments, name, colors[name])
    for axis in list(axes.flat)[len(names):]:
        figure.delaxes(axis)  # the last row's empty places: no empty panel
    with glyphs_may_be_missing():
        figure.tight_layout(h_pad=1.2, w_pad=1.0)
    return figure


@Plot
def accuracy_vs_epsilon(experiments: list[Experiment], chance: float | None = None) -> Any:
    """Test accuracy (mean and 95 % interval over runs) against the claimed ε; non-private
    defenses are drawn as horizontal reference lines, and ``chance`` (the accuracy of always
    predicting the test set's most common class; None: not known) as a dotted grey one. The legend
    sits under the axes."""
    figure, axis = plt.subplots(figsize=(5.2, 4.6))
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
        axis.errorbar(xs, ys, yerr=[lows, highs], marker=MARKERS[i % len(MARKERS)], capsize=3,
                      color=COLORS[i % len(COLORS)], label=plain(defense))
    for j, (label, value) in enumerate(baselines):
        axis.axhline(value, linestyle="--", color=COLORS[(len(by_defense) + j) % len(COLORS)], label=plain(f"{label} (no DP)"))
    if chance is not None and _probability(chance):
        axis.axhline(chance, linestyle=":", color="grey", linewidth=1.2, label="chance (most common class)")
    if by_defense:
        epsilon_ticks(axis, [p[0] for points in by_defense.values() for p in points])
    axis.set(xlabel="claimed ε", ylabel="test accuracy", title="privacy–utility", ylim=(0, 1.02))
    _legend_below(axis)
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
    figure, axis = plt.subplots(figsize=(5.2, 4.6))
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
    _legend_below(axis, fontsize=6)
    axis.grid(True, alpha=0.3)
    return figure


def epsilon_ticks(axis, epsilons: list[float]) -> None:
    """A log ε axis with a tick at each claimed ε (no minor ticks)."""
    axis.set_xscale("log")
    ticks = sorted(set(epsilons))
    axis.set_xticks(ticks, [f"{t:.3g}" for t in ticks])
    axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


#: row labels of a reconstruction grid (top row, bottom row), by the attack's kind of picture
GRID_ROWS = {"model-inversion": ("training record", "inversion")}
DEFAULT_GRID_ROWS = ("original", "reconstruction")


def grid_rows(attack: str) -> tuple[str, str]:
    """What the two rows of ``attack``'s reconstruction grid show (top, bottom)."""
    return next((rows for prefix, rows in GRID_ROWS.items() if attack.startswith(prefix)), DEFAULT_GRID_ROWS)


@Plot
def reconstruction_grid(png: bytes, title: str, rows: tuple[str, str] = DEFAULT_GRID_ROWS, gap: int = 2) -> Any:
    """A reconstruction grid (the attack's PNG: the originals in the top row, the reconstructions
    below, one column per record, tiles separated by ``gap`` white pixels) drawn large with sharp
    pixels, its rows labelled with ``rows`` and its columns numbered."""
    import matplotlib.image

    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    height, width = image.shape[:2]
    tile = max((height - 3 * gap) / 2.0, 1.0)
    columns = max(1, round((width - gap) / (tile + gap)))
    scale = 6.0 / max(height, width)
    figure, axis = plt.subplots(figsize=(max(width * scale + 1.3, 3.6), max(height * scale + 1.0, 2.6)))
    axis.imshow(image, interpolation="nearest", cmap="gray" if image.ndim == 2 else None, vmin=0.0, vmax=1.0)
    axis.set_yticks([gap + tile / 2.0, 2 * gap + 1.5 * tile], [plain(rows[0]), plain(rows[1])])
    step = max(1, math.ceil(columns / 16))
    centres = [gap + c * (tile + gap) + tile / 2.0 for c in range(0, columns, step)]
    axis.set_xticks(centres, [str(c + 1) for c in range(0, columns, step)])
    axis.tick_params(length=0, labelsize=8)
    for side in axis.spines.values():
        side.set_visible(False)
    axis.set_xlabel("record", fontsize=8)
    axis.set_title(plain(title), fontsize=8)
    return figure
