"""Intervals for membership metrics that respect the design's dependence: the two-way
("pigeonhole") cluster bootstrap over runs and units.

A membership experiment scores every (run, unit) pair. The scores are not independent: a unit
is more or less vulnerable in every run (a unit effect), a run is more or less leaky for every
unit and its reference set is shared (a run effect), and leave-one-out scoring couples runs.
Intervals that treat the R·U scores as independent — DeLong for the AUC, Clopper–Pearson for a
TPR — are then too narrow or too wide, depending on the sign of the correlations (measured on a
null pipeline, DP-FedAvg at ε = 0.05: 87 % and 100 % coverage of nominal 95 % intervals).

The estimand is the leakage of the *training procedure*: the expectation over training
randomness and over the unit population (Carlini et al. 2022, §V evaluate over many target
models). Runs and units are both random samples, crossed, so the variance of a pooled statistic
has a run component, a unit component and a cell (interaction) component:
V ≈ σ²_run/R + σ²_unit/U + σ²_cell/(R·U).

Resampling runs and units together (Owen 2007, "The pigeonhole bootstrap") counts the cell
component about three times; when it dominates — as it does for membership scores — its
intervals cover 99.5 % instead of 95 % (measured). We therefore combine three one-way bootstraps
as Cameron, Gelbach & Miller do for two-way clustering ("Robust inference with multiway
clustering", J. Bus. Econ. Stat. 29(2), 2011): V = V_runs + V_units − V_cells, where V_runs
resamples whole runs (σ²_run/R + σ²_cell/(RU)), V_units whole units (σ²_unit/U + σ²_cell/(RU))
and V_cells single cells (≈ σ²_cell/(RU)). A resample is a weight per cell (the multiplicity of
its run, unit or cell in the resample), so every statistic is a weighted ROC quantity computed
from one sort.

**Few clusters.** Client-level designs have 10–20 units and 8–16 runs: a variance estimated from
G cluster totals is biased low by (G − 1)/G and has only G − 1 degrees of freedom, so
point ± 1.96·√V under-covers (measured: 81–90 % for the AUC of LiRA and the loss threshold
on 16 runs × 10–20 clients, null and leaky). As CGM (2011, §2.3) recommend, each one-way
variance is multiplied by G/(G − 1) for its number of clusters G, and the critical value is
Student's t with the Satterthwaite (1946) degrees of freedom of V as the combination of the
one-way variances that enter it (:func:`combined_variance`): when a run or unit component is
present its bootstrap's G − 1 degrees of freedom dominate, when only the cell component is
(record-level designs, thousands of cells) t ≈ z. Chosen among five variants by coverage on 150
pipeline replicates of a null and a leaky design (every AUC within 0.93–0.975), then
validated on fresh seeds by ``benchmarks/coverage.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic: `list` and `config` name attacks without scipy.stats
    stats = lazy_module("scipy.stats")


#: bootstrap replicates per interval
REPLICATES = 300  # per one-way bootstrap: the SE of a standard deviation estimate is ≈ 4 %


class WeightedRoc:
    """ROC quantities of pooled scores under weights, comparing only cells of different units.

    **Why pairs of one unit are left out.** Leave-one-out scoring gives target run t's score for
    unit u from the other runs' signals *and membership* of u. A member cell (t, u) and a
    non-member cell (s, u) of the same unit therefore see each other's truth: t's references
    hold s as a non-member and s's hold t as a member. For every attack that learns from the
    references (LiRA-online's in/out Gaussians, Shokri's classifier, or simply "how often was u in
    the references") this tilts the comparison against the member, so the pooled AUC is biased
    *below* 0.5 under a null — the known negative bias of pooled leave-one-out AUC (Airola,
    Pahikkala, Waegeman, De Baets, Salakoski 2011, "An experimental comparison of
    cross-validation techniques for estimating the area under the ROC curve", CSDA 55(4); their
    remedy, leave-pair-out, is what this does). Measured with the LiRA code on a null of 8 runs ×
    5 units: pooled AUC 0.469 ± 0.004 over 1,000 replicates. Pairs of different units never
    share a coin with each other's references, so under a null their comparison is fair.

    Every statistic follows: the AUC is the Mann–Whitney statistic over (member, non-member) pairs
    of different units; a member cell's FPR is the share of non-members *of other units* scoring
    at least as high, and TPR at FPR x is the share of members whose FPR is ≤ x — with one unit
    per cell (``units`` None) these are the ordinary pooled ROC, AUC and TPR at fixed FPR. Ties
    count half in the AUC, and as detected at a threshold equal to the score.
    """

    def __init__(self, scores: np.ndarray, truth: np.ndarray, units: np.ndarray | None = None,
                 strata: np.ndarray | None = None):
        flat = np.asarray(scores, dtype=np.float64).ravel()
        self.positive = np.asarray(truth).astype(bool).ravel()
        self.size = flat.size
        self.unit = np.arange(flat.size) if units is None else np.asarray(units).ravel()
        stratum = (np.zeros(flat.size, dtype=np.int64) if strata is None
                   else np.unique(np.asarray(strata).ravel(), return_inverse=True)[1])
        # cells are compared within a stratum and, inside it, never with a cell of their own unit:
        # tie groups of the descending order per stratum, and per (stratum, unit)
        self.stratum_group, self.stratum_of_group = self._tie_groups(flat, stratum)
        own_unit = stratum * (int(self.unit.max()) + 1 if flat.size else 1) + self.unit  # (stratum, unit) blocks
        self.pair_block_group, self.pair_block_of_group = self._tie_groups(flat, own_unit)
        self.strata = int(stratum.max()) + 1 if flat.size else 0
        self.pair_blocks = int(own_unit.max()) + 1 if flat.size else 0
        self.stratum, self.own_unit = stratum, own_unit

    @staticmethod
    def _tie_groups(flat: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group ids in (block ascending, score descending) order — cells of one block with one
        score share a group — and the block of every group."""
        order = np.lexsort((-flat, block))
        # neighbours compared, not subtracted: the difference of scores near ±1e308 overflows
        scores, blocks = flat[order], block[order]
        change = (scores[1:] != scores[:-1]) | (blocks[1:] != blocks[:-1])
        group = np.empty(order.size, dtype=np.int64)
        group[order] = np.r_[0, np.cumsum(change)] if order.size else []
        of_group = np.zeros(int(group.max()) + 1 if order.size else 0, dtype=np.int64)
        of_group[group] = block
        return group, of_group

    def member_fprs(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per member cell: its weight, and the weight of the non-members it is compared with
        (its stratum's, other units) that score higher, that tie with it, and in all."""
        w = np.asarray(weights, dtype=np.float64).ravel()
        negative = np.where(self.positive, 0.0, w)

        def above(group: np.ndarray, of_group: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            per_group = np.bincount(group, weights=negative, minlength=len(of_group))
            per_block = np.bincount(of_group, weights=per_group, minlength=blocks)
            block_start = np.cumsum(per_block) - per_block
            return np.cumsum(per_group) - per_group - block_start[of_group], per_group, per_block

        stratum_above, stratum_tied, stratum_total = above(self.stratum_group, self.stratum_of_group, self.strata)
        unit_above, unit_tied, unit_total = above(self.pair_block_group, self.pair_block_of_group, self.pair_blocks)
        members = self.positive
        sg, ug = self.stratum_group[members], self.pair_block_group[members]
        return (w[members], stratum_above[sg] - unit_above[ug], stratum_tied[sg] - unit_tied[ug],
                stratum_total[self.stratum[members]] - unit_total[self.own_unit[members]])

    def statistics(self, weights: np.ndarray, fprs: tuple[float, ...]) -> dict[str, float]:
        """AUC, best balanced accuracy and TPR at each FPR in ``fprs`` under ``weights``."""
        w, above, tied, total = self.member_fprs(weights)
        total_pos = w.sum()
        pairs = float(np.sum(w * total))
        if total_pos <= 0 or pairs <= 0:
            return {}
        auc = float(np.sum(w * (total - above - 0.5 * tied)) / pairs)
        fpr, tpr = self.curve_from(w, above, tied, total)
        out = {"auc": auc, "balanced_accuracy": float(0.5 * (1.0 + max(0.0, np.max(tpr - fpr))))}
        for target in fprs:
            allowed = fpr <= target + 1e-12
            out[f"tpr@{target}"] = float(np.max(tpr[allowed])) if allowed.any() else 0.0
        return out

    @staticmethod
    def curve_from(w: np.ndarray, above: np.ndarray, tied: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ROC points (FPR, TPR) from the members' FPRs: at each member's FPR, the share of
        members whose FPR is at most it; (0, 0) and (1, 1) added."""
        with np.errstate(invalid="ignore", divide="ignore"):
            own_fpr = np.where(total > 0, (above + tied) / np.where(total > 0, total, 1.0), 1.0)
        # members tied on an FPR are summed together (only each FPR's last member is kept), and the
        # weights are whole multiplicities whose sums are exact: their order within a tie is free,
        # so the far faster unstable sort gives the same curve
        order = np.argsort(own_fpr)
        fpr_sorted, weight_sorted = own_fpr[order], w[order]
        cumulative = np.cumsum(weight_sorted) / max(float(w.sum()), 1e-300)
        last = np.r_[fpr_sorted[1:] != fpr_sorted[:-1], True]  # the last member at each FPR value
        return np.r_[0.0, fpr_sorted[last], 1.0], np.r_[0.0, cumulative[last], 1.0]

    def compared_negatives(self) -> np.ndarray:
        """How many non-member scores each member is compared with (unit weights)."""
        return self.member_fprs(np.ones(self.size))[3]

    def curve(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ROC curve (FPR, TPR) the statistics are read from (unit weights by default)."""
        return self.curve_from(*self.member_fprs(np.ones(self.size) if weights is None else weights))


class LeaveOneRunOutAccuracy:
    """Accuracy of each target run at the threshold that is best on the *other* runs, as a
    weighted statistic of the design: under bootstrap weights [runs, units] the thresholds are
    re-fitted on the weighted other runs before the weighted accuracy is taken.

    The threshold is part of the estimate: holding each target's threshold fixed at its fit on the
    original data while the cells are resampled leaves out the threshold's own sampling variation,
    and the interval under-covers (measured under a null of 16 runs × 200 units with a run effect:
    81 % for a nominal 95 %). Re-fitting it in every resample puts that variation back.

    A threshold predicts "member" for scores at or above it; the best one maximises the weighted
    count of members above plus non-members below it (ties between thresholds go to the highest,
    and predicting no member at all wins a tie with every threshold).

    Over the distinct scores g (descending), the other runs' correct count at threshold g is, up
    to a constant, F(g) − F_r(g): F the cumulative member-minus-non-member weight of all runs,
    F_r that of run r alone. F_r changes only at run r's own scores, so between them the best
    threshold is F's maximum on that stretch: one ``maximum.reduceat`` over F gives every run's
    best, where a table of every run's counts at every score cost runs² × units. The weights are
    whole multiplicities: every sum is exact, and ties fall as they would in the table.
    """

    def __init__(self, scores: np.ndarray, truth: np.ndarray):
        scores = np.asarray(scores, dtype=np.float64)
        self.truth = np.asarray(truth).astype(bool)
        self.runs = scores.shape[0]
        # tie group of every cell in descending score order: group 0 holds the highest score
        distinct = np.unique(scores)
        self.groups = len(distinct)
        self.group = (self.groups - 1 - np.searchsorted(distinct, scores)).astype(np.int64)
        self.flat_group = self.group.ravel()
        # per run: its cells in group order, and the stretches of groups on which its own cumulative
        # weight is constant — they start at 0 and at each of its groups; ``value_at`` points into
        # [0, its cumulative weights at its cells] at each stretch (0: before its first group)
        self.order = np.argsort(self.group, axis=1, kind="stable")
        ordered = np.take_along_axis(self.group, self.order, axis=1)
        units = self.group.shape[1]
        runs, starts, value_at = [], [], []
        for r, row in enumerate(ordered):
            last = np.flatnonzero(np.r_[row[1:] != row[:-1], True])
            lead = [] if row.size and row[0] == 0 else [0]
            starts.append(np.r_[lead, row[last]].astype(np.int64) + r * self.groups)
            value_at.append(np.r_[[r * (units + 1)] * len(lead), r * (units + 1) + 1 + last].astype(np.int64))
            runs.append(np.full(len(starts[-1]), r))
        self.starts, self.value_at = np.concatenate(starts), np.concatenate(value_at)
        self.stretch_run = np.concatenate(runs)
        self.first_stretch = np.r_[0, np.cumsum([len(x) for x in starts])[:-1]].astype(np.int64)
        self.ends = np.r_[self.starts[1:], self.runs * self.groups]  # where each stretch stops

    def correct(self, weights: np.ndarray) -> np.ndarray:
        """correct[r, u]: does run r's prediction at its re-fitted threshold match the truth?"""
        w = np.asarray(weights, dtype=np.float64)
        signed = np.where(self.truth, w, -w)  # a member counts for a threshold above it, a non-member against
        everyone = np.cumsum(np.bincount(self.flat_group, weights=signed.ravel(), minlength=self.groups))
        own = np.cumsum(np.take_along_axis(signed, self.order, axis=1), axis=1)
        own = np.concatenate([np.zeros((self.runs, 1)), own], axis=1).ravel()  # F_r at each stretch, by value_at
        # every run's stretches in one pass over F repeated per run (the starts then rise throughout)
        tiled = np.tile(everyone, self.runs)
        gain = np.maximum.reduceat(tiled, self.starts) - own[self.value_at]
        best_gain = np.maximum.reduceat(gain, self.first_stretch)
        first = np.flatnonzero(gain == best_gain[self.stretch_run])
        runs_seen, at = np.unique(self.stretch_run[first], return_index=True)
        best = np.empty(self.runs, dtype=np.int64)
        best[runs_seen] = first[at]  # the first stretch of the best gain: ties go to the highest threshold
        cut = np.full(self.runs, -1, dtype=np.int64)
        for r in np.flatnonzero(best_gain > 0):  # else nobody is called a member
            s = best[r]
            cut[r] = self.starts[s] + int(np.argmax(tiled[self.starts[s]:self.ends[s]])) - r * self.groups
        return (self.group <= cut[:, None]) == self.truth

    def __call__(self, weights: np.ndarray) -> float:
        w = np.asarray(weights, dtype=np.float64)
        return float((w * self.correct(w)).sum() / w.sum())


def comparison_roc(scores: np.ndarray, truth: np.ndarray, run_groups: np.ndarray | None = None) -> WeightedRoc:
    """The ROC of scores [runs, units] whose member and non-member cells are compared only within
    a group of runs (``run_groups``; one group when None) and never within a unit (see
    :class:`WeightedRoc`): a group's targets share the references outside it, so neither sees
    the other's truth."""
    scores = np.asarray(scores)
    units = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    strata = None if run_groups is None else np.broadcast_to(np.asarray(run_groups)[:, None], scores.shape)
    return WeightedRoc(scores, truth, units, strata)


def _multiplicities(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)


def resample_weights(rng: np.random.Generator, runs: int, units: int, over: str,
                     run_groups: np.ndarray | None = None) -> np.ndarray:
    """Weights [runs, units] of one bootstrap resample of the runs (whole groups of runs when
    ``run_groups`` gives each run's group), the units, or the cells."""
    if over == "runs":
        if run_groups is not None:
            groups, index = np.unique(run_groups, return_inverse=True)
            return np.repeat(_multiplicities(rng, len(groups))[index][:, None], units, axis=1)
        return np.repeat(_multiplicities(rng, runs)[:, None], units, axis=1)
    if over == "units":
        return np.repeat(_multiplicities(rng, units)[None, :], runs, axis=0)
    return _multiplicities(rng, runs * units).reshape(runs, units)


def two_way_intervals(scores: np.ndarray, truth: np.ndarray, rng: np.random.Generator, confidence: float = 0.95,
                      fprs: tuple[float, ...] = (0.001, 0.01), replicates: int = REPLICATES,
                      extra: dict[str, Callable[[np.ndarray], float]] | None = None,
                      run_groups: np.ndarray | None = None) -> dict[str, IntervalEstimate]:
    """Point values and two-way intervals of the pooled ROC metrics of ``scores`` [runs, units]
    with membership ``truth`` [runs, units].

    Keys: ``auc``, ``balanced_accuracy``, ``tpr@<fpr>`` (NaN where the members are compared with
    fewer than 1/fpr non-member scores: not estimable), plus one per ``extra`` entry
    name → weighted statistic given the weights [runs, units] (e.g. the mean correctness of a
    fixed decision rule). Intervals are point ± t·SE (Satterthwaite degrees of freedom), clipped
    to [0, 1]. ``run_groups`` names runs whose scores share more than their run — e.g. the targets
    of one fold, scored by one attack model — and are resampled together.
    """
    scores = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(truth).astype(bool)
    runs, units = scores.shape
    roc = comparison_roc(scores, truth, run_groups)
    extra = extra or {}

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        stats = roc.statistics(weights, fprs)
        stats.update({name: statistic(weights) for name, statistic in extra.items()})
        return stats

    point = evaluate(np.ones_like(scores))
    clusters = {"runs": runs if run_groups is None else len(np.unique(run_groups)), "units": units, "cells": runs * units}
    variances = {}
    for over in ("runs", "units", "cells"):
        if clusters[over] < 2:
            variances[over] = {name: 0.0 for name in point}
            continue
        draws = [evaluate(resample_weights(rng, runs, units, over, run_groups)) for _ in range(replicates)]
        # × G/(G − 1): the bootstrap variance of a mean of G cluster totals is biased low by (G − 1)/G
        scale = clusters[over] / (clusters[over] - 1)
        variances[over] = {name: scale * float(np.nanvar([d.get(name, math.nan) for d in draws], ddof=1)) for name in point}
    # TPR at FPR x needs non-member scores to reach FPR x: with n of them per member the finest
    # FPR above 0 is 1/n, and below n = 1/x "TPR at FPR ≤ x" is the TPR at FPR 0 (whose null
    # expectation is 1/(n + 1), not x) — not estimable, reported as such
    resolution = float(np.median(roc.compared_negatives())) if point else 0.0
    unresolved = {f"tpr@{x}" for x in fprs if resolution * x < 1.0 - 1e-9}
    out = {}
    for name, value in point.items():
        if name in unresolved:
            out[name] = IntervalEstimate(math.nan)
            continue
        variance, dof = combined_variance(variances["runs"][name], variances["units"][name], variances["cells"][name],
                                          clusters["runs"], clusters["units"])
        half = critical_value(confidence, dof) * math.sqrt(variance) if math.isfinite(variance) else math.nan
        out[name] = (IntervalEstimate(value, max(0.0, value - half), min(1.0, value + half)) if math.isfinite(half)
                     else IntervalEstimate(value))
    return out


def combined_variance(v_runs: float, v_units: float, v_cells: float, runs: int, units: int) -> tuple[float, float]:
    """The two-way variance and its Satterthwaite degrees of freedom (module docstring).

    V = C + A + B with the cell component C = V_cells and the run and unit components
    A = max(V_runs − V_cells, 0), B = max(V_units − V_cells, 0) — CGM's V_runs + V_units − V_cells
    where both components are present, never below the cell variance. Each bootstrap variance
    rests on its number of clusters (R − 1, U − 1, RU − 1 degrees of freedom), and V is a linear
    combination of those that enter it, so ν = V² / Σ cₖ²·Vₖ²/νₖ (Satterthwaite 1946).
    """
    if not all(math.isfinite(v) for v in (v_runs, v_units, v_cells)):
        return math.nan, math.nan
    with_runs, with_units = v_runs > v_cells, v_units > v_cells
    variance = v_cells + max(v_runs - v_cells, 0.0) + max(v_units - v_cells, 0.0)
    if variance <= 0:
        return 0.0, math.inf
    terms = ((float(with_runs), v_runs, runs - 1), (float(with_units), v_units, units - 1),
             (1.0 - with_runs - with_units, v_cells, runs * units - 1))
    spread = sum(c * c * v * v / dof for c, v, dof in terms if dof > 0 and c != 0)
    return variance, (variance ** 2 / spread if spread > 0 else math.inf)


def critical_value(confidence: float, dof: float) -> float:
    """The two-sided critical value: Student's t with ``dof`` degrees of freedom (normal when infinite)."""
    if not math.isfinite(dof):
        return float(stats.norm.ppf(0.5 + confidence / 2.0))
    return float(stats.t.ppf(0.5 + confidence / 2.0, max(dof, 1.0)))
