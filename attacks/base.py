"""What attacks consume and produce.

A :class:`MembershipExperiment` is N trained runs of one defense configuration over a shared
pool of candidate units — records, or whole clients when the runs include clients at random
(``membership.unit: client``): run r trained on the units with ``truth(unit)[r] == True``.
Each run serves in turn as the target, the others as reference runs (leave-one-out, as in
LiRA's own evaluation), so an attack scores every (target run, unit) pair. Client-level
scores are the mean of the client's record scores.

Three kinds of attack share one registry:

* :class:`MembershipAttack` scores the units of a membership experiment (LiRA, Shokri,
  threshold attacks, canary queries);
* :class:`attacks.canary_audit.CanaryAudit` trains its own runs with canaries inserted and
  turns the canaries' statistics into empirical ε (one-run audit, Gaussian fit);
* :class:`RunAttack` attacks one trained run as the server holds it (:class:`TargetRun`):
  reconstruction from uploads, model inversion, attribute and property inference.

An :class:`AttackResult` holds the scores and ground truth — member = positive class, higher
score = more likely member — and the metrics computed from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from attacks.signals import view_inputs
from audit.core.errors import UserInputError
from audit.core.metrics import (
    Estimate,
    auc,
    balanced_accuracy,
    held_out_epsilon_lower_bound,
    reference_threshold_accuracy,
    roc_points_for_plot,
    tpr_at_fpr,
)
from audit.core.registry import Registry
from defenses.evaluation import logits_of

UNITS = ("auto", "record", "client")


@dataclass(frozen=True)
class TargetParams:
    """What every membership attack can be pointed at: the unit and the rounds it scores."""

    unit: Literal["auto", "record", "client"] = field(default="auto", metadata={
        "help": "score records or whole clients (auto: the membership unit of the runs)"})
    rounds: Literal["final", "all"] | list[int] = field(default="final", metadata={
        "min": 1, "help": "global models scored: the final one, every round's, or a list of rounds (the server holds them all)"})


@dataclass
class MembershipExperiment:
    key: str
    keep: np.ndarray  # bool [runs, records]
    features: torch.Tensor  # the candidate pool
    labels: torch.Tensor
    kind: str  # "image" or "tabular"
    model: nn.Module  # architecture template (parameters come from the runs)
    load_params: Callable[[int], dict[str, torch.Tensor]]  # final global model of run r
    seed: int
    device: str = "cpu"
    unit: str = "record"  # what the runs include at random
    owners: np.ndarray | None = None  # candidate client of each record (client unit)
    client_keep: np.ndarray | None = None  # bool [runs, candidate clients] (client unit)
    load_round: Callable[[int, int], dict[str, torch.Tensor]] | None = None  # run r's global model after round t
    rounds: int = 0  # training rounds of the runs
    #: unit → δ at which ε lower bounds are computed (what the claim allows per unit; 0 when unset)
    deltas: dict[str, float] = field(default_factory=dict)
    _logits: dict = field(default_factory=dict, repr=False)

    @property
    def runs(self) -> int:
        return int(self.keep.shape[0])

    # ---------------------------------------------------------------- units

    def resolve_unit(self, unit: str) -> str:
        if unit == "auto":
            return self.unit
        if unit == "client" and self.owners is None:
            raise UserInputError("attacks: unit 'client' needs runs that include whole clients; set membership.unit: client")
        return unit

    def truth(self, unit: str) -> np.ndarray:
        """bool [runs, units]: was the unit in the run."""
        return self.keep.astype(bool) if self.resolve_unit(unit) == "record" else self.client_keep.astype(bool)

    def to_unit(self, record_scores: np.ndarray, unit: str) -> np.ndarray:
        """Record scores [targets, records] → unit scores: a client's is the mean of its records'."""
        if self.resolve_unit(unit) == "record":
            return record_scores
        clients = self.client_keep.shape[1]
        counts = np.bincount(self.owners, minlength=clients).astype(np.float64)
        sums = np.zeros((record_scores.shape[0], clients))
        for row, scores in enumerate(record_scores):
            sums[row] = np.bincount(self.owners, weights=scores, minlength=clients)
        return sums / np.maximum(counts, 1.0)

    # ---------------------------------------------------------------- what the server holds

    def round_list(self, rounds: str | list[int]) -> list[int | None]:
        """Rounds to score (None = the final model)."""
        if rounds == "final":
            return [None]
        if rounds == "all":
            return list(range(1, self.rounds + 1))
        return [int(r) if int(r) != self.rounds else None for r in rounds]

    def params_of(self, run: int, round_number: int | None) -> dict[str, torch.Tensor]:
        if round_number is None:
            return self.load_params(run)
        if self.load_round is None:
            raise UserInputError("attacks: scoring earlier rounds needs the runs' global models; set record.global_rounds")
        return self.load_round(run, round_number)

    def logits(self, round_number: int | None, views: tuple[str, ...] = ("identity",)) -> np.ndarray:
        """Logits of every run's global model on the pool: float32 [runs, views, records, classes].

        Cached per (round, views), so LiRA, Shokri and the threshold attacks query each model once.
        """
        key = (round_number, views)
        if key not in self._logits:
            x = self.features.to(self.device)
            out = []
            for r in range(self.runs):
                params = self.params_of(r, round_number)
                out.append(torch.stack([logits_of(self.model, params, view) for view in view_inputs(x, views)]).cpu().numpy())
            self._logits[key] = np.stack(out).astype(np.float32)
        return self._logits[key]


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
    #: what the ε figures of this result bound: "lower_bound" (a confidence bound) or "estimate"
    epsilon_kind: dict[str, str] = field(default_factory=dict)
    #: images for the report: {"title", "png" (base64), "caption"} — e.g. reconstruction grids
    figures: list[dict[str, str]] = field(default_factory=list)
    #: "membership" (scores per unit, ROC metrics), "canary" or "run" (metrics of their own)
    kind: str = "membership"

    @property
    def name(self) -> str:
        return f"{self.attack}-{self.variant}" if self.variant else self.attack


#: metric name → description
MEMBERSHIP_METRICS = {
    "auc": "ROC AUC (DeLong 95 % interval)",
    "tpr_at_fpr_0.1%": "largest TPR with FPR ≤ 0.1 % (Clopper–Pearson 95 %)",
    "tpr_at_fpr_1%": "largest TPR with FPR ≤ 1 % (Clopper–Pearson 95 %)",
    "balanced_accuracy": "best balanced accuracy over thresholds (optimistic: the threshold sees the truth)",
    "accuracy": "accuracy at the threshold that is best on the other runs (the target's truth unseen; Clopper–Pearson 95 %)",
    "epsilon_lower_bound": "ε lower bound (one-sided Clopper–Pearson 95 %, threshold chosen on the other half of the targets)",
    "epsilon_one_run": "ε lower bound of the one-run audit (Steinke, Nasr, Jagielski 2023; 95 %)",
    "epsilon_gaussian_fit": "ε estimate from Gaussians fitted to inserted and held-out canaries (Andrew et al. 2024; bootstrap 95 %)",
}


def membership_metrics(scores: np.ndarray, truth: np.ndarray, confidence: float = 0.95,
                       delta: float = 0.0) -> tuple[dict[str, Estimate], tuple[list[float], list[float]]]:
    """Metrics over all (target, unit) pairs pooled, and a ROC curve for plots.

    The ε lower bound picks its threshold on the first half of the target runs and counts on
    the second half, so the bound is not fitted to the data it is computed from; it is computed
    at ``delta`` (the δ the claim allows for this unit, :func:`reports.soundness.measurement_delta`).
    """
    flat_scores, flat_truth = scores.ravel(), truth.ravel().astype(bool)
    metrics = {
        "auc": auc(flat_scores, flat_truth, confidence),
        "tpr_at_fpr_0.1%": tpr_at_fpr(flat_scores, flat_truth, 0.001, confidence),
        "tpr_at_fpr_1%": tpr_at_fpr(flat_scores, flat_truth, 0.01, confidence),
        "balanced_accuracy": Estimate(balanced_accuracy(flat_scores, flat_truth)),
    }
    if scores.shape[0] >= 2:
        metrics["accuracy"] = reference_threshold_accuracy(scores, truth, confidence)
    half = scores.shape[0] // 2
    calibration, test = slice(0, half), slice(half, None)
    if half >= 1 and truth[calibration].any() and (~truth[calibration]).any() and truth[test].any() and (~truth[test]).any():
        metrics["epsilon_lower_bound"] = held_out_epsilon_lower_bound(
            scores[calibration].ravel(), truth[calibration].ravel(), scores[test].ravel(), truth[test].ravel(), confidence, delta)
    else:
        metrics["epsilon_lower_bound"] = Estimate(math.nan)
    return metrics, roc_points_for_plot(flat_scores, flat_truth)


class Attack:
    """Anything listed under ``attacks:``; see :class:`MembershipAttack` and ``CanaryAudit``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    Params: ClassVar[type]
    #: the fewest membership runs the attack can work with (each target needs references)
    min_runs: ClassVar[int] = 2
    #: "membership" attacks score the membership runs; "canary" audits train runs of their own
    kind: ClassVar[str] = "membership"

    def __init__(self, params: Any = None, label: str | None = None):
        self.params = params if params is not None else self.Params()
        self.label = label or self.name

    def rounds_needed(self, total_rounds: int) -> str | tuple[int, ...]:
        """Global models (besides the final one) the runs must store for this attack."""
        rounds = getattr(self.params, "rounds", "final")
        if rounds in ("final", "all"):
            return "none" if rounds == "final" else "all"
        return tuple(int(r) for r in rounds)

    def uploads_needed(self, total_rounds: int) -> str | tuple[int, ...]:
        """Rounds whose server view (uploads, aggregate) the runs must store."""
        return "none"


class MembershipAttack(Attack):
    """A membership-inference attack over a :class:`MembershipExperiment`."""

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        raise NotImplementedError

    def result(self, variant: str, experiment: MembershipExperiment, record_scores: np.ndarray, notes: str,
               records: np.ndarray | None = None) -> AttackResult:
        """Turn record scores [targets, records] into a result at the attack's unit; ``records``
        names the columns when only some records were attacked (whole clients, for the client unit)."""
        unit = experiment.resolve_unit(getattr(self.params, "unit", "auto"))
        truth = experiment.truth(unit)
        if records is None:
            scores = experiment.to_unit(record_scores, unit)
        else:
            full = np.full(experiment.keep.shape, np.nan)
            full[:, records] = record_scores
            scores = experiment.to_unit(full, unit)
            covered = ~np.isnan(scores).any(0)
            scores, truth = scores[:, covered], truth[:, covered]
        metrics, roc = membership_metrics(scores, truth, delta=experiment.deltas.get(unit, 0.0))
        return AttackResult(self.label, variant, unit, scores, truth, metrics, roc, notes, {"epsilon_lower_bound": "lower_bound"})


def rounds_note(experiment: MembershipExperiment, rounds: str | list[int]) -> str:
    chosen = experiment.round_list(rounds)
    if chosen == [None]:
        return "final global model"
    return f"global models of {len(chosen)} rounds" if rounds == "all" else \
        "global models of rounds " + ", ".join(str(r or experiment.rounds) for r in chosen)


ATTACKS: Registry[type[Attack]] = Registry("attack")


@dataclass
class SideRun:
    """The audited defense trained once more on another dataset (e.g. a tabular one with a
    sensitive attribute, when the audit's own data have none), by the same pipeline."""

    dataset: Any  # audit.core.datasets.Dataset
    pool: Any  # audit.core.datasets.Split: the candidate records
    members: np.ndarray  # pool indices the run trained on
    model: nn.Module
    params: dict[str, torch.Tensor]
    test_accuracy: float | None = None


@dataclass
class TargetRun:
    """One trained run as an honest-but-curious server holds it, plus the data an evaluation
    needs to score an attack (the clients' records, the test split, attribute codes)."""

    key: str
    defense: Any  # defenses.base.Defense
    training: Any  # defenses.training_job.TrainingConfig
    model: nn.Module  # architecture template
    params: dict[str, torch.Tensor]  # final global model
    initial: dict[str, torch.Tensor]  # global model before round 1
    load_global: Callable[[int], dict[str, torch.Tensor] | None]  # global model after round t (None: not stored)
    server_view: dict[str, torch.Tensor]  # recorded uploads/aggregates, "round_0001/client_00003" → flat tensor
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    clients: list[np.ndarray]  # pool indices per client
    test_x: torch.Tensor
    test_y: torch.Tensor
    dataset: Any  # audit.core.datasets.Dataset (attributes, value names, attribute columns)
    kind: str  # "image" or "tabular"
    seed: int
    device: str = "cpu"
    #: members of run 0 (pool indices) — the records it trained on
    members: np.ndarray | None = None
    #: sensitive attribute → code per pool record (datasets that have them)
    pool_attributes: dict[str, np.ndarray] = field(default_factory=dict)
    #: train the same defense configuration on another dataset: (dataset name, data root) → SideRun
    train_side: Callable[[str, str | None], SideRun] | None = None

    def global_before(self, round_number: int) -> dict[str, torch.Tensor] | None:
        """The model the clients of ``round_number`` started from."""
        return self.initial if round_number == 1 else self.load_global(round_number - 1)


class RunAttack(Attack):
    """An attack on one trained run (:class:`TargetRun`); see the module docstring."""

    kind = "run"
    min_runs = 1

    def not_applicable(self, defense: Any, dataset: Any) -> str | None:
        """Why this attack cannot run on ``defense`` with ``dataset`` (None when it can)."""
        return None

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        raise NotImplementedError


def run_result(label: str, variant: str, unit: str, metrics, notes: str, figures=None) -> AttackResult:
    """The result of a run attack (attribute, model and property inference, gradient inversion):
    metrics of its own, no per-unit scores."""
    return AttackResult(label, variant, unit, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), dict(metrics), ((), ()),
                        notes, figures=list(figures or []), kind="run")


def auxiliary_records(members: np.ndarray, size: int) -> np.ndarray:
    """Pool records the run did not train on: the attacker's auxiliary data."""
    return np.setdiff1d(np.arange(size), members)
