"""FedAvg (McMahan et al. 2017) and DP-FedAvg (McMahan et al. 2018; spec 000 §2.0–2.1, Alg. 1).

DP-FedAvg, per round t with participants P_t (spec 000 §2.1):

    Δ_i  = LocalSGD(w, D_i) − w                       # flattened over all parameters
    Δ̃_i  = Δ_i / max(1, ‖Δ_i‖₂ / S)                   # one flat ℓ2 clip
    upload_i = Δ̃_i + N(0, S²σ²/|P_t| · I_d)            # noise_placement = "client" (papers 000, 002, 003)
    w ← w + η_g · (1/|P_t|) Σ_i upload_i

so the noise of the sum is N(0, S²σ²·I). With ``noise_placement = "aggregate"`` a trusted
aggregator adds N(0, S²σ²·I) once to the sum instead (same distribution of the global step).
Each round is a sampled Gaussian mechanism with noise multiplier σ on the sum of clipped
updates, composed over T rounds (:mod:`defenses.accounting`), client-level.

What the claim does not cover: with client-side noise and no secure aggregation the server
sees each upload, whose own noise multiplier is only σ/√|P_t| — attacks on single uploads
(gradient inversion) lie outside the guarantee and the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from audit.errors import UserInputError
from defenses.accounting import (
    GaussianSchedule,
    calibrate_noise,
    compute_epsilon,
    epsilon_trajectory,
)
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.clipping import clip_rows
from defenses.engine import RoundContext, TrainingConfig
from defenses.noise import gaussian_rows


@DEFENSES.register("fedavg")
class FedAvg(Defense):
    """Non-private federated averaging: the leakage baseline every defense is compared with."""

    name = "fedavg"
    summary = "Federated averaging without privacy (baseline)"
    reference = "McMahan et al. 2017, Communication-Efficient Learning of Deep Networks from Decentralized Data"

    def privacy_claim(self, training, num_clients, rounds, delta, accounting) -> PrivacyClaim:
        return PrivacyClaim.non_private("non-private baseline: no clipping, no noise")


@dataclass(frozen=True)
class DPFedAvgParams:
    clip: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                               "help": "S: flat ℓ2 bound on each client's update"})
    noise_multiplier: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                           "help": "σ: noise std of the sum is σS (set by calibration when 'epsilons' is given)"})
    noise_placement: Literal["client", "aggregate"] = field(
        default="client", metadata={"help": "client: each upload gets N(0,S²σ²/|P_t|); aggregate: a trusted aggregator adds N(0,S²σ²) to the sum"})
    denominator: Literal["realized", "expected"] = field(
        default="realized", metadata={"help": "divide the sum by the realized |P_t| (paper) or the expected qN"})
    secure_aggregation: bool = field(
        default=False, metadata={"help": "simulated secure aggregation: the server sees only the sum of uploads"})


@DEFENSES.register("dp-fedavg")
class DPFedAvg(Defense):
    """DP-FedAvg with flat clipping and Gaussian noise, client-level (ε, δ)-DP."""

    name = "dp-fedavg"
    summary = "Client-level DP-FedAvg: flat ℓ2 clip of each update, Gaussian noise (client-side or on the sum)"
    reference = "McMahan, Ramage, Talwar, Zhang 2018, Learning Differentially Private Recurrent Language Models (Alg. 1)"
    Params = DPFedAvgParams
    private = True

    @property
    def observes(self) -> str:
        private_sum = self.params.noise_placement == "aggregate" or self.params.secure_aggregation
        return "aggregate" if private_sum else "uploads"

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError("training.aggregation: dp-fedavg needs 'uniform' (size weights change the sensitivity)")

    def schedule(self, training: TrainingConfig, num_clients: int, rounds: int | None = None) -> GaussianSchedule:
        return GaussianSchedule(self.params.noise_multiplier, training.sampling_rate(num_clients),
                                training.rounds if rounds is None else rounds, training.sampling, num_clients)

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> DPFedAvg:
        sigma = calibrate_noise(target_epsilon, self.schedule(training, num_clients), delta,
                                accounting.accountant, accounting.conversion)
        return self.with_params(noise_multiplier=sigma)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting) -> PrivacyClaim:
        schedule = self.schedule(training, num_clients, rounds)
        report = compute_epsilon(schedule, delta, accounting.accountant, accounting.conversion)
        notes = ["client-level: neighbouring datasets differ in one client's data"]
        if self.observes == "uploads":
            per_upload = self.params.noise_multiplier / math.sqrt(max(1.0, training.sampling_rate(num_clients) * num_clients))
            notes.append(f"the server sees each noisy upload, whose own noise multiplier is only about "
                         f"σ/√|P_t| ≈ {per_upload:.3g}: single-upload attacks are outside the guarantee")
        if self.params.denominator == "realized" and training.sampling == "poisson" and training.client_rate < 1:
            notes.append("the mean divides by the realized |P_t|, which the sampled-Gaussian analysis does not strictly cover")
        return PrivacyClaim(report.epsilon, delta, "client", report.label, schedule.describe(), "; ".join(notes))

    def epsilon_trajectory(self, training, num_clients, delta, accounting) -> list[float]:
        schedule = self.schedule(training, num_clients)
        if accounting.accountant == "rdp":
            return [float(e) for e in epsilon_trajectory(schedule, delta, accounting.conversion)]
        return [compute_epsilon(schedule.with_steps(t), delta, "pld").epsilon for t in range(1, training.rounds + 1)]

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict[str, float]]:
        clip, sigma = self.params.clip, self.params.noise_multiplier
        clipped, _, was_clipped = clip_rows(updates, clip)
        diagnostics = {"clip_fraction": float(was_clipped.double().mean())}
        if self.params.noise_placement == "client":
            std = clip * sigma / math.sqrt(len(ctx.participants))
            generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
            clipped = clipped + gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
        return clipped, diagnostics

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        total = uploads.sum(0)
        if self.params.noise_placement == "aggregate":
            std = self.params.clip * self.params.noise_multiplier
            total = total + gaussian_rows(1, uploads.shape[1], std, [ctx.server_generator("noise")], uploads.device)[0]
        denominator = (ctx.training.sampling_rate(ctx.num_clients) * ctx.num_clients
                       if self.params.denominator == "expected" else len(ctx.participants))
        return total / denominator
