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
* :class:`attacks.canaries.canary_audit.CanaryAudit` trains its own runs with canaries inserted and
  turns the canaries' statistics into empirical ε (one-run audits, Gaussian fit);
* :class:`RunAttack` attacks one trained run as the server holds it (:class:`TargetRun`):
  reconstruction from uploads, model inversion, attribute and property inference.

An :class:`AttackResult` holds the scores and ground truth — member = positive class, higher
score = more likely member — and the metrics computed from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from attacks.signals import view_inputs
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
from audit.core.errors import UserInputError
from audit.core.fdp_one_run import FdpOneRunAudit, fdp_audit_of_counts
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate, thin_curve
from audit.core.registry import Registry
from audit.core.seeding import numpy_rng
from audit.core.upload_conformance import UploadConformance
from audit.core.vocabulary import EpsilonKind, Relation, Unit
from defenses.federated.evaluation import logits_of
from defenses.privacy.claims import PrivacyClaim

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

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
    unit: str = Unit.RECORD  # what the runs include at random
    relation: str = Relation.ADD_REMOVE  # what one inclusion coin changes (audit.tasks): add/remove or replace-one
    inclusion: float = 0.5  # probability of each coin
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
        if unit == Unit.CLIENT and self.owners is None:
            raise UserInputError("attacks: unit 'client' needs runs that include whole clients; set membership.unit: client")
        return unit

    def truth(self, unit: str) -> np.ndarray:
        """bool [runs, units]: was the unit in the run."""
        return self.keep.astype(bool) if self.resolve_unit(unit) == Unit.RECORD else self.client_keep.astype(bool)

    def to_unit(self, record_scores: np.ndarray, unit: str) -> np.ndarray:
        """Record scores [targets, records] → unit scores: a client's is the mean of its records'."""
        if self.resolve_unit(unit) == Unit.RECORD:
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
    metrics: dict[str, IntervalEstimate] = field(default_factory=dict)
    roc: tuple[list[float], list[float]] = ((), ())
    notes: str = ""
    #: what the ε figures of this result bound: "lower_bound" (a confidence bound) or "estimate"
    epsilon_kind: dict[str, str] = field(default_factory=dict)
    #: images for the report: {"title", "png" (base64), "caption"} — e.g. reconstruction grids
    figures: list[dict[str, str]] = field(default_factory=list)
    #: "membership" (scores per unit, ROC metrics), "canary" or "run" (metrics of their own)
    kind: str = "membership"
    #: neighbouring relation of the design the scores come from (audit.tasks): one coin adds or
    #: removes a unit, or replaces one client of a pair by the other
    relation: str = Relation.ADD_REMOVE
    #: ε figure → the one-run counts behind it (their p-value against any claim; reports.soundness)
    evidence: dict[str, OneRunAudit] = field(default_factory=dict)
    #: what the scores were read from where an audit offers a choice ("final model", "all iterates", ...)
    observation: str | None = None
    #: the observer the result speaks of ("released", "server", "local") and the claim its verdicts
    #: compare with — that observer's figure (None: the experiment's headline claim)
    adversary: str | None = None
    claim: PrivacyClaim | None = None
    #: the test statistic each canary is scored by, named for the reader
    statistic: str | None = None
    #: the canaries' uploads tested against the claimed clip and noise (server view; None: not tested)
    conformance: UploadConformance | None = None

    @property
    def name(self) -> str:
        return f"{self.attack}-{self.variant}" if self.variant else self.attack


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


@dataclass(frozen=True)
class Setting:
    """One experiment of the audit as planning knows it before training: what an attack's
    parameters are checked against (:meth:`Attack.check`), so that a round, client, fold or class
    the experiment does not have is refused before any work, not found after training."""

    rounds: int  # training rounds of the experiment
    clients: int  # clients of every run
    runs: int  # membership runs
    dataset: Any  # audit.core.dataset_types.Dataset: name, num_classes, input_shape, attribute_values


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

    def check(self, field_path: str, setting: Setting) -> None:
        """Reject params that do not fit the experiment ``setting`` (one line naming the field
        under ``field_path``, e.g. ``attacks[2].params.round``); called in planning for every
        experiment the attack will run on."""

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
               records: np.ndarray | None = None, independent: tuple[np.ndarray, np.ndarray] | None = None,
               run_groups: np.ndarray | None = None) -> AttackResult:
        """Turn record scores [targets, records] into a result at the attack's unit; ``records``
        names the columns when only some records were attacked (whole clients, for the client unit).

        ``independent`` = (row indices, record scores of those rows) whose scores use no row of
        the set's membership (e.g. targets scored from reference runs outside the set): their
        inclusion coins feed the one-run ε bound. Default: the last target run alone, whose
        leave-one-out scores use only the other runs' membership. ``run_groups``: runs whose scores
        share an attack model (folds), resampled together by the intervals.
        """
        unit = experiment.resolve_unit(getattr(self.params, "unit", "auto"))
        rows, row_scores = independent if independent is not None else (np.array([experiment.runs - 1]), record_scores[-1:])
        scores, truth, covered = self._unit_scores(experiment, record_scores, unit, records)
        bound_scores, bound_truth, _ = self._unit_scores(experiment, row_scores, unit, records, rows)
        coins = design_coins(bound_scores[:, covered], bound_truth[:, covered], experiment.relation, unit, experiment.inclusion)
        if experiment.relation == Relation.REPLACE_ONE and not covered.all():
            coins = None  # pairs need both clients scored
        metrics, roc, evidence = membership_metrics(scores, truth, experiment.seed, delta=experiment.deltas.get(unit, 0.0),
                                                    coins=coins, run_groups=run_groups)
        note = f"one-run ε over {len(rows)} target run(s) scored without each other's membership{gdp_note(evidence)}"
        if coins is None:
            note = f"no one-run ε: it needs independent coins of probability ½ (inclusion {experiment.inclusion:g})"
        return AttackResult(self.label, variant, unit, scores, truth, metrics, roc, f"{notes}; {note}",
                            dict.fromkeys(ONE_RUN_FIGURES, EpsilonKind.LOWER_BOUND), relation=experiment.relation,
                            evidence=evidence)

    @staticmethod
    def _unit_scores(experiment: MembershipExperiment, record_scores: np.ndarray, unit: str, records: np.ndarray | None,
                     rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        truth = experiment.truth(unit)
        if rows is not None:
            truth = truth[rows]
        if records is None:
            scores = experiment.to_unit(record_scores, unit)
            return scores, truth, np.ones(scores.shape[1], dtype=bool)
        full = np.full((record_scores.shape[0], experiment.keep.shape[1]), np.nan)
        full[:, records] = record_scores
        scores = experiment.to_unit(full, unit)
        covered = ~np.isnan(scores).any(0)
        if rows is not None:
            return scores, truth, covered
        return scores[:, covered], truth[:, covered], covered


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
    training: Any  # defenses.federated.training_job.TrainingConfig
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
