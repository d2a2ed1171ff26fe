"""Attack metrics: ROC, AUC with a confidence interval, TPR at a fixed FPR, empirical ε lower bounds.

Convention everywhere: member = positive class (label 1), higher score = more likely member.

Operating points are read conservatively, without interpolation: **TPR at FPR x** is the
largest TPR over the thresholds whose empirical FPR does not exceed x (so with n negatives,
TPR@0.1% needs n ≥ 1000 to be more than TPR at FPR = 0). Its interval is the two-sided
Clopper–Pearson interval of the true-positive count at that threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import stats
    from sklearn import metrics as sklearn_metrics
else:  # imported with the first statistic: `list` and `config` name attacks without them
    stats = lazy_module("scipy.stats")
    sklearn_metrics = lazy_module("sklearn.metrics")


@dataclass(frozen=True)
class IntervalEstimate:
    """A value with a confidence interval (NaN bounds when none applies)."""

    value: float
    low: float = math.nan
    high: float = math.nan

    def as_tuple(self) -> tuple[float, float, float]:
        return self.value, self.low, self.high


def _as_arrays(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError("scores and labels differ in length")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if labels.all() or not labels.any():
        raise ValueError("need both members (label 1) and non-members (label 0)")
    return scores, labels


def roc(scores, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) at every distinct threshold (scikit-learn, no point dropped)."""
    scores, labels = _as_arrays(scores, labels)
    return sklearn_metrics.roc_curve(labels, scores, drop_intermediate=False)


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion (Clopper & Pearson 1934):
    the α/2 and 1 − α/2 quantiles of Beta(k, n − k + 1) and Beta(k + 1, n − k), exact to ≈ 1e-15.

    scipy's ``binomtest(k, n).proportion_ci(confidence, method="exact")`` is the same interval,
    found by root finding on the binomial tail: it agrees to the root finder's tolerance (≈ 1e-5
    relative at n = 10⁵), not to the last bit, so it would change the digits of results.json;
    ``test_clopper_pearson_agrees_with_scipys_binomial_test`` checks the agreement."""
    if trials == 0:
        return 0.0, 1.0
    alpha = 1.0 - confidence
    low = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high


def auc(scores, labels, confidence: float = 0.95) -> IntervalEstimate:
    """ROC AUC with DeLong's variance (DeLong, DeLong, Clarke-Pearson 1988), via midranks.

    The interval treats scores as independent; scores pooled over leave-one-out targets are
    not quite independent, so read it as approximate.
    """
    scores, labels = _as_arrays(scores, labels)
    positives, negatives = scores[labels], scores[~labels]
    m, n = len(positives), len(negatives)
    combined = stats.rankdata(np.concatenate([positives, negatives]))
    v10 = (combined[:m] - stats.rankdata(positives)) / n
    v01 = 1.0 - (combined[m:] - stats.rankdata(negatives)) / m
    value = float(v10.mean())
    variance = (v10.var(ddof=1) / m if m > 1 else 0.0) + (v01.var(ddof=1) / n if n > 1 else 0.0)
    half = float(stats.norm.ppf(0.5 + confidence / 2) * math.sqrt(max(variance, 0.0)))
    return IntervalEstimate(value, max(0.0, value - half), min(1.0, value + half))


def auc_convex_hull(scores, labels) -> float:
    """Area under the upper convex hull of the ROC curve (the best attack that randomises between
    thresholds; jax_privacy's ``attack_auroc``). in=[0,4,6,7], out=[1,2,3,5] gives 13/16, while
    the plain AUC is 11/16."""
    fpr, tpr, _ = roc(scores, labels)
    hull: list[tuple[float, float]] = []
    for point in sorted(zip(fpr.tolist(), tpr.tolist())):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point when it lies on or below the chord to the new point
            if (x2 - x1) * (point[1] - y1) - (y2 - y1) * (point[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(point)
    xs, ys = np.array([p[0] for p in hull]), np.array([p[1] for p in hull])
    return float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2.0))


def tpr_at_fpr(scores, labels, target_fpr: float, confidence: float = 0.95) -> IntervalEstimate:
    """Largest TPR with empirical FPR ≤ ``target_fpr``, with a Clopper–Pearson interval."""
    scores, labels = _as_arrays(scores, labels)
    fpr, tpr, _ = roc(scores, labels)
    allowed = fpr <= target_fpr + 1e-12
    best = int(np.argmax(np.where(allowed, tpr, -1.0)))
    positives = int(labels.sum())
    true_positives = int(round(tpr[best] * positives))
    low, high = clopper_pearson(true_positives, positives, confidence)
    return IntervalEstimate(float(tpr[best]), low, high)


def balanced_accuracy(scores, labels) -> float:
    """Best balanced accuracy (TPR + TNR)/2 over thresholds, i.e. ½ + ½·max(TPR − FPR)."""
    fpr, tpr, _ = roc(scores, labels)
    return float(0.5 * (1.0 + np.max(tpr - fpr)))


def epsilon_lower_bound(tp: int, fn: int, fp: int, tn: int, confidence: float = 0.95, delta: float = 0.0) -> float:
    """One-sided Clopper–Pearson lower bound on ε from an attack's confusion counts.

    An (ε, δ)-DP mechanism forces TPR ≤ e^ε·FPR + δ and TNR ≤ e^ε·FNR + δ for every test
    (Kairouz et al. 2015). With confidence ``confidence``, the true TPR is at least the
    one-sided lower Clopper–Pearson bound and FPR at most the upper one (the error level is
    split equally between them), so

        ε ≥ max( log((TPR_lo − δ)/FPR_hi), log((TNR_lo − δ)/FNR_hi), 0 ).

    (tp, fn, fp, tn) = (500, 0, 0, 500) at 99 % gives 4.54, as tf-privacy's test checks.
    """
    if min(tp, fn, fp, tn) < 0:
        raise ValueError("counts must be non-negative")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    alpha = (1.0 - confidence) / 2.0  # one-sided level of each of the two bounds

    def lower(successes: int, trials: int) -> float:
        if trials == 0 or successes == 0:
            return 0.0
        return float(stats.beta.ppf(alpha, successes, trials - successes + 1))

    def upper(successes: int, trials: int) -> float:
        if trials == 0 or successes == trials:
            return 1.0
        return float(stats.beta.ppf(1.0 - alpha, successes + 1, trials - successes))

    positives, negatives = tp + fn, fp + tn
    bounds = [0.0]
    for hits_lo, misses_hi in (
        (lower(tp, positives), upper(fp, negatives)),  # TPR vs FPR
        (lower(tn, negatives), upper(fn, positives)),  # TNR vs FNR
    ):
        if hits_lo - delta > 0 and misses_hi > 0:
            bounds.append(math.log((hits_lo - delta) / misses_hi))
    return max(bounds)


def confusion_at(scores, labels, threshold: float) -> tuple[int, int, int, int]:
    """(tp, fn, fp, tn) when predicting "member" for score ≥ threshold."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    predicted = scores >= threshold
    return (int((predicted & labels).sum()), int((~predicted & labels).sum()),
            int((predicted & ~labels).sum()), int((~predicted & ~labels).sum()))


def best_threshold_for_epsilon(scores, labels, confidence: float = 0.95, delta: float = 0.0) -> float:
    """The threshold maximising the Clopper–Pearson ε lower bound on (scores, labels)."""
    scores, labels = _as_arrays(scores, labels)
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    # Candidate cuts at the last index of each run of equal scores: predict member for the top k.
    distinct = np.r_[np.flatnonzero(np.diff(sorted_scores) != 0), len(scores) - 1]
    tps = np.cumsum(sorted_labels)[distinct]
    fps = np.cumsum(~sorted_labels)[distinct]
    positives, negatives = int(labels.sum()), int((~labels).sum())
    alpha = (1.0 - confidence) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        tpr_lo = np.where(tps > 0, stats.beta.ppf(alpha, tps, positives - tps + 1), 0.0)
        fpr_hi = np.where(fps < negatives, stats.beta.ppf(1 - alpha, fps + 1, negatives - fps), 1.0)
        tnr_lo = np.where(negatives - fps > 0, stats.beta.ppf(alpha, negatives - fps, fps + 1), 0.0)
        fnr_hi = np.where(positives - tps < positives, stats.beta.ppf(1 - alpha, positives - tps + 1, tps), 1.0)
        eps = np.maximum(np.log(np.clip(tpr_lo - delta, 1e-300, None) / fpr_hi),
                         np.log(np.clip(tnr_lo - delta, 1e-300, None) / fnr_hi))
    best = int(np.nanargmax(eps))
    return float(sorted_scores[distinct[best]])


def held_out_epsilon_lower_bound(calibration_scores, calibration_labels, test_scores, test_labels,
                                 confidence: float = 0.95, delta: float = 0.0) -> IntervalEstimate:
    """ε lower bound with the threshold chosen on calibration data and counted on separate test data.

    Choosing the threshold on the same data the counts come from would bias the bound upward.
    """
    threshold = best_threshold_for_epsilon(calibration_scores, calibration_labels, confidence, delta)
    bound = epsilon_lower_bound(*confusion_at(test_scores, test_labels, threshold), confidence=confidence, delta=delta)
    return IntervalEstimate(bound, bound, math.inf)


def thin_curve(fpr, tpr, max_points: int = 400) -> tuple[list[float], list[float]]:
    """A log-spaced subsample of a ROC curve (FPR ascending), small enough to store in results.json."""
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    if len(fpr) <= max_points:
        return [float(v) for v in fpr], [float(v) for v in tpr]
    grid = np.unique(np.r_[0.0, np.logspace(-5, 0, max_points - 1)])
    index = np.searchsorted(fpr, grid, side="right") - 1
    index = np.unique(np.clip(index, 0, len(fpr) - 1))
    return [float(v) for v in fpr[index]], [float(v) for v in tpr[index]]


def mean_estimate(values, confidence: float = 0.95) -> IntervalEstimate:
    """Mean of per-item values with a Student-t interval (NaN bounds below two finite values)."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(finite) == 0:
        return IntervalEstimate(math.nan)
    mean = float(finite.mean())
    if len(finite) < 2:
        return IntervalEstimate(mean)
    half = float(stats.t.ppf(0.5 + confidence / 2, len(finite) - 1) * finite.std(ddof=1) / math.sqrt(len(finite)))
    return IntervalEstimate(mean, mean - half, mean + half)
