"""NbAFL, "noising before model aggregation": Wei, Li, Ding, Ma, Yang, Farokhi, Jin, Quek, Poor,
"Federated Learning with Differential Privacy: Algorithms and Performance Analysis" (IEEE TIFS
2020, arXiv 1911.00222) — a baseline of paper 001 (spec 001 §2.8).

Client i trains locally, clips its *model* w_i to ‖w_i‖ ≤ C and uploads w_i + N(0, σ_U²·I);
the server averages and, when T > L√N, adds N(0, σ_D²·I) to the average before broadcasting:

    σ_U = c·L·Δs_U/ε,   Δs_U = 2C/m,   c = √(2 ln(1.25/δ)),
    σ_D = 2cC·√(T² − L²N)/(m·N·ε)   (only if T > L√N),

with m the smallest local dataset, N clients, T rounds and L exposures of each client's model
(L = T when every client joins every round; L = T·K/N under K-random scheduling).

What was verified, and what was not (the NbAFL text itself is not available offline here; the
formulas above are the spec's recollection):
* verified — c = √(2 ln(1.25/δ)) is the classic Gaussian-mechanism constant (Dwork & Roth 2014,
  Thm. A.1: σ = cΔ/ε gives (ε, δ)-DP for ε < 1); σ_U = c·L·Δ/ε is that calibration at ε/L per
  exposure, composed over L exposures by basic composition — which makes the total δ up to L·δ,
  not δ;
* not verified — the sensitivity Δs_U = 2C/m (it treats the local model as an average of
  per-record terms of norm ≤ C, which local SGD does not satisfy) and the downlink formula.
The claim therefore reports the paper's ε as claimed and, beside it, the RDP accounting of the
uplink Gaussian noise *given* the stated sensitivity; neither is a proven bound for the
implemented training, which the report says. Record-level (replace-one) neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from audit.errors import UserInputError
from defenses.accounting import GaussianSchedule, compute_epsilon
from defenses.base import DEFENSES, Defense, PrivacyClaim
from defenses.clipping import clip_rows
from defenses.engine import RoundContext, TrainingConfig
from defenses.noise import gaussian_rows


@dataclass(frozen=True)
class NbAFLParams:
    clip: float = field(default=10.0, metadata={"min": 0.0, "min_exclusive": True, "help": "C: bound on ‖w_i‖ (the local model)"})
    epsilon: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                  "help": "the ε the noise is set for (by calibration when 'epsilons' is given)"})
    downlink: bool = field(default=True, metadata={"help": "add the server's noise when T > L√N"})


def uplink_std(clip: float, epsilon: float, delta: float, exposures: float, smallest: int) -> float:
    """σ_U = c·L·(2C/m)/ε."""
    return math.sqrt(2 * math.log(1.25 / delta)) * exposures * (2 * clip / smallest) / epsilon


def downlink_std(clip: float, epsilon: float, delta: float, exposures: float, smallest: int, clients: int, rounds: int) -> float:
    """σ_D = 2cC·√(T² − L²N)/(mNε) when T > L√N, else 0."""
    if rounds <= exposures * math.sqrt(clients):
        return 0.0
    c = math.sqrt(2 * math.log(1.25 / delta))
    return 2 * c * clip * math.sqrt(rounds ** 2 - exposures ** 2 * clients) / (smallest * clients * epsilon)


@DEFENSES.register("nbafl")
class NbAFL(Defense):
    name = "nbafl"
    summary = "Noising before aggregation: clipped local models plus Gaussian noise, server noise when needed"
    reference = "Wei et al. 2020, Federated Learning with Differential Privacy: Algorithms and Performance Analysis"
    Params = NbAFLParams
    private = True

    def __init__(self, params=None, layout=None):
        super().__init__(params, layout)
        self._smallest = 1
        self._delta = 1e-5

    def exposures(self, training: TrainingConfig, num_clients: int) -> float:
        return training.rounds * training.sampling_rate(num_clients)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError("training.aggregation: nbafl averages the noisy models uniformly; use 'uniform'")

    def calibrate(self, target_epsilon, delta, training, num_clients, accounting) -> NbAFL:
        return self.with_params(epsilon=target_epsilon)

    def prepare(self, job, model=None, initial=None) -> None:
        self._smallest = min(len(c) for c in job.clients)
        self._delta = job.delta

    def privacy_claim(self, training, num_clients, rounds, delta, accounting) -> PrivacyClaim:
        exposures = self.exposures(training, num_clients)
        sigma_u = uplink_std(self.params.clip, self.params.epsilon, delta, exposures, self._smallest)
        sensitivity = 2 * self.params.clip / self._smallest
        rdp = compute_epsilon(GaussianSchedule(sigma_u / sensitivity, 1.0, max(1, int(round(exposures)))), delta,
                              accounting.accountant, accounting.conversion)
        notes = ("record-level (replace-one); formulas recalled, not checked against the NbAFL text (unavailable offline): "
                 "the Gaussian constant and basic composition were verified, the sensitivity 2C/m was not and does not "
                 "hold for local SGD, so neither figure is a proven bound for this training; basic composition "
                 f"leaves the total δ at up to L·δ = {exposures * delta:.3g}")
        mechanism = (f"uplink N(0, σ_U²), σ_U = {sigma_u:.4g} on clipped models (C = {self.params.clip:g}, m = {self._smallest}), "
                     f"L = {exposures:g} exposures")
        return PrivacyClaim(self.params.epsilon, delta, "record", "NbAFL's Theorem (basic composition, as recalled)",
                            mechanism, notes, alternatives={"rdp_given_sensitivity": rdp.epsilon})

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        training = ctx.training
        models = ctx.global_vector[None, :] + updates
        clipped, norms, was_clipped = clip_rows(models, self.params.clip)
        std = uplink_std(self.params.clip, self.params.epsilon, self._delta, self.exposures(training, ctx.num_clients), self._smallest)
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noisy = clipped + gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
        diagnostics = {"clip_fraction": float(was_clipped.double().mean()), "clip_input_norms": norms, "uplink_std": std}
        return noisy - ctx.global_vector[None, :], diagnostics

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        step = uploads.mean(0)
        if self.params.downlink:
            training = ctx.training
            std = downlink_std(self.params.clip, self.params.epsilon, self._delta, self.exposures(training, ctx.num_clients),
                               self._smallest, ctx.num_clients, training.rounds)
            if std > 0:
                step = step + gaussian_rows(1, uploads.shape[1], std, [ctx.server_generator("downlink")], uploads.device)[0]
        return step
