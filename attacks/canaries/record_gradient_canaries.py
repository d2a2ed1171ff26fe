"""Record-level gradient canaries at scale, inside each client's local DP-SGD (UDP-FL's Gaussian,
Laplace and Staircase steps, or any defense whose local step clips per example and declares it).

**Design** (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4:
gradient canaries, every step observed; Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One
(1) Training Run": independent coins in one run; Mahloujifar, Melis, Chaudhuri 2024: the f-DP
analysis of the same counts). Each client of a run holds up to ⌊d/b⌋ canary records, each the
owner of b coordinates; a canary's per-example gradient is ±U/√b on them (U = ``amplitude``·C), it
is inserted by a fair coin and then joins each of its holder's local steps with the Poisson rate q
the claim accounts (:mod:`defenses.blocks.record_gradient_canaries`). The objective's own clip, noise and
scaling act on it; nothing here clips or noises. b = 1 (Dirac) puts all of a record's allowed
change on one coordinate: tight for ℓ1-clipped Laplace or Staircase noise and for the Gaussian.
b > 1 spreads it: against a Laplace step with ℓ2 clipping a record's privacy loss per step grows
like √b — what the paper's one-dimensional accounting misses.

**Statistic.** The reading of step t at coordinate i, in units of the clipped sum (g̃·B/C), signed
by the canary's sign, is the claimed mechanism's noise plus the real records' share, shifted by
the clipped canary's value a (1/√b under ℓ2, 1/b under ℓ1) in the steps it joined. Per step, the
log-likelihood ratio of the claimed mechanism, ℓ_t = Σ_i log f(z_{t,i} − a) − log f(z_{t,i}), and
over the steps its holder took the participation-hidden mixture Σ_t log(1 − q + q·e^{ℓ_t}) — the
Neyman–Pearson statistic against a mechanism exactly as claimed when the observer does not know in
which steps the canary took part. Any statistic gives a valid bound; this one has the most power
against the claim.

**Observer.** Every local step's noisy gradient (white box): the DP-SGD analysis the claim rests
on accounts the release of every step, so the claim covers this view and every coarser one
(the uploads, the released models).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS
from attacks.canaries.canary_audit import (
    CanaryAudit,
    CanaryContext,
    CanaryInjection,
    CanaryRun,
    canary_result,
    path_anomaly,
    preregistered_levels,
    without_measurement,
)
from attacks.canaries.mechanism_curve import mechanism_curve_result
from audit.core.audit_power import power_caveat
from audit.core.errors import UserInputError
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import Observation, Observer, Unit
from defenses.audit_hooks import AuditHooks
from defenses.blocks.mechanisms import GaussianNoise, LaplaceNoise
from defenses.blocks.record_gradient_canaries import ClaimedStep, GradientCanaryPlan
from defenses.privacy.claims import PrivacyClaim

if TYPE_CHECKING:
    import torch

STATISTIC = ("participation-hidden mixture Σ_t log(1 − q + q·e^{ℓ_t}) of the claimed mechanism's per-step log-likelihood "
             "ratio ℓ_t = Σ_i log f(z_{t,i} − a) − log f(z_{t,i}) of the signed readings z = s·g̃·B/C at the canary's "
             "coordinates")

#: the largest share of inserted canaries expected to join no step (invisible coins) the design allows
MAX_NEVER_JOINED = 0.01

#: readings a run may record (T steps × canaries × b): 100 MB of float32
MAX_READINGS = 25_000_000


@dataclass(frozen=True)
class RecordGradientCanaryParams:
    coins: int = field(default=100_000, metadata={"min": 4, "max": 10_000_000,
                                                  "help": "independent coins in all (runs of per_run canaries until this many)"})
    per_run: int = field(default=20_000, metadata={"min": 4, "max": 10_000_000,
                                                   "help": "canaries per run, spread evenly over its clients (at most "
                                                           "⌊d/width⌋ a client)"})
    width: int = field(default=1, metadata={"min": 1, "max": 4096,
                                            "help": "b: coordinates a canary's gradient spreads over (1: Dirac)"})
    amplitude: float = field(default=10.0, metadata={"min": 1.0, "max": 1e6,
                                                     "help": "U/C: a canary's raw gradient has norm U = amplitude × the clip"})
    against: str = field(default="", metadata={
        "max_length": 64, "help": "judge against one of the claim's labelled alternative figures instead of its headline "
                                  "(UDP-FL: paper_1d, the paper's one-dimensional accounting); empty: the headline"})


def mixture_scores(readings: np.ndarray, signs: np.ndarray, step: ClaimedStep, width: int) -> np.ndarray:
    """[K]: each canary's statistic (:data:`STATISTIC`) from its readings [T, K, b] (NaN where its
    holder took no such step) under the claimed step."""
    shift = step.shift(width)
    z = signs[None].astype(np.float64) * readings.astype(np.float64)
    taken = np.isfinite(z).all(axis=2)
    z = np.where(np.isfinite(z), z, 0.0)
    ratio = (step.mechanism.log_density(z - shift) - step.mechanism.log_density(z)).sum(axis=2)  # ℓ_t [T, K]
    q = step.rate
    # log(1 − q + q·e^ℓ) computed as logaddexp(log(1 − q), log q + ℓ): stable for large |ℓ|
    mixed = np.logaddexp(np.log1p(-q), np.log(q) + ratio) if q < 1.0 else ratio
    return np.where(taken, mixed, 0.0).sum(axis=0)


def judged_claim(claim: PrivacyClaim, against: str) -> PrivacyClaim:
    """The claim the released view is held to: the headline figure for the released models, or the
    alternative figure ``against`` names (same δ, relation and unit), labelled as such."""
    observer = claim.for_observer(Observer.RELEASED)
    if not against:
        return observer
    if against not in claim.alternatives:
        allowed = ", ".join(sorted(claim.alternatives)) or "none (this claim has no alternative figure)"
        raise UserInputError(f"attacks: record-gradient-canaries params.against: '{against}' is not a figure of the claim; "
                             f"allowed: {allowed}")
    epsilon = float(claim.alternatives[against])
    return replace(observer, epsilon=epsilon, accountant=f"{observer.accountant}; judged against the claim's alternative "
                   f"figure '{against}' (ε = {epsilon:.4g}), not its headline ε = {observer.epsilon:.4g}",
                   notes=f"alternative figure '{against}'; {observer.notes}")


@ATTACKS.register
class RecordGradientCanaries(CanaryAudit):
    name = "record-gradient-canaries"
    summary = ("record-level gradient canaries inside each client's local DP-SGD (10⁵ coins), clipped and noised by its own "
               "step and read in every step, scored with the claimed mechanism")
    reference = ("Nasr et al. 2023 (gradient canaries, every step); Steinke, Nasr, Jagielski 2023 and Mahloujifar, "
                 "Melis, Chaudhuri 2024 (one-run bounds)")
    Params = RecordGradientCanaryParams
    unit = Unit.RECORD

    def not_applicable(self, defense) -> str | None:
        if not defense.private:
            return f"'{defense.name}' makes no DP claim: gradient canaries audit a claim"
        if type(defense.audit_hooks()).claimed_step is AuditHooks.claimed_step:
            return (f"'{defense.name}' declares no local DP-SGD step its claim accounts (AuditHooks.claimed_step): record "
                    "gradient canaries need a per-example clip and noise inside local training; for noise added to "
                    "uploads use dirac-canaries")
        return None

    def needs_records(self) -> bool:
        return True

    def per_client(self, context: CanaryContext) -> int:
        return max(1, min(context.layout.dim // self.params.width, -(-self.params.per_run // context.clients)))

    def run_count(self, dim: int) -> int:
        return max(1, -(-self.params.coins // self.params.per_run))

    def refused(self, defense, training) -> str | None:
        step = defense.audit_hooks().claimed_step(training)
        if step is None:
            return (f"'{defense.name}' states no one local step its claim accounts for every client (heterogeneous ε: "
                    "each group meets its own noise); audit one group at a time")
        steps = step.steps_per_round * training.rounds
        readings = self.params.per_run * self.params.width * steps
        if readings > MAX_READINGS:
            return (f"{self.params.per_run} canaries × {self.params.width} coordinates × {steps} local steps = {readings} "
                    f"readings a run, above the {MAX_READINGS} allowed; lower params.per_run (more runs give the coins)")
        never = step.never_joins(training.rounds, training.client_rate)
        if never > MAX_NEVER_JOINED:
            return (f"an inserted canary would join none of its holder's steps with probability {never:.1%} (q = "
                    f"{step.rate:g}, {step.steps_per_round} steps a round, {training.rounds} rounds at participation "
                    f"{training.client_rate:g}): such coins are invisible and the design's power would be overstated; "
                    f"allowed: at most {MAX_NEVER_JOINED:.0%} — train more rounds or local epochs")
        return None

    def memory_bytes(self, dim: int) -> float:
        return 4.0 * MAX_READINGS  # one run's readings, read back at a time

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        width, each = self.params.width, self.per_client(context)
        step = context.defense.audit_hooks().claimed_step(context.training)
        assert step is not None
        rng = numpy_rng(context.seed, "canaries", self.label, run, "coordinates")
        coords = np.concatenate([rng.permutation(context.layout.dim)[:each * width].reshape(each, width)
                                 for _ in range(context.clients)])
        signs = rng.choice([-1.0, 1.0], size=coords.shape)
        holders = np.repeat(np.arange(context.clients), each)
        inserted = self.inclusion(context, run, len(holders))
        plan = GradientCanaryPlan(coords.astype(np.int64), signs, holders, inserted, float(self.params.amplitude),
                                  float(step.rate), derive_seed(context.seed, "canaries", self.label, run, "joins"))
        return CanaryInjection(inserted, gradient_plan=plan)

    def evaluate(self, context: CanaryContext, runs: list[CanaryRun], model: torch.nn.Module) -> list[AttackResult]:
        step = context.defense.audit_hooks().claimed_step(context.training)
        claim = runs[0].claim
        if step is None or claim is None:
            raise ValueError("the record gradient-canary audit needs the claimed step and each run's own claim")
        scores, inserted, joined, steps, never = [], [], 0, 0, []
        for run in runs:
            plan = run.injection.gradient_plan
            view = run.server_view or {}
            assert plan is not None and "gradient/readings" in view
            readings = view["gradient/readings"].numpy()
            scores.append(mixture_scores(readings, plan.signs, step, plan.width))
            inserted.append(plan.inserted)
            joined += int(view["gradient/joined"][0])
            steps = max(steps, readings.shape[0])
            taken = np.isfinite(readings).all(axis=2).sum(axis=0)  # the steps each canary's holder took (public)
            never.append((1.0 - step.rate) ** taken)
        score, truth = np.stack(scores), np.stack(inserted)
        observer_claim = judged_claim(claim, self.params.against)
        delta = observer_claim.delta if observer_claim.is_private and observer_claim.delta > 0 else context.delta
        levels = preregistered_levels(observer_claim, truth.size)
        notes = (f"{truth.size} record gradient canaries over {len(runs)} run(s), {int(truth.sum())} inserted, "
                 f"{truth.size // len(runs) // context.clients} per client, each on {self.params.width} coordinate(s) "
                 f"with raw norm {self.params.amplitude:g}·C before the step's own {step.clip_norm} clip; "
                 f"{joined} canary examples joined local steps (rate q = {step.rate:g}); read in each of up to {steps} "
                 f"local steps' noisy gradients (white box), scored against {step.mechanism!r}; an inserted canary "
                 f"joined no step with probability {float(np.mean(np.concatenate(never))):.2%} given the steps taken")
        if levels:
            notes += ("; abstention levels fixed in advance by the design's power against the claim: "
                      + ", ".join(f"{name} {fractions[0]:.1%} of the coins" for name, fractions in levels.items()))
        unexercised = path_anomaly(runs, "gradient_path")
        if unexercised is not None:
            score = np.zeros(truth.shape)
            notes += f"; no statistic: the canaries' path was not exercised ({unexercised}), and no other path is audited"
        # the verdicts' power model is the optimal attack on a μ-GDP mechanism at 2ε: a DP-SGD step
        # subsampled at q and composed over many steps has a trade-off curve far from Gaussian (at a
        # claimed ε = 4, q = 0.05 and 100 steps, Gaussian noise halved has ε ≈ 15 at δ = 1e-5, yet
        # these canaries certify only ≈ 3.4), so no power is stated and no bound is called consistent
        # — all but full batches of Gaussian noise, which are μ-GDP
        unmodelled = power_caveat(step.rate, type(step.mechanism).__name__.removesuffix("Noise"),
                                  f" and composed over {steps} steps")
        result = canary_result(self.label, self.unit, score, truth, delta, context.seed, notes, levels=levels,
                               unmodelled_power=unmodelled)
        if unexercised is not None:
            without_measurement(result, notes)
        result.variant = "every-step"
        result.observation, result.adversary, result.claim = Observation.EVERY_STEP, Observer.RELEASED, observer_claim
        result.statistic = STATISTIC
        curve = self._mechanism_curve(result, step, context.training.rounds)
        return [result] if curve is None else [result, curve]

    def _mechanism_curve(self, base: AttackResult, step: ClaimedStep, rounds: int) -> AttackResult | None:
        """The same counts against the accounted mechanism's own composed curve — its noise at
        sensitivity C, Poisson rate q, every step of every round (dp-accounting's PLD,
        :mod:`audit.core.mechanism_tradeoff`) — instead of the (ε, δ) curve: a result of its own,
        held to that mechanism's exact ε. Only where an honest step leaks no more per canary than
        that one-dimensional mechanism: Gaussian noise; Laplace noise under ℓ1 clipping or on one
        coordinate — or when the figure judged is the paper's one-dimensional accounting itself."""
        kind = "gaussian" if isinstance(step.mechanism, GaussianNoise) else \
            "laplace" if isinstance(step.mechanism, LaplaceNoise) else None
        if kind is None:
            return None
        if kind == "laplace" and step.clip_norm != "l1" and self.params.width > 1 and self.params.against != "paper_1d":
            return None  # a canary spread over b coordinates of an ℓ2 clip leaks √b times the 1-D Laplace per step
        return mechanism_curve_result(base, kind, step.mechanism.parameter, step.rate, step.steps_per_round * rounds,
                                      f"{step.mechanism!r} at sensitivity C", "every-step-mechanism-curve")
