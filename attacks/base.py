"""What attacks consume and produce.

A :class:`MembershipExperiment` is N trained runs of one defense configuration over a shared
pool of candidate units (records here): run r trained on the units with ``keep[r] == True``.
Each run serves in turn as the target, the others as reference runs (leave-one-out, as in
LiRA's own evaluation), so an attack scores every (target run, unit) pair.

An :class:`AttackResult` holds the scores and ground truth of those pairs — member = positive
class, higher score = more likely member — and the metrics computed from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from audit.registry import Registry
from reports.metrics import (
    Estimate,
    auc,
    balanced_accuracy,
    held_out_epsilon_lower_bound,
    roc_points_for_plot,
    tpr_at_fpr,
)


@dataclass
class MembershipExperiment:
    key: str
    keep: np.ndarray  # bool [runs, units]
    features: torch.Tensor  # the candidate pool
    labels: torch.Tensor
    kind: str  # "image" or "tabular"
    model: nn.Module  # architecture template (parameters come from the runs)
    load_params: Callable[[int], dict[str, torch.Tensor]]
    seed: int
    device: str = "cpu"
    unit: str = "record"

    @property
    def runs(self) -> int:
        return int(self.keep.shape[0])


@dataclass
class AttackResult:
    attack: str
    variant: str
    unit: str
    scores: np.ndarray  # [targets, units]
    truth: np.ndarray  # bool [targets, units]
    metrics: dict[str, Estimate] = field(default_factory=dict)
    roc: tuple[list[float], list[float]] = ((), ())
    notes: str = ""

    @property
    def name(self) -> str:
        return f"{self.attack}-{self.variant}" if self.variant else self.attack


#: metric name → (description, FPR target or None)
MEMBERSHIP_METRICS = {
    "auc": "ROC AUC (DeLong 95 % interval)",
    "tpr_at_fpr_0.1%": "largest TPR with FPR ≤ 0.1 % (Clopper–Pearson 95 %)",
    "tpr_at_fpr_1%": "largest TPR with FPR ≤ 1 % (Clopper–Pearson 95 %)",
    "balanced_accuracy": "best balanced accuracy over thresholds",
    "epsilon_lower_bound": "ε lower bound (one-sided Clopper–Pearson 95 %, threshold chosen on the other half of the targets)",
}


def membership_metrics(scores: np.ndarray, truth: np.ndarray, confidence: float = 0.95) -> tuple[dict[str, Estimate], tuple[list[float], list[float]]]:
    """Metrics over all (target, unit) pairs pooled, and a ROC curve for plots.

    The ε lower bound picks its threshold on the first half of the target runs and counts on
    the second half, so the bound is not fitted to the data it is computed from.
    """
    flat_scores, flat_truth = scores.ravel(), truth.ravel().astype(bool)
    metrics = {
        "auc": auc(flat_scores, flat_truth, confidence),
        "tpr_at_fpr_0.1%": tpr_at_fpr(flat_scores, flat_truth, 0.001, confidence),
        "tpr_at_fpr_1%": tpr_at_fpr(flat_scores, flat_truth, 0.01, confidence),
        "balanced_accuracy": Estimate(balanced_accuracy(flat_scores, flat_truth)),
    }
    half = scores.shape[0] // 2
    calibration, test = slice(0, half), slice(half, None)
    if half >= 1 and truth[calibration].any() and (~truth[calibration]).any() and truth[test].any() and (~truth[test]).any():
        metrics["epsilon_lower_bound"] = held_out_epsilon_lower_bound(
            scores[calibration].ravel(), truth[calibration].ravel(), scores[test].ravel(), truth[test].ravel(), confidence)
    else:
        metrics["epsilon_lower_bound"] = Estimate(math.nan)
    return metrics, roc_points_for_plot(flat_scores, flat_truth)


class MembershipAttack:
    """A membership-inference attack over a :class:`MembershipExperiment`."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    Params: ClassVar[type]
    #: the fewest membership runs the attack can work with (each target needs references)
    min_runs: ClassVar[int] = 2

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        raise NotImplementedError


ATTACKS: Registry[type[MembershipAttack]] = Registry("attack")
