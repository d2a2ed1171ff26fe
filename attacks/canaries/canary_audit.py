"""Canary audits: train a run with canaries inserted at random, then measure ε from how well the
canaries' statistics tell the inserted ones from the held-out ones.

A :class:`CanaryAudit` says what to insert (:meth:`CanaryAudit.injection`: canary records
added to clients' data, or canary clients whose update is a fixed direction) and how to read
a canary's statistic off the trained run (:meth:`CanaryAudit.statistics`). Each canary is
inserted independently with probability ½; the non-inserted ones are the held-out canaries.
:func:`canary_result` turns (statistics, inserted) into the ε figures:

* the one-run audit's ε lower bound (Steinke, Nasr, Jagielski 2023), confidence 95 %: valid
  although the canaries of one run share its training randomness, because each canary's coin is
  independent and the count is dominated by a binomial whatever the dependence of the scores
  (a Clopper–Pearson bound on the same counts would assume independent trials, so there is none);
* the ε lower bound of the same counts through the f-DP analysis of the (ε, δ) trade-off curve
  (Mahloujifar, Melis, Chaudhuri 2024; :mod:`audit.core.fdp_one_run`), confidence 95 %, valid on
  the same grounds (it too conditions on the other canaries' coins only);
* the Gaussian-fit ε estimate with its bootstrap interval (Andrew et al. 2024).

Canaries from several runs are pooled: each canary sits in one run, so the product of the
runs is as private towards it as one run is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import Attack
from attacks.membership_metrics import ONE_RUN_FIGURES, gdp_note, membership_metrics
from audit.core.audit_power import power_caveat, preregistered_fraction
from audit.core.empirical_epsilon import gaussian_fit_epsilon, rescaled
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import AttackKind, EpsilonKind, Unit

if TYPE_CHECKING:
    import torch
    from scipy import stats

    from defenses.base import Defense
    from defenses.blocks.flat import ParamLayout
    from defenses.blocks.record_gradient_canaries import GradientCanaryPlan
    from defenses.federated.training_job import TrainingConfig
    from defenses.privacy.claims import PrivacyClaim
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    stats = lazy_module("scipy.stats")


@dataclass
class CanaryContext:
    """What an audit needs to know about the experiment it audits."""

    key: str
    defense: Defense
    training: TrainingConfig
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    layout: ParamLayout
    seed: int
    delta: float
    clients: int  # clients of a run


@dataclass
class CanaryInjection:
    """The canaries of one audit run; only the ``inserted`` ones take part in training."""

    inserted: np.ndarray  # bool [m]
    records_x: torch.Tensor | None = None  # canary records [m, ...]
    records_y: torch.Tensor | None = None
    record_clients: np.ndarray | None = None  # client (position in the run's client list) of each canary record
    directions: torch.Tensor | None = None  # canary clients' unit update directions [m, d]
    dirac_coords: np.ndarray | None = None  # Dirac canary clients: the coordinate of each [m]
    dirac_values: np.ndarray | None = None  # and its raw update there, sign included [m] (before clipping)
    gradient_plan: GradientCanaryPlan | None = None  # record gradient canaries inside local DP-SGD


@dataclass
class CanaryRun:
    """A trained audit run, as the audit reads it back."""

    injection: CanaryInjection
    final: torch.Tensor  # final global model, flat
    initial: torch.Tensor  # initial global model, flat
    params: dict[str, torch.Tensor]
    iterates: torch.Tensor | None = None  # global model after each round [rounds, d] (when the audit needs them)
    server_view: dict[str, torch.Tensor] | None = None  # what the run recorded of the server's view
    metrics: list[dict] | None = None  # the run's per-round metrics
    claim: PrivacyClaim | None = None  # the run's own claim


def path_anomaly(runs: list[CanaryRun], key: str) -> str | None:
    """Why the canaries' path through the defense's own code was not exercised in some run — the
    first round whose metrics carry ``key`` (``dirac_path``: :mod:`defenses.federated.dirac_passage`;
    ``gradient_path``: :mod:`defenses.blocks.record_gradient_canaries`) — None where it was in every one."""
    for i, run in enumerate(runs):
        for row in run.metrics or []:
            if row.get(key):
                return f"run {i + 1}, round {row.get('round')}: {row[key]}"
    return None


class CanaryAudit(Attack):
    kind = AttackKind.CANARY
    unit: ClassVar[str] = Unit.RECORD  # what one canary stands for
    #: under a replace-one claim, a held-out canary client takes part with its update mirrored
    #: (−u for +u): the two are a replace-one pair at the claim's full sensitivity 2S
    mirrored_under_replace_one: ClassVar[bool] = False

    def not_applicable(self, defense: Defense) -> str | None:
        """Why this audit cannot run on ``defense`` (None when it can)."""
        return None

    def canary_rounds(self) -> tuple[int, int] | None:
        """The 1-based rounds (first, last) canary clients join (None: every round)."""
        return None

    def needs_iterates(self) -> bool:
        """Whether the audit reads every round's global model of its runs."""
        return False

    def run_count(self, dim: int) -> int:
        """Audit runs for a model of ``dim`` parameters (``params.runs`` where the audit has it)."""
        return int(getattr(self.params, "runs", 1))

    def memory_bytes(self, dim: int) -> float:
        """Memory the audit holds beyond its runs' recorded models, for a model of ``dim``
        parameters (checked against the machine's before anything trains)."""
        return 0.0

    def refused(self, defense: Defense, training: TrainingConfig) -> str | None:
        """Why the audit cannot run with this defense and training (None: it can), beyond
        :meth:`not_applicable` — known only once the defense and its training are set."""
        return None

    def needs_records(self) -> bool:
        """Whether the audit reads its runs' server view, metrics and own claim."""
        return False

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        raise NotImplementedError

    def statistics(self, context: CanaryContext, run: CanaryRun, model: torch.nn.Module) -> np.ndarray:
        """One number per canary, higher = more likely inserted."""
        raise NotImplementedError

    def inclusion(self, context: CanaryContext, run: int, count: int) -> np.ndarray:
        return numpy_rng(context.seed, "canaries", self.label, run, "inserted").random(count) < 0.5

    def evaluate(self, context: CanaryContext, runs: list[CanaryRun], model: torch.nn.Module) -> list[AttackResult]:
        """The audit's results: one per observation set it reads (e.g. final model, all iterates)."""
        statistics = np.stack([self.statistics(context, run, model) for run in runs])
        inserted = np.stack([run.injection.inserted for run in runs])
        return [canary_result(self.label, self.unit, statistics, inserted, context.delta, context.seed, self.describe(runs),
                              unmodelled_power=sampling_caveat(context))]

    def describe(self, runs: list[CanaryRun]) -> str:
        m = sum(len(r.injection.inserted) for r in runs)
        inside = sum(int(r.injection.inserted.sum()) for r in runs)
        return f"{m} canaries over {len(runs)} run(s), {inside} inserted"


def gaussian_shape_note(held_out: np.ndarray) -> str:
    """The Anderson–Darling test of normality (parameters estimated; Stephens 1974) on the held-out
    canaries' statistics: the Gaussian fit's ε is an estimate *under a Gaussian shape*, and this
    says whether the held-out side has it. Canaries of one run share its training randomness, so
    the test's levels are approximate; it is a diagnostic beside an estimate, never a verdict."""
    (held_out,) = rescaled(np.asarray(held_out, dtype=np.float64))  # the test is scale-free; scores of 1e308 overflow
    if len(held_out) < 8 or float(np.std(held_out)) == 0.0:
        return ""
    try:  # SciPy ≥ 1.17 interpolates the p-value in Stephens' tables when asked
        test = stats.anderson(held_out, dist="norm", method="interpolate")
        rejected = float(test.pvalue) <= 0.05
    except TypeError:  # older SciPy: the 5 % critical value
        test = stats.anderson(held_out, dist="norm")
        rejected = test.statistic > test.critical_values[list(test.significance_level).index(5.0)]
    shape = "rejected" if rejected else "not rejected"
    return (f"; Gaussian shape of the {len(held_out)} held-out statistics (Anderson–Darling A² = {test.statistic:.3g}): "
            f"normality {shape} at 5 %")


def preregistered_levels(claim: PrivacyClaim | None, coins: int) -> dict[str, tuple[float, ...]]:
    """Per ε figure, the one abstention level the design's power analysis picks against the
    observer's claim (:func:`audit.core.audit_power.preregistered_fraction`: coins, claim and test
    only, nothing observed); empty where the claim gives no finite (ε, δ > 0) to plan against."""
    if claim is None or not claim.is_private or not claim.delta > 0:
        return {}
    out = {}
    for name, method in (("epsilon_one_run", "steinke"), ("epsilon_one_run_fdp", "fdp")):
        fraction = preregistered_fraction(coins, float(claim.epsilon), float(claim.delta), method)
        if fraction is not None:
            out[name] = (fraction,)
    return out


def without_measurement(result: AttackResult, notes: str) -> AttackResult:
    """``result`` of a canary audit whose statistic could not be read, emptied of every figure — no
    ε, and no ROC of the unread scores it was built from — with ``notes`` saying why."""
    result.metrics = {k: IntervalEstimate(math.nan) for k in result.metrics if not k.startswith("epsilon")}
    result.epsilon_kind, result.evidence, result.notes = {}, {}, notes
    return result


def sampling_caveat(context: CanaryContext) -> str:
    """Why no power is stated for canaries in the released models of clients sampled at a rate
    below 1 (:func:`audit.core.audit_power.power_caveat`); "" under full participation."""
    return power_caveat(context.training.sampling_rate(context.clients), composed=" in every round")


def canary_result(attack: str, unit: str, statistics: np.ndarray, inserted: np.ndarray, delta: float, seed: int,
                  notes: str, confidence: float = 0.95, levels: dict[str, tuple[float, ...]] | None = None,
                  exercised: np.ndarray | None = None, unmodelled_power: str = "") -> AttackResult:
    """Metrics and the ε figures of a canary audit; statistics/inserted are [runs, canaries];
    ``levels``: abstention levels fixed in advance per ε figure (:func:`attacks.membership_metrics.one_run_bounds`);
    ``exercised`` [runs, canaries]: the canaries the mechanism met (public, whatever the coins) — the
    others are no coins of the ε figures; ``unmodelled_power``: why the verdicts' power model does
    not describe these coins (:func:`audit.core.audit_power.power_caveat`) — their bounds
    are then never called consistent."""
    statistics = np.asarray(statistics, dtype=np.float64)
    if not np.isfinite(statistics).all():
        statistics = np.nan_to_num(statistics, nan=0.0, posinf=1e300, neginf=-1e300)
    truth = inserted.astype(bool)
    live = np.ones(truth.size, dtype=bool) if exercised is None else np.asarray(exercised, dtype=bool).ravel()
    flat, coin_truth = statistics.ravel(), truth.ravel()
    metrics: dict[str, IntervalEstimate] = {}
    roc: tuple[list[float], list[float]] = ([], [])
    evidence = {}
    inside, outside = coin_truth & live, ~coin_truth & live
    if inside.any() and outside.any():
        metrics, roc, evidence = membership_metrics(statistics, truth, seed, confidence, delta,
                                                    coins=(flat[live], coin_truth[live]), accuracy=False, levels=levels)
        if "epsilon_one_run" in evidence:
            audit = evidence["epsilon_one_run"]
            notes += f"; one-run audit: {audit.correct} of {audit.guesses} guesses right{gdp_note(evidence)}"
        if inside.sum() >= 2 and outside.sum() >= 2 and delta > 0:
            metrics["epsilon_gaussian_fit"] = gaussian_fit_epsilon(flat[inside], flat[outside], delta, confidence)
            notes += gaussian_shape_note(flat[outside])
        elif delta <= 0:
            notes += "; no Gaussian-fit estimate at δ = 0: a Gaussian pair has no finite ε there"
    else:
        # every canary inserted, or none (a few canaries, by chance): no ROC and no ε figure; the
        # ROC figures are still reported, as unknown, like every canary audit's
        metrics = {name: IntervalEstimate(math.nan) for name in ("auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%")}
        notes += "; every canary was inserted, or none was: no ROC and no ε figure"
    kinds = {**dict.fromkeys(ONE_RUN_FIGURES, EpsilonKind.LOWER_BOUND), "epsilon_gaussian_fit": EpsilonKind.ESTIMATE}
    if unmodelled_power:
        evidence = {k: replace(v, unmodelled_power=unmodelled_power) for k, v in evidence.items()}
    return AttackResult(attack, "", unit, statistics, truth, metrics, roc, notes,
                        {k: v for k, v in kinds.items() if k in metrics}, kind=AttackKind.CANARY, evidence=evidence)
