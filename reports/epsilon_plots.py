"""The report's figures against the claimed ε: an attack's leakage (AUC, TPR at low FPR) and the
measured ε lower bounds beside the claim, one point per configuration. Drawn with the shared
pieces of :mod:`reports.plots` (colours, markers, error bars, the figure wrapper)."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.lines
import matplotlib.ticker

from audit.core.vocabulary import AttackKind, VerdictKind, VerdictStatus
from reports.document import Estimate, Experiment
from reports.plots import (
    MARKERS,
    VIOLATION_COLOR,
    Plot,
    _dodge,
    _error_bars,
    _legend_below,
    _probability,
    attack_colors,
    epsilon_ticks,
    plain,
    plt,
)


@Plot
def leakage_vs_epsilon(experiments: list[Experiment], metric: str = "auc") -> Any:
    """An attack metric (AUC or TPR at 1 % FPR, with 95 % intervals) of the membership attacks
    against the claimed ε: one colour per attack (:func:`attack_colors`), one marker per defense;
    non-private configurations as hollow markers at "no DP" on the right. The attacks at one ε are
    dodged sideways (deterministically, in the attacks' order) so that equal values — several
    attacks at AUC 1.0 — stay visible side by side."""
    figure, axis = plt.subplots(figsize=(5.6, 5.2))
    colors = attack_colors(experiments)
    private: dict[tuple[str, str], list[tuple[float, Estimate]]] = {}
    baselines: dict[tuple[str, str], Estimate] = {}
    for experiment in experiments:
        for attack in experiment.attacks:
            if attack.kind != AttackKind.MEMBERSHIP or metric not in attack.metrics:
                continue
            estimate = attack.metrics[metric]
            if not _probability(estimate.value):
                continue
            if not experiment.claim.is_private:
                baselines[(experiment.label, attack.attack)] = estimate
            elif experiment.claim.epsilon > 0:  # the ε axis is logarithmic
                private.setdefault((experiment.defense, attack.attack), []).append((experiment.claim.epsilon, estimate))
    if not private:
        plt.close(figure)
        return None
    attacks = [name for name in colors if any(name == a for _, a in (*private, *baselines))]
    groups = list(dict.fromkeys([d for d, _ in private] + [label for label, _ in baselines]))  # defenses, then baselines
    marker = {group: MARKERS[i % len(MARKERS)] for i, group in enumerate(groups)}
    epsilons = sorted({p[0] for points in private.values() for p in points})
    span = max(math.log10(epsilons[-1] / epsilons[0]), 1.0)
    no_dp = epsilons[-1] * 10.0 ** (0.3 * span)  # where the non-private values sit, right of every ε
    order = sorted(private.items(), key=lambda item: (groups.index(item[0][0]), attacks.index(item[0][1])))
    for (defense, name), points in order:
        points.sort(key=lambda p: p[0])
        shift = _dodge(attacks.index(name), len(attacks))
        values, lows, highs = _error_bars([p[1] for p in points])
        axis.errorbar([p[0] * shift for p in points], values, yerr=[lows, highs], marker=marker[defense], capsize=2,
                      color=colors[name], markersize=5, linewidth=1, clip_on=False)
    for (label, name), estimate in baselines.items():
        values, lows, highs = _error_bars([estimate])
        axis.errorbar([no_dp * _dodge(attacks.index(name), len(attacks))], values, yerr=[lows, highs], marker=marker[label],
                      markerfacecolor="white", capsize=2, color=colors[name], markersize=5, linewidth=1, clip_on=False)
    if metric == "auc":
        axis.axhline(0.5, color="grey", linewidth=1, linestyle=":")
    if baselines:
        axis.axvline(math.sqrt(epsilons[-1] * no_dp), color="#bbbbbb", linewidth=0.8)
    ticks = epsilons + ([no_dp] if baselines else [])
    epsilon_ticks(axis, ticks)
    axis.set_xticks(ticks, [f"{t:.3g}" for t in epsilons] + (["no DP"] if baselines else []))
    axis.set_xlim(epsilons[0] / 10.0 ** (0.25 * span), (no_dp if baselines else epsilons[-1]) * 10.0 ** (0.25 * span))
    name = "AUC" if metric == "auc" else "TPR at 1 % FPR"
    axis.set(xlabel="claimed ε", ylabel=name, title=f"membership leakage ({name}) vs claimed ε")
    handles = [matplotlib.lines.Line2D([], [], color=colors[a], marker="o", linewidth=1, label=plain(a)) for a in attacks]
    dp_groups = {defense for defense, _ in private}
    handles += [matplotlib.lines.Line2D([], [], color="#555555", marker=marker[g], linestyle="none",
                                        markerfacecolor="#555555" if g in dp_groups else "white",
                                        label=plain(g if g in dp_groups else f"{g} (no DP)")) for g in groups]
    if metric == "auc":
        handles.append(matplotlib.lines.Line2D([], [], color="grey", linewidth=1, linestyle=":", label="chance"))
    _legend_below(axis, columns=2, fontsize=6.5, handles=handles)
    axis.grid(True, alpha=0.3)
    return figure


@Plot
def empirical_vs_claimed(experiments: list[Experiment]) -> Any:
    """Every measured ε lower bound (●), Gaussian-fit interval's lower end (■) and parametric test's
    lower end (◆) against what the claim allows for its unit, one colour per attack
    (:func:`attack_colors`), a violation ringed in red, with the diagonal: a point above it is a
    violation (or, for an estimate, a warning). Where the values span more than two decades the
    axes are linear up to 1 and logarithmic beyond."""
    figure, axis = plt.subplots(figsize=(5.6, 5.6))
    markers = {VerdictKind.LOWER_BOUND: "o", VerdictKind.ESTIMATE: "s", VerdictKind.PARAMETRIC: "D"}
    colors = attack_colors(experiments)
    points: list[tuple[str, float, float, str, bool]] = []
    for experiment in experiments:
        for attack in experiment.attacks:
            for verdict in attack.verdicts:
                bound, measured = verdict.bound, verdict.measured
                # beyond 1e300 the axis's tick arithmetic overflows (only a hand-edited file holds such ε)
                if bound is None or measured is None or not (abs(bound) <= 1e300 and abs(measured) <= 1e300):
                    continue
                points.append((attack.attack, bound, measured, markers.get(verdict.kind, "D"),
                               verdict.status == VerdictStatus.VIOLATION))
    if not points:
        plt.close(figure)
        return None
    attacks = [name for name in colors if any(p[0] == name for p in points)]
    largest = max(max(p[1], p[2]) for p in points)
    smallest = min((v for p in points for v in p[1:3] if v > 0), default=1.0)
    wide = largest > 0 and largest / max(smallest, 1e-300) > 100
    for name, bound, measured, shape, violation in points:
        # a slight dodge on the log part (a few per cent of the bound: the value stays readable)
        x = bound * _dodge(attacks.index(name), len(attacks), 0.006) if wide and bound > 1 else bound
        axis.scatter([x], [measured], marker=shape, color=colors[name], s=26, zorder=3, clip_on=False,
                     edgecolors=VIOLATION_COLOR if violation else "none", linewidths=1.6 if violation else 0)
    top = largest * (2.5 if wide else 1.1) + 0.1
    floor = -0.05 * (1.0 if wide else top)
    axis.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1)
    if wide:
        axis.set_xscale("symlog", linthresh=1.0, linscale=0.6)
        axis.set_yscale("symlog", linthresh=1.0, linscale=0.6)
        for direction in (axis.xaxis, axis.yaxis):
            direction.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            direction.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.set(xlim=(floor, top), ylim=(floor, top), xlabel="ε the claim allows (for the unit measured)",
             ylabel="measured ε", title="empirical vs claimed ε")
    handles = [matplotlib.lines.Line2D([], [], color=colors[a], marker="o", linestyle="none", label=plain(a)) for a in attacks]
    shapes = {p[3] for p in points}
    if "o" in shapes:
        handles.append(matplotlib.lines.Line2D([], [], color="#555555", marker="o", linestyle="none", label="ε lower bound"))
    if "s" in shapes:
        handles.append(matplotlib.lines.Line2D([], [], color="#555555", marker="s", linestyle="none",
                                               label="lower end of a Gaussian-fit estimate's 95 % interval"))
    if "D" in shapes:
        handles.append(matplotlib.lines.Line2D([], [], color="#555555", marker="D", linestyle="none",
                                               label="parametric test's ε lower end (if the Gaussian model holds)"))
    if any(p[4] for p in points):
        handles.append(matplotlib.lines.Line2D([], [], color="white", marker="o", markeredgecolor=VIOLATION_COLOR,
                                               markeredgewidth=1.6, linestyle="none", label="red ring: VIOLATION"))
    handles.append(matplotlib.lines.Line2D([], [], color="grey", linestyle="--", linewidth=1,
                                           label="measured = allowed (above: the claim is exceeded)"))
    _legend_below(axis, columns=2, fontsize=6.5, handles=handles)
    axis.grid(True, alpha=0.3)
    return figure
