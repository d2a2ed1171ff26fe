"""NbAFL, "noising before model aggregation": Wei, Li, Ding, Ma, Yang, Farokhi, Jin, Quek, Poor,
"Federated Learning with Differential Privacy: Algorithms and Performance Analysis" (IEEE TIFS
2020, arXiv 1911.00222) — a baseline of UDP-FL (Feng et al. 2024, §5.2).

Client i trains locally, clips its *model* w_i to ‖w_i‖ ≤ C and uploads w_i + N(0, σ_U²·I);
the server averages and, when T > L√N, adds N(0, σ_D²·I) to the average before broadcasting:

    σ_U = c·L·Δs_U/ε,   Δs_U = 2C/m,   c = √(2 ln(1.25/δ)),
    σ_D = 2cC·√(T² − L²N)/(m·N·ε)   (only if T > L√N),

with m the smallest local dataset, N clients, T rounds and L exposures of each client's model
(L = T when every client joins every round; L = T·K/N under K-random scheduling). ``epsilon``
sets the noise through these formulas; the claim is computed from the noise (below).

What was verified, and what was not (the NbAFL text itself is not available offline here; the
formulas above were recalled, not read from it):
* verified — c = √(2 ln(1.25/δ)) is the classic Gaussian-mechanism constant (Dwork & Roth 2014,
  Thm. A.1: σ = cΔ/ε gives (ε, δ)-DP for ε < 1); σ_U = c·L·Δ/ε is that calibration at ε/L per
  exposure, composed over L exposures by basic composition — which makes the total δ up to L·δ,
  not δ;
* not verified — the sensitivity Δs_U = 2C/m (it treats the local model as an average of
  per-record terms of norm ≤ C, which local SGD does not satisfy) and the downlink formula.
What the code does enforce is the clip of the uploaded model, ‖w_i‖ ≤ C: two clients' models
differ by at most 2C, so each upload is a Gaussian mechanism with noise multiplier σ_U/(2C) for
replacing one client's data — and since a record changes only its owner's data, for records too.
That is the sound headline claim: client-level, replace-one, accounted with RDP over the rounds a
client takes part in (participation known, :mod:`defenses.privacy.claims`). It holds against the server
(it sees every upload) and against one upload alone. The released models carry the mean of the
round's uploads plus the downlink noise — more noise per change of 2C, accounted over every
round without amplification — and never less privacy than the uploads they come from. The
paper's record-level ε (its formula, as recalled) and the RDP figure *given* the stated
sensitivity 2C/m stay beside it as labelled alternatives; neither is a proven bound for this
training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.base import DEFENSES, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.clipping import clip_rows
from defenses.blocks.noise import gaussian_rows
from defenses.federated.training_job import NO_STATE, DefenseState, RoundContext, TrainingConfig
from defenses.privacy.accounting import GaussianSchedule, accountant_label, compute_epsilon
from defenses.privacy.claims import (
    AdversaryClaim,
    gaussian_round_epsilon,
    known_participation_epsilon,
    server_notes,
)

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class NbAFLParams:
    clip: float = field(default=10.0, metadata={"min": 0.0, "min_exclusive": True, "help": "C: bound on ‖w_i‖ (the local model)"})
    epsilon: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                  "help": "the ε the noise is set for (by calibration when 'epsilons' is given)"})
    downlink: bool = field(default=True, metadata={"help": "add the server's noise when T > L√N"})


@dataclass(frozen=True)
class NbAFLState(DefenseState):
    """What NbAFL's noise depends on in a run: m, the run's smallest local dataset, and its δ."""

    smallest: int
    delta: float


def smallest_client(clients: list) -> int:
    """m: the fewest records a client of the run holds, among clients that hold any (a client
    without records — one a membership run leaves out — trains nothing and bounds nothing)."""
    return min((len(c) for c in clients if len(c)), default=1)


def run_state(ctx: RoundContext) -> NbAFLState:
    if not isinstance(ctx.state, NbAFLState):
        raise ValueError("nbafl: a round's noise depends on its run's smallest client; the run was not prepared")
    return ctx.state


def uplink_std(clip: float, epsilon: float, delta: float, exposures: float, smallest: int) -> float:
    """σ_U = c·L·(2C/m)/ε."""
    return math.sqrt(2 * math.log(1.25 / delta)) * exposures * (2 * clip / smallest) / epsilon


def downlink_std(clip: float, epsilon: float, delta: float, exposures: float, smallest: int, clients: int, rounds: int) -> float:
    """σ_D = 2cC·√(T² − L²N)/(mNε) when T > L√N, else 0."""
    if rounds <= exposures * math.sqrt(clients):
        return 0.0
    c = math.sqrt(2 * math.log(1.25 / delta))
    return 2 * c * clip * math.sqrt(rounds ** 2 - exposures ** 2 * clients) / (smallest * clients * epsilon)


@DEFENSES.register
class NbAFL(Defense):
    name = "nbafl"
    summary = "Noising before aggregation: clipped local models plus Gaussian noise, server noise when needed"
    reference = "Wei et al. 2020, Federated Learning with Differential Privacy: Algorithms and Performance Analysis"
    Params = NbAFLParams
    private = True

    def exposures(self, training: TrainingConfig, num_clients: int) -> float:
        return training.rounds * training.sampling_rate(num_clients)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError("training.aggregation: nbafl averages the noisy models uniformly; use 'uniform'")

    def calibrate(self, target_epsilon, delta, training, num_clients, accounting) -> NbAFL:
        """The paper's parameterisation: 'epsilons' set ε in σ_U's formula; the claim then reports the
        sound ε of that noise, which is not the target (it depends on the smallest client m, known
        only when training)."""
        return self.with_params(epsilon=target_epsilon)

    def prepare(self, job, model=None, initial=None) -> NbAFLState:
        return NbAFLState(smallest_client(job.clients), job.delta)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state: DefenseState = NO_STATE) -> PrivacyClaim:
        """The run's claim: its noise σ_U depends on its smallest client m (``state``); before a run's data
        is known (planning) m = 1 stands in, and each run's manifest holds the claim of its own m."""
        smallest = state.smallest if isinstance(state, NbAFLState) else 1
        exposures = self.exposures(training, num_clients)
        sigma_u = uplink_std(self.params.clip, self.params.epsilon, delta, exposures, smallest)
        sensitivity = 2 * self.params.clip / smallest
        given = compute_epsilon(GaussianSchedule(sigma_u / sensitivity, 1.0, max(1, int(round(exposures)))), delta,
                                accounting.accountant, accounting.conversion)
        # sound: the model clip makes any two uploads differ by ≤ 2C (replace-one client), per upload
        multiplier = sigma_u / (2 * self.params.clip)
        epsilon, counted = known_participation_epsilon(multiplier, rounds, training.sampling_rate(num_clients), delta,
                                                       accounting.accountant, accounting.conversion)
        label = accountant_label(accounting.accountant, accounting.conversion)
        round_epsilon = gaussian_round_epsilon(multiplier, delta, accounting.accountant, accounting.conversion)
        per_upload = (f"each upload a Gaussian mechanism with noise multiplier σ_U/(2C) = {multiplier:.4g}, "
                      f"{counted} of {rounds} rounds accounted (participation known)")
        # the released mean of m uploads (plus the server's downlink noise) sums to √(mσ_U² + m²σ_D²) of noise for a
        # change of ≤ 2C; m is at least the round size (every client, or m of fixed-size sampling; 1 under Poisson)
        fewest = (training.round_size(num_clients) if training.sampling == "fixed" else
                  num_clients if training.sampling_rate(num_clients) >= 1 else 1)
        sigma_d = downlink_std(self.params.clip, self.params.epsilon, delta, exposures, smallest, num_clients,
                               training.rounds) if self.params.downlink else 0.0
        released_multiplier = math.sqrt(fewest * sigma_u ** 2 + (fewest * sigma_d) ** 2) / (2 * self.params.clip)
        released_epsilon = compute_epsilon(GaussianSchedule(released_multiplier, 1.0, rounds), delta, accounting.accountant,
                                           accounting.conversion).epsilon
        released = AdversaryClaim(
            Observer.RELEASED, min(released_epsilon, epsilon), delta, Relation.REPLACE_ONE, "the global model after every round",
            label,
            amplification=False, rounds=rounds if released_epsilon <= epsilon else counted,
            noise_multiplier=released_multiplier if released_epsilon <= epsilon else multiplier,
            round_epsilon=gaussian_round_epsilon(released_multiplier, delta, accounting.accountant, accounting.conversion)
            if released_epsilon <= epsilon else round_epsilon,
            notes=(f"the mean of at least {fewest} uploads plus the downlink noise: noise multiplier {released_multiplier:.4g} "
                   f"over all {rounds} rounds (no amplification credited), or the server's figure if smaller "
                   "(post-processing of the uploads)"))
        adversaries = (released,) + tuple(
            AdversaryClaim(adversary, epsilon, delta, Relation.REPLACE_ONE, observes, label, amplification=False, rounds=counted,
                           noise_multiplier=multiplier, round_epsilon=round_epsilon,
                           notes=server_notes(per_upload) if adversary == Observer.SERVER else per_upload)
            for adversary, observes in ((Observer.SERVER, "every client's upload"), (Observer.LOCAL, "one client's upload")))
        notes = ("sound headline: client-level, replace-one, from the enforced model clip ‖w‖ ≤ C (uploads differ by ≤ 2C); "
                 f"the paper's record-level ε = {self.params.epsilon:g} (its Theorem, as recalled — the sensitivity 2C/m it "
                 "assumes does not hold for local SGD, and basic composition leaves the total δ at up to "
                 f"L·δ = {exposures * delta:.3g}) and the RDP figure given that sensitivity are alternatives, neither proven")
        mechanism = (f"uplink N(0, σ_U²), σ_U = {sigma_u:.4g} on clipped models (C = {self.params.clip:g}, m "
                     f"= {smallest}), L = {exposures:g} exposures")
        return PrivacyClaim(released.epsilon, delta, Unit.CLIENT, label, mechanism, notes,
                            alternatives={"paper_record_level": self.params.epsilon, "rdp_given_sensitivity": given.epsilon},
                            relation=Relation.REPLACE_ONE, adversary=Observer.RELEASED, adversaries=adversaries)

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        training, state = ctx.training, run_state(ctx)
        models = ctx.global_vector[None, :] + updates
        clipped, norms, was_clipped = clip_rows(models, self.params.clip)
        std = uplink_std(self.params.clip, self.params.epsilon, state.delta,
                         self.exposures(training, ctx.num_clients), state.smallest)
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noisy = clipped + gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
        diagnostics = {"clip_fraction": float(was_clipped.double().mean()), "clip_input_norms": norms, "uplink_std": std}
        return noisy - ctx.global_vector[None, :], diagnostics

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        step = uploads.mean(0)
        if self.params.downlink:
            training, state = ctx.training, run_state(ctx)
            std = downlink_std(self.params.clip, self.params.epsilon, state.delta, self.exposures(training, ctx.num_clients),
                               state.smallest, ctx.num_clients, training.rounds)
            if std > 0:
                step = step + gaussian_rows(1, uploads.shape[1], std, [ctx.server_generator("downlink")], uploads.device)[0]
        return step

    def audit_hooks(self) -> NbAFLAuditHooks:
        return NbAFLAuditHooks(self)


class NbAFLAuditHooks(AuditHooks):
    """NbAFL as the audits see it. Dense canary clients carry the median honest norm (it clips
    models, not updates). A Dirac canary is a *model*: its probe row holds the update −w_0 (the
    model 0, which the clip leaves alone) with its spike on top, so the canary's model is s·U·e_j,
    clipped by NbAFL's own code to s·C·e_j; under the replace-one claim its held-out twin's model
    is −s·C·e_j, a pair at the claim's full sensitivity 2C."""

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        return None

    def dirac_origin(self, ctx: RoundContext) -> torch.Tensor:
        """The update whose model is 0: −w_0."""
        return -ctx.global_vector

    def dirac_clip(self, state: DefenseState | None = None) -> float:
        """C: the clip of the model, the most a canary model has on its coordinate."""
        return float(self.defense.params.clip)
