"""Dirac canary clients at scale: one canary client per model coordinate, over as many runs as
10⁵ independent coins need, each read by every observer the claim names.

**Design** (Andrew et al. 2024, "One-shot Empirical Privacy Estimation for Federated Learning",
canary clients; Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning",
Dirac canaries read at every iterate; Steinke, Nasr, Jagielski 2023, one-run counting): run r
gets one canary client per coordinate j of a random permutation — at most d canaries — with a
random sign s and an independent fair coin. An inserted canary's *raw* update is s·U·e_j with
U = ``amplitude``·S (S the defense's clip). Canaries join rounds like clients (Poisson at the
clients' rate). A held-out canary follows the claim's relation: under zero-out it takes part and
uploads zero, under replace-one it takes part with its raw update mirrored (−s·U·e_j: the pair
(+s, −s) is one client replaced by another at the claim's full sensitivity 2S), under add/remove
it is absent.

**One code path** (:mod:`defenses.federated.dirac_passage`). What a canary contributes is read off
the defense's own ``privatize_together`` and ``aggregate`` run on dense probe rows among the real
clients' rows — a user's override included, each canary on a row of its own unless the code is
known to treat its class alike — so a clip that is skipped shows as a contribution of U instead of
S, and a mask that drops a canary (rand-k, LUS) as none. A canary whose coordinate a round does not
release (a public trainable subset) takes no part in it; one that took part in no round is no coin.
Canaries add that signal and no noise of their own: the noise on their coordinates is the noise
the defense's code gives the real uploads, in a round of exactly the real participants (|P_t|
counts no canary). Lower noise in the dense code is lower noise in
every canary statistic. Where the canaries' path cannot be isolated (the defense's output for a
one-coordinate input spreads, or a canary's input changes other uploads), the run says why and
the audit reads no statistic: it never falls back to code of its own.

**Why canaries do not interfere.** Canaries on distinct coordinates add to distinct coordinates of
the sum, each clipped on its own. The real clients train on a model the other canaries moved, but
that cannot bias the bound: the one-run analyses (Steinke et al. 2023; Mahloujifar et al. 2024)
hold for any mechanism DP with respect to each canary, conditioning on the other coins.
Interference only costs power (Keinan, Shenfeld, Ligett 2025).

**Observers** — each result is compared with *that observer's* figure of the run's claim
(:meth:`defenses.privacy.claims.PrivacyClaim.for_observer`):

* ``final model`` (released; participation unknown): s·(w_T − w_0)_j;
* ``all iterates`` (released — every round's global model, as each client receives it;
  participation unknown): the mixture log-likelihood ratio over rounds of the standardised
  readings z_t = s·(w_t − w_{t−1})_j·D_t / (η_g·σ·S), D_t the defense's divisor and σ the noise
  multiplier the claim accounts — the statistic optimal against the claimed subsampled Gaussian
  (:mod:`audit.core.gaussian_canary_statistics`);
* ``each upload`` (the server without secure aggregation; participation known): the weighted
  standardised sum of the canary's own uploads at j over the rounds it joined, each with the
  per-upload noise S·σ/√|P_t|; where the server sees only the aggregate, the standardised sum
  of the iterate readings over the rounds the canary joined (``aggregate, participation known``).
  Where it sees each upload, the uploads are also tested against the claimed mechanism itself
  (:mod:`audit.core.upload_conformance`): held-out canaries' uploads for the noise the server's
  figure accounts, inserted ones for the clip, every round — a bug that touches a few canaries
  (one client a round left unclipped) cannot move a one-run count over 10⁵ coins, but one upload
  of ±U where ±S belongs is beyond any Gaussian noise. Gaussian by construction — the aggregate's
  where the real clients' share of every step is known — the server's scores are also read by the
  gated parametric test of the claimed μ (an estimate-based verdict,
  :mod:`attacks.canaries.server_parametric`).

The server's figure is the run's own: canaries count in no |P_t|.

What canaries cannot see by construction: a canary contributes the same value in every round it
joins, so noise reused across rounds only adds to its readings' spread (the conformance audit's
fresh-noise test sees it, :mod:`attacks.mechanism_audits.conformance_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, Setting
from attacks.canaries.canary_audit import (
    CanaryAudit,
    CanaryContext,
    CanaryInjection,
    CanaryRun,
    canary_result,
    path_anomaly,
    preregistered_levels,
    sampling_caveat,
    without_measurement,
)
from attacks.canaries.dirac_views import conformance_block, drift_known, exercised_canaries, real_drift
from attacks.canaries.mechanism_curve import mechanism_curve_result
from attacks.canaries.server_parametric import claimed_shifts, server_parametric
from audit.core.errors import UserInputError
from audit.core.gaussian_canary_statistics import mixture_log_likelihood_ratio, standardised_sum
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng
from audit.core.upload_conformance import upload_conformance
from audit.core.vocabulary import Observation, Observer, Relation, Unit
from defenses.privacy.accounting import CONTINUOUS_GAUSSIAN
from defenses.privacy.claims import AdversaryClaim, PrivacyClaim

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: whose view the audit reads: the released final model, every released iterate, or the server
OBSERVERS = (Observation.FINAL_MODEL.value, Observation.ALL_ITERATES.value, Observer.SERVER.value)

STATISTICS = {
    Observation.FINAL_MODEL: "signed final change s·(w_T − w_0)_j",
    Observation.ALL_ITERATES: "mixture log-likelihood ratio of the standardised per-round readings (subsampled Gaussian)",
    Observation.EACH_UPLOAD: "standardised sum of the canary's own uploads over the rounds it joined",
    Observation.AGGREGATE: "standardised sum of the per-round readings over the rounds the canary joined",
}


@dataclass(frozen=True)
class DiracCanaryParams:
    coins: int = field(default=100_000, metadata={
        "min": 4, "max": 10_000_000,
        "help": "independent coins in all: runs of up to one canary per model coordinate until this many"})
    per_run: int = field(default=0, metadata={"min": 0, "help": "canary clients per run (0: one per model coordinate)"})
    amplitude: float = field(default=1000.0, metadata={
        "min": 1.0, "max": 1e6, "help": "U/S: a canary's raw update is ±U on its coordinate, U = amplitude × the clip"})
    observers: list[Literal["final model", "all iterates", "server"]] = field(
        default_factory=lambda: list(OBSERVERS), metadata={"min_length": 1, "help": "whose view to read (a result each)"})


def per_canary_multiplier(released: AdversaryClaim | None) -> float | None:
    """The released figure's noise multiplier per change one canary makes (its clip S): the
    claim's own, or twice it where the claim counts a change of 2S (replace-one: σ/2 per 2S is σ
    per S).

    Under a replace-one claim (fixed-size sampling, NbAFL) a canary's pair is mirrored: inserted it
    uploads +u, held out −u (|u| = S), each through the defense's own clipping and noise, and it
    joins each round independently at the clients' rate m/N. Round by round its mechanism is
    (1−q)·N(0, σ²S²) + q·N(±u, σ²S²) — the pair dp-accounting's REPLACE_ONE relation accounts for
    a Poisson-sampled Gaussian of sensitivity 2S. The claim accounts sampling m of N without
    replacement for replace-one neighbours, sensitivity 2S; both privacy profiles are the sampling
    rate times the base mechanism's (Balle, Barthe, Gaboardi 2018, "Privacy Amplification by
    Subsampling: Tight Analyses via Couplings and Divergences", Thms 8 and 10), and dominance is
    kept under composition: an honest implementation's canaries cannot exceed the claim, and a
    lower bound above it refutes the claim (checked against the accountants over a grid in the
    test suite). Zero-out pairs would audit a mechanism of half the sensitivity, whose true ε is
    about half the mirrored pairs' (0.9 against 1.8 at a claimed 4 with m = 10 of 20, 10 rounds)."""
    if released is None or not released.noise_multiplier:
        return None
    per_change = 2.0 if released.relation == Relation.REPLACE_ONE else 1.0
    return float(released.noise_multiplier) * per_change


@ATTACKS.register
class DiracCanaries(CanaryAudit):
    name = "dirac-canaries"
    summary = ("Dirac canary clients at scale (one per coordinate, 10⁵ coins), read by the released models, every "
               "iterate and the server")
    reference = ("Nasr et al. 2023 (Dirac canaries, every iterate); Andrew et al. 2024 (canary clients); "
                 "Steinke, Nasr, Jagielski 2023 and Mahloujifar, Melis, Chaudhuri 2024 (one-run bounds)")
    Params = DiracCanaryParams
    unit = Unit.CLIENT
    # under a replace-one claim (fixed-size sampling, NbAFL) held-out canaries are mirrored: see per_canary_multiplier
    mirrored_under_replace_one = True

    def not_applicable(self, defense) -> str | None:
        # a defense that reads a client's data to privatise (LUS) takes them: a probe row keeps its client's data
        if not defense.private:
            return f"'{defense.name}' makes no DP claim: Dirac canaries audit a claim"
        return None

    def refused(self, defense, training) -> str | None:
        """Why the defense's privatisation cannot take Dirac rows (None: it can)."""
        return defense.audit_hooks().dirac_canaries_refused(training)

    def check(self, field_path: str, setting: Setting) -> None:
        if len(set(self.params.observers)) != len(self.params.observers):
            raise UserInputError(f"{field_path}.params.observers: {self.params.observers} repeats an observer; "
                                 f"allowed: a subset of {list(OBSERVERS)}")

    def needs_iterates(self) -> bool:
        return Observation.ALL_ITERATES in self.params.observers or Observer.SERVER in self.params.observers

    def needs_records(self) -> bool:
        return True

    def per_run(self, dim: int) -> int:
        return min(dim, self.params.per_run or dim)

    def run_count(self, dim: int) -> int:
        """Runs of :meth:`per_run` canaries that give at least ``coins`` coins."""
        return max(1, -(-self.params.coins // self.per_run(dim)))

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        dim = context.layout.dim
        count = self.per_run(dim)
        rng = numpy_rng(context.seed, "canaries", self.label, run, "coordinates")
        coords = rng.permutation(dim)[:count]
        signs = rng.choice([-1.0, 1.0], size=count)
        return CanaryInjection(self.inclusion(context, run, count), dirac_coords=coords,
                               dirac_values=signs * self.params.amplitude * self._clip(context))

    # ------------------------------------------------------------------ statistics

    def evaluate(self, context: CanaryContext, runs: list[CanaryRun], model: torch.nn.Module) -> list[AttackResult]:
        inserted = np.stack([run.injection.inserted for run in runs])
        claim = runs[0].claim
        if claim is None:
            raise ValueError("the Dirac canary audit needs each run's own claim")
        released = claim.against(Observer.RELEASED)
        sigma = per_canary_multiplier(released)
        mirrored = claim.relation == Relation.REPLACE_ONE
        unread = path_anomaly(runs, "dirac_path")
        results = []
        for observer in self.params.observers:
            if unread is not None:
                observation = Observation(observer) if observer != Observer.SERVER else (
                    Observation.EACH_UPLOAD if context.defense.observes == "uploads" else Observation.AGGREGATE)
                who = Observer.SERVER if observer == Observer.SERVER else Observer.RELEASED
                result = self._result(context, runs, inserted, None, observation, claim.for_observer(who),
                                      f"the canaries' path through the defense's own code could not be "
                                      f"isolated ({unread}), and no other path is audited")
            elif observer == Observer.SERVER:
                result = self._server_result(context, runs, inserted, claim, sigma, mirrored)
            else:
                scores = np.stack([self._released_scores(context, run, observer, sigma, mirrored) for run in runs]) \
                    if observer == Observation.FINAL_MODEL or sigma else None
                result = self._result(context, runs, inserted, scores, Observation(observer),
                                      claim.for_observer(Observer.RELEASED),
                                      "" if sigma or observer == Observation.FINAL_MODEL else
                                      "the claim accounts no Gaussian noise multiplier to standardise with")
            results.append(result)
            curve = self._mechanism_curve(context, result, runs, sigma) \
                if observer == Observation.ALL_ITERATES and sigma and not mirrored and unread is None \
                and claim.mechanism.startswith(CONTINUOUS_GAUSSIAN) else None
            if curve is not None:
                results.append(curve)
        return results

    def _mechanism_curve(self, context: CanaryContext, base: AttackResult, runs: list[CanaryRun],
                         sigma: float) -> AttackResult | None:
        """The all-iterates counts against the accounted mechanism's own curve
        (:mod:`attacks.canaries.mechanism_curve`): Gaussian noise of multiplier σ per change S, Poisson
        rate q, every round. A Dirac canary's readings are exactly that mechanism's when the code is
        honest — one coordinate, shifted by 1/σ in a round it joined — so its counts cannot refute
        it more often than α. Only where the claim accounts exactly that continuous Gaussian, every
        round or Poisson-subsampled (add/remove): mirrored pairs, discrete or distributed noise and
        accountants of their own are left to the (ε, δ) curve."""
        rounds = max(len(run.iterates) for run in runs if run.iterates is not None)
        return mechanism_curve_result(base, "gaussian", sigma, context.training.sampling_rate(context.clients), rounds,
                                      f"Gaussian noise of multiplier σ = {sigma:.4g} per change S",
                                      "all-iterates-mechanism-curve")

    def _result(self, context: CanaryContext, runs: list[CanaryRun], inserted: np.ndarray, scores: np.ndarray | None,
                observation: Observation, claim: PrivacyClaim | None, missing: str) -> AttackResult:
        adversary = Observer.SERVER if observation in (Observation.EACH_UPLOAD, Observation.AGGREGATE) else Observer.RELEASED
        delta = claim.delta if claim is not None and claim.is_private and claim.delta > 0 else context.delta
        exercised = exercised_canaries(runs)
        coins = int(exercised.sum())
        notes = (f"{inserted.size} Dirac canary clients over {len(runs)} run(s), {int(inserted.sum())} inserted; "
                 f"raw update ±{self.params.amplitude:g}·S before the defense's clip; observed: {observation}; "
                 f"statistic: {STATISTICS[observation]}; compared with the {adversary} figure of the run's claim")
        if coins < inserted.size:
            notes += (f"; {coins} of them are coins: the others' coordinates were released in no round they joined "
                      "(a public subset the defense trains), so nothing of them reached any observer")
        passed = [(row.get("dirac_inserted", 0), row.get("dirac_dropped", 0)) for run in runs for row in run.metrics or []]
        joined, dropped = sum(p for p, _ in passed), sum(d for _, d in passed)
        if dropped:
            notes += (f"; the defense's own selection (a mask, a top-k of |g⊙Δ|) kept out {dropped} of {joined} "
                      f"canary contributions ({dropped / joined:.0%}): those canaries met a thinned mechanism, and the "
                      "power stated assumes every contribution passes")
        if scores is None:
            scores = np.zeros(inserted.shape)
            notes += f"; no statistic: {missing}"
        levels = preregistered_levels(claim, coins)
        if levels:
            notes += ("; abstention levels fixed in advance by the design's power against the claim (each tested at the "
                      "full α): " + ", ".join(f"{name} {fractions[0]:.1%} of the coins" for name, fractions in levels.items()))
        # the released models' canaries meet the clients' sampling (the server's readings do not:
        # it sees who joined) — a subsampled Gaussian, outside the verdicts' power model
        result = canary_result(self.label, self.unit, scores, inserted, delta, context.seed, notes, levels=levels,
                               exercised=exercised,
                               unmodelled_power=sampling_caveat(context) if adversary == Observer.RELEASED else "")
        result.variant = "" if observation == Observation.FINAL_MODEL else observation.split(",")[0].replace(" ", "-")
        result.observation, result.adversary, result.claim = observation, adversary, claim
        result.statistic = STATISTICS[observation]
        return without_measurement(result, notes) if missing else result

    def _released_scores(self, context: CanaryContext, run: CanaryRun, observer: str, sigma: float | None,
                         mirrored: bool) -> np.ndarray:
        coords, signs = self._coords_signs(run)
        if observer == Observation.FINAL_MODEL:
            change = (run.final - run.initial).to(torch.float64).numpy()[coords]
            return signs * (change - context.training.server_lr * real_drift(run).sum(0))
        assert sigma is not None
        readings = self._iterate_readings(context, run, coords, signs, sigma)
        rate = context.training.sampling_rate(context.clients)
        return mixture_log_likelihood_ratio(readings, 1.0 / sigma, rate, mirrored)

    def _server_result(self, context: CanaryContext, runs: list[CanaryRun], inserted: np.ndarray, claim: PrivacyClaim,
                       sigma: float | None, mirrored: bool) -> AttackResult:
        observation = Observation.EACH_UPLOAD if context.defense.observes == "uploads" else Observation.AGGREGATE
        server_claim = claim.for_observer(Observer.SERVER)
        if not sigma:
            return self._result(context, runs, inserted, None, observation, server_claim,
                                "the claim accounts no Gaussian noise multiplier to standardise with")
        scores, blocks, run_signs, claimed_mu = [], [], [], []
        for run in runs:
            coords, signs = self._coords_signs(run)
            assert run.server_view is not None and run.metrics is not None
            uploads = run.server_view["dirac/uploads"].to(torch.float64).numpy()  # [T, K], NaN: did not join
            if uploads.shape[1] != len(coords):
                return self._result(context, runs, inserted, None, observation, server_claim,
                                    "held-out canaries are absent (an add/remove design), and the server, which sees who "
                                    "takes part, would read participation itself")
            taken = ~np.isnan(uploads)
            if observation == Observation.EACH_UPLOAD:
                counts = np.array([float(r.get("participants", 0)) for r in run.metrics])  # canaries count in no |P_t|
                # one upload's noise is S·σ/√|P_t|: reading z = s·u·√|P_t|/(σS), shift μ_t = √|P_t|/σ
                shifts = np.sqrt(counts) / sigma
                z = (signs[None, :] * np.nan_to_num(uploads) * shifts[:, None] / self._clip(context)).T
                scores.append(standardised_sum(z, taken.T, shifts))
                claimed_mu.append(claimed_shifts(taken, shifts))
                blocks.append(conformance_block(run, uploads, mirrored))
                run_signs.append(signs)
            else:
                readings = self._iterate_readings(context, run, coords, signs, sigma)
                scores.append(standardised_sum(readings, taken.T))
                if drift_known(run):  # the readings are then the canary's contribution and the noise alone
                    claimed_mu.append(claimed_shifts(taken, np.full(len(taken), 1.0 / sigma)))
        result = self._result(context, runs, inserted, np.stack(scores), observation, server_claim, "")
        if len(claimed_mu) == len(runs):  # Gaussian by construction: read by the gated parametric test too
            result.parametric, said = server_parametric(np.stack(scores), inserted, np.stack(claimed_mu),
                                                        exercised_canaries(runs), server_claim, mirrored)
            result.notes += f"; {said}"
        else:
            result.notes += ("; parametric test not run: the real clients' share of a step could not be told from the "
                             "noise, and left in the readings it depends on earlier rounds the canary moved")
        accounted = claim.against(Observer.SERVER)
        if blocks and accounted is not None and accounted.covered and accounted.noise_multiplier:
            # the least per-upload noise std the server's figure accounts: its multiplier per change
            # one canary makes (the clip S; twice the claim's own under replace-one) times S
            clip = self._clip(context)
            result.conformance = upload_conformance(blocks, list(inserted), clip,
                                                    per_canary_multiplier(accounted) * clip,
                                                    signs=run_signs)
            if result.conformance is not None:
                result.notes += f"; uploads against the claimed clip and noise: {result.conformance.describe()}"
        return result

    @staticmethod
    def _clip(context: CanaryContext) -> float:
        """S: the largest value one canary's clipped contribution can have on its coordinate
        (:meth:`~defenses.audit_hooks.AuditHooks.dirac_clip`)."""
        return context.defense.audit_hooks().dirac_clip()

    @staticmethod
    def _coords_signs(run: CanaryRun) -> tuple[np.ndarray, np.ndarray]:
        injection = run.injection
        assert injection.dirac_coords is not None and injection.dirac_values is not None
        return injection.dirac_coords, np.sign(injection.dirac_values)

    @classmethod
    def _iterate_readings(cls, context: CanaryContext, run: CanaryRun, coords: np.ndarray, signs: np.ndarray,
                          sigma: float) -> np.ndarray:
        """z_{k,t} = s_k·(w_t − w_{t−1} − η_g·r_t)_{j_k}·D_t/(η_g·σ·S): [K, T], r_t the real clients'
        noise-free share of the step (:func:`real_drift`): N(0, 1) for a held-out canary, shifted by
        1/σ in a round an inserted one joined."""
        if run.iterates is None or run.metrics is None:
            raise ValueError("the all-iterates statistic needs every round's global model and the run's metrics")
        models = torch.cat([run.initial[None, :], run.iterates]).to(torch.float64)
        deltas = (models[1:] - models[:-1])[:, torch.as_tensor(coords)].numpy()  # [T, K]
        deltas = deltas - context.training.server_lr * real_drift(run)
        divisors = np.array([float(r.get("divisor") or 1.0) for r in run.metrics])[:, None]
        z = deltas * divisors / (context.training.server_lr * sigma * cls._clip(context))
        return (signs[None, :] * z).T

