"""Intervals for membership metrics that respect the design's dependence: the two-way
("pigeonhole") cluster bootstrap over runs and units.

A membership experiment scores every (run, unit) pair. The scores are not independent: a unit
is more or less vulnerable in every run (a unit effect), a run is more or less leaky for every
unit and its reference set is shared (a run effect), and leave-one-out scoring couples runs.
Intervals that treat the R·U scores as independent — DeLong for the AUC, Clopper–Pearson for a
TPR — are then too narrow or too wide, depending on the sign of the correlations (measured in
issue 17: 87 % and 100 % coverage of nominal 95 % intervals).

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
and V_cells single cells (≈ σ²_cell/(RU)); the interval is point ± z·√V. A resample is a weight
per cell (the multiplicity of its run, unit or cell in the resample), so every statistic is a
weighted ROC quantity computed from one sort.

Validated by simulation in ``benchmarks/coverage.py`` and ``tests/attacks/test_coverage.py``
(coverage of the null value and of a known effect).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.stats import norm

from audit.core.metrics import Estimate

#: bootstrap replicates per interval
REPLICATES = 300  # per one-way bootstrap: the SE of a standard deviation estimate is ≈ 4 %


class WeightedRoc:
    """ROC quantities of pooled scores under weights, after one sort (ties grouped)."""

    def __init__(self, scores: np.ndarray, truth: np.ndarray):
        flat = np.asarray(scores, dtype=np.float64).ravel()
        order = np.argsort(-flat, kind="stable")
        self.order = order
        self.positive = np.asarray(truth).astype(bool).ravel()[order]
        # group ids of tied scores, in descending score order
        self.group = np.r_[0, np.cumsum(np.diff(flat[order]) != 0)]
        self.groups = int(self.group[-1]) + 1

    def _cumulative(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        w = np.asarray(weights, dtype=np.float64).ravel()[self.order]
        pos = np.bincount(self.group, weights=np.where(self.positive, w, 0.0), minlength=self.groups)
        neg = np.bincount(self.group, weights=np.where(self.positive, 0.0, w), minlength=self.groups)
        return pos, neg, np.cumsum(pos), np.cumsum(neg)

    def statistics(self, weights: np.ndarray, fprs: tuple[float, ...]) -> dict[str, float]:
        """AUC, best balanced accuracy and TPR at each FPR in ``fprs`` under ``weights``."""
        pos, neg, tp, fp = self._cumulative(weights)
        total_pos, total_neg = tp[-1], fp[-1]
        if total_pos <= 0 or total_neg <= 0:
            return {}
        # a positive beats the negatives of lower groups (descending order: those after it) and ties half
        below = total_neg - fp
        auc = float(np.sum(pos * (below + 0.5 * neg)) / (total_pos * total_neg))
        tpr, fpr = tp / total_pos, fp / total_neg
        out = {"auc": auc, "balanced_accuracy": float(0.5 * (1.0 + max(0.0, np.max(tpr - fpr))))}
        for target in fprs:
            allowed = fpr <= target + 1e-12
            out[f"tpr@{target}"] = float(np.max(tpr[allowed])) if allowed.any() else 0.0
        return out


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
                      run_groups: np.ndarray | None = None) -> dict[str, Estimate]:
    """Point values and two-way intervals of the pooled ROC metrics of ``scores`` [runs, units]
    with membership ``truth`` [runs, units].

    Keys: ``auc``, ``balanced_accuracy``, ``tpr@<fpr>``, plus one per ``extra`` entry
    name → weighted statistic given the weights [runs, units] (e.g. the mean correctness of a
    fixed decision rule). Intervals are normal, point ± z·SE, clipped to [0, 1]. ``run_groups``
    names runs whose scores share more than their run — e.g. the targets of one fold, scored by
    one attack model — and are resampled together.
    """
    scores = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(truth).astype(bool)
    runs, units = scores.shape
    roc = WeightedRoc(scores, truth)
    extra = extra or {}

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        stats = roc.statistics(weights, fprs)
        stats.update({name: statistic(weights) for name, statistic in extra.items()})
        return stats

    point = evaluate(np.ones_like(scores))
    variances = {}
    for over in ("runs", "units", "cells"):
        clusters = runs if run_groups is None else len(np.unique(run_groups))
        if over == "runs" and clusters < 2:
            variances[over] = {name: 0.0 for name in point}
            continue
        draws = [evaluate(resample_weights(rng, runs, units, over, run_groups)) for _ in range(replicates)]
        variances[over] = {name: float(np.nanvar([d.get(name, math.nan) for d in draws], ddof=1)) for name in point}
    z = float(norm.ppf(0.5 + confidence / 2.0))
    out = {}
    for name, value in point.items():
        v_runs, v_units, v_cells = (variances[o][name] for o in ("runs", "units", "cells"))
        # Cameron–Gelbach–Miller: V = V_runs + V_units − V_cells; fall back to the larger one-way
        # variance when sampling noise makes the combination smaller than it (CGM 2011, §2.3)
        variance = max(v_runs + v_units - v_cells, v_runs, v_units)
        half = z * math.sqrt(variance) if math.isfinite(variance) else math.nan
        out[name] = Estimate(value, max(0.0, value - half), min(1.0, value + half)) if math.isfinite(half) else Estimate(value)
    return out
