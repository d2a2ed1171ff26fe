"""The metrics of membership scores, with their intervals, and the one-run ε lower bounds.

:func:`membership_metrics` turns the scores of (target run, unit) pairs into AUC, TPR at low FPR
and accuracies with two-way bootstrap intervals, and — over the design's independent inclusion
coins (:func:`design_coins`) — into ε lower bounds by the one-run count (Steinke, Nasr, Jagielski
2023) and its f-DP analysis (Mahloujifar, Melis, Chaudhuri 2024).
"""

from __future__ import annotations

import math

import numpy as np

from audit.core.cluster_bootstrap import (
    REPLICATES,
    LeaveOneRunOutAccuracy,
    comparison_roc,
    two_way_intervals,
)
from audit.core.empirical_epsilon import (
    GUESS_FRACTIONS,
    OneRunAudit,
    canary_arrays,
    guess_counts,
    one_run_audit,
)
from audit.core.fdp_one_run import FdpOneRunAudit, fdp_audit_of_counts
from audit.core.metrics import IntervalEstimate, thin_curve
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Relation, Unit

#: metric name → description
MEMBERSHIP_METRICS = {
    "auc": "ROC AUC over (member, non-member) score pairs of different units — pairs of one unit in two runs see each "
           "other's truth through the references — and, for attacks trained in folds, of one fold (95 % interval: "
           "two-way bootstrap over runs and units, Cameron–Gelbach–Miller, Satterthwaite t)",
    "tpr_at_fpr_0.1%": "largest TPR with FPR ≤ 0.1 %, each member's FPR among the non-members it is compared with "
                       "(two-way bootstrap 95 %); null (not estimable) when a member is compared with fewer than "
                       "1,000 non-member scores: below that it would be the TPR at FPR 0",
    "tpr_at_fpr_1%": "largest TPR with FPR ≤ 1 %, as above (two-way bootstrap 95 %); null below 100 non-member scores",
    "balanced_accuracy": "best balanced accuracy over thresholds (optimistic: the threshold sees the truth; "
                         "two-way bootstrap 95 %)",
    "accuracy": "accuracy at the threshold that is best on the other runs (the target's truth unseen; two-way bootstrap "
                "95 %, the thresholds re-fitted in every resample)",
    "epsilon_one_run": "ε lower bound of the one-run count (Steinke, Nasr, Jagielski 2023; 95 %) over independent coins: "
                       "canaries, or the (run, unit) pairs of target runs scored without each other's membership",
    "epsilon_one_run_fdp": "ε lower bound of the same count through the f-DP analysis of the (ε, δ) trade-off curve "
                           "(Mahloujifar, Melis, Chaudhuri 2024; 95 %)",
    "epsilon_gaussian_fit": "ε estimate from Gaussians fitted to inserted and held-out canaries (Andrew et al. 2024; exact "
                            "noncentral-t 95 % interval of the shift; only at δ > 0: a Gaussian pair has no finite ε at δ = 0)",
}

#: the ε lower bounds of a one-run count (:func:`membership_metrics`)
ONE_RUN_FIGURES = ("epsilon_one_run", "epsilon_one_run_fdp")

#: the TPR operating points reported, as (metric name, FPR)
OPERATING_POINTS = (("tpr_at_fpr_0.1%", 0.001), ("tpr_at_fpr_1%", 0.01))


def membership_metrics(scores: np.ndarray, truth: np.ndarray, seed: int, confidence: float = 0.95,
                       delta: float = 0.0, coins: tuple[np.ndarray, np.ndarray] | None = None, bootstrap: int = REPLICATES,
                       run_groups: np.ndarray | None = None, accuracy: bool = True,
                       levels: dict[str, tuple[float, ...]] | None = None
                       ) -> tuple[dict[str, IntervalEstimate], tuple[list[float], list[float]], dict[str, OneRunAudit]]:
    """Metrics over the (target, unit) scores, their intervals, a ROC curve for plots, and the
    one-run ε bounds with their counts (ε figure → evidence; empty without ``coins``).

    The ROC compares member and non-member scores of different units, and only within a group of
    ``run_groups`` (:func:`audit.core.cluster_bootstrap.comparison_roc`): leave-one-out scores of
    one unit see each other's truth. Intervals come from
    :func:`audit.core.cluster_bootstrap.two_way_intervals`: scores of one unit across runs and of
    one run across units are correlated, so no interval treats the pairs as independent. ``accuracy``
    False leaves out the leave-one-run-out accuracy (canary audits report none). ``coins`` = (scores, inserted) of independent
    inclusion coins whose guesses may use any output but none of those coins' truth (target runs scored from other
    runs' membership only, or canaries); the one-run count on them gives two valid ε lower bounds
    at ``delta`` (the δ the claim allows for this unit, :func:`reports.soundness.measurement_delta`):
    Steinke et al.'s (``epsilon_one_run``) and the f-DP analysis of the same counts
    (``epsilon_one_run_fdp``). Without ``coins`` there is no ε figure.
    """
    truth = truth.astype(bool)
    rng = numpy_rng(seed, "metrics", "two-way-bootstrap")
    extra = {}
    if accuracy and scores.shape[0] >= 2:
        extra["accuracy"] = LeaveOneRunOutAccuracy(scores, truth)  # thresholds re-fitted in every resample
    intervals = two_way_intervals(scores, truth, rng, confidence, tuple(f for _, f in OPERATING_POINTS), bootstrap, extra,
                                  run_groups)
    metrics = {"auc": intervals["auc"]}
    for name, fpr in OPERATING_POINTS:
        metrics[name] = intervals[f"tpr@{fpr}"]
    metrics["balanced_accuracy"] = intervals["balanced_accuracy"]
    if "accuracy" in intervals:
        metrics["accuracy"] = intervals["accuracy"]
    evidence: dict[str, OneRunAudit] = {}
    if coins is not None and len(coins[0]) >= 2:
        evidence = one_run_bounds(coins[0], coins[1], delta, 1.0 - confidence, levels)
        metrics.update((name, audit.as_estimate()) for name, audit in evidence.items())
    return metrics, thin_curve(*comparison_roc(scores, truth, run_groups).curve()), evidence


def one_run_bounds(scores: np.ndarray, inserted: np.ndarray, delta: float = 0.0, alpha: float = 0.05,
                   levels: dict[str, tuple[float, ...]] | None = None) -> dict[str, OneRunAudit]:
    """The one-run ε lower bounds of independent coins' scores, by figure name (:data:`ONE_RUN_FIGURES`):
    Steinke et al.'s count and the f-DP analysis of the guesses at the same abstention levels, so
    the two figures differ only in how the counts are analysed. ``levels`` (figure name → guess
    fractions) replaces the default levels of a figure by ones its design fixed in advance
    (:func:`audit.core.audit_power.preregistered_fraction`)."""
    levels = levels or {}
    steinke = one_run_audit(scores, inserted, delta, alpha, levels.get("epsilon_one_run", GUESS_FRACTIONS))
    fractions = levels.get("epsilon_one_run_fdp", GUESS_FRACTIONS)
    tried = steinke.tried if fractions == steinke.fractions else guess_counts(*canary_arrays(scores, inserted), fractions)
    return {"epsilon_one_run": steinke,
            "epsilon_one_run_fdp": fdp_audit_of_counts(steinke.canaries, tried, delta, alpha, fractions)}


def gdp_note(evidence: dict[str, OneRunAudit]) -> str:
    """The f-DP analysis's μ-GDP figure, for the notes: the paper's "empirical privacy", which
    holds only if the mechanism's trade-off curve is Gaussian, so it is no (ε, δ) bound."""
    audit = evidence.get("epsilon_one_run_fdp")
    if not isinstance(audit, FdpOneRunAudit) or audit.mu <= 0:
        return ""
    epsilon = audit.epsilon_gdp
    at_delta = (f"ε = {epsilon:.3g} at δ = {audit.delta:.2g} if the trade-off curve is Gaussian" if math.isfinite(epsilon)
                else "a Gaussian curve has no finite ε at δ = 0")
    return f"; the counts reject μ-GDP for μ < {audit.mu:.3g} ({at_delta})"


def design_coins(scores: np.ndarray, truth: np.ndarray, relation: str, unit: str,
                 inclusion: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The independent coins of the design and a score per coin, for the one-run count.

    Add/remove: every (run, unit) is its own fair coin. Replace-one (client pairs (2i, 2i+1),
    :mod:`audit.tasks`): one coin per pair says which of the two trained; its score is the
    difference of the two clients' scores. Steinke et al.'s count needs coins of probability ½.
    """
    if inclusion != 0.5 or scores.size == 0:
        return None
    if relation == Relation.REPLACE_ONE and unit == Unit.CLIENT:
        if scores.shape[1] % 2:
            return None
        return (scores[:, 0::2] - scores[:, 1::2]).ravel(), truth[:, 0::2].ravel()
    return scores.ravel(), truth.ravel()
