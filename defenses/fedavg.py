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

:class:`DPFedAvg` is also the base of the family that changes one step of this pipeline —
BLUR/LUS (paper 000), DP-FedSAM and its top-k variant (paper 002), Fed-SMP — through the hooks
:meth:`DPFedAvg.pre_clip` (sparsify before clipping), ``noise_on_kept_only`` and
:meth:`DPFedAvg.post_noise` (mask after the noise), and :meth:`Defense.local_objective`.

What the claim does not cover: with client-side noise and no secure aggregation the server
sees each upload, whose own noise multiplier is only σ/√|P_t| — attacks on single uploads
(gradient inversion) lie outside the guarantee and the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from audit.errors import UserInputError
from defenses.accounting import (
    GaussianSchedule,
    calibrate_noise,
    compute_epsilon,
    epsilon_trajectory,
)
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.clipping import clip_rows, clip_rows_per_tensor
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
                                               "help": "S: ℓ2 bound on each client's update"})
    noise_multiplier: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                           "help": "σ: noise std of the sum is σS (set by calibration when 'epsilons' is given)"})
    noise_placement: Literal["client", "aggregate"] = field(
        default="client", metadata={"help": "client: each upload gets N(0,S²σ²/|P_t|); aggregate: a trusted aggregator adds N(0,S²σ²) to the sum"})
    denominator: Literal["realized", "expected"] = field(
        default="realized", metadata={"help": "divide the sum by the realized |P_t| (paper) or the expected qN"})
    secure_aggregation: bool = field(
        default=False, metadata={"help": "simulated secure aggregation: the server sees only the sum of uploads"})
    clip_mode: Literal["flat", "per_tensor"] = field(
        default="flat", metadata={"help": "flat: one ℓ2 clip over all parameters; per_tensor: each tensor to S (sensitivity S√L, accounted)"})


@DEFENSES.register("dp-fedavg")
class DPFedAvg(Defense):
    """DP-FedAvg with ℓ2 clipping and Gaussian noise, client-level (ε, δ)-DP."""

    name = "dp-fedavg"
    summary = "Client-level DP-FedAvg: flat ℓ2 clip of each update, Gaussian noise (client-side or on the sum)"
    reference = "McMahan, Ramage, Talwar, Zhang 2018, Learning Differentially Private Recurrent Language Models (Alg. 1)"
    Params = DPFedAvgParams
    private = True
    clips_updates = True
    #: add noise only where :meth:`pre_clip` kept coordinates (Fed-SMP) instead of everywhere (LUS)
    noise_on_kept_only: ClassVar[bool] = False

    # ---------------------------------------------------------------- configuration

    @property
    def observes(self) -> str:
        private_sum = self.params.noise_placement == "aggregate" or self.params.secure_aggregation
        return "aggregate" if private_sum else "uploads"

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError(f"training.aggregation: {self.name} needs 'uniform' (size weights change the sensitivity)")
        masks_noise = self.noise_on_kept_only or type(self).post_noise is not DPFedAvg.post_noise
        if masks_noise and self.params.noise_placement != "client":
            raise UserInputError(f"params.noise_placement: {self.name} masks each client's noise, which needs 'client'")

    def effective_noise_multiplier(self) -> float:
        """Noise std of the sum divided by its ℓ2 sensitivity: σ, or σ/√L with per-tensor clipping."""
        if self.params.clip_mode == "flat":
            return self.params.noise_multiplier
        if self.layout is None:
            raise UserInputError("params.clip_mode: 'per_tensor' needs the model's layout to account (bind the defense first)")
        return self.params.noise_multiplier / math.sqrt(len(self.layout.names))

    def schedule(self, training: TrainingConfig, num_clients: int, rounds: int | None = None) -> GaussianSchedule:
        return GaussianSchedule(self.effective_noise_multiplier(), training.sampling_rate(num_clients),
                                training.rounds if rounds is None else rounds, training.sampling, num_clients)

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> DPFedAvg:
        effective = calibrate_noise(target_epsilon, self.schedule(training, num_clients), delta,
                                    accounting.accountant, accounting.conversion)
        # effective = σ / √L under per-tensor clipping, so σ = effective · √L
        return self.with_params(noise_multiplier=effective * self.params.noise_multiplier / self.effective_noise_multiplier())

    def privacy_claim(self, training, num_clients, rounds, delta, accounting) -> PrivacyClaim:
        schedule = self.schedule(training, num_clients, rounds)
        report = compute_epsilon(schedule, delta, accounting.accountant, accounting.conversion)
        notes = ["client-level: neighbouring datasets differ in one client's data"]
        if self.params.clip_mode == "per_tensor":
            notes.append(f"per-tensor clipping: sensitivity S√L with L={len(self.layout.names)} tensors, "
                         f"accounted with noise multiplier σ/√L = {schedule.noise_multiplier:.4g}")
        if self.observes == "uploads":
            per_upload = self.params.noise_multiplier / math.sqrt(max(1.0, training.sampling_rate(num_clients) * num_clients))
            notes.append(f"the server sees each noisy upload, whose own noise multiplier is only about "
                         f"σ/√|P_t| ≈ {per_upload:.3g}: single-upload attacks are outside the guarantee")
        if self.params.denominator == "realized" and training.sampling == "poisson" and training.client_rate < 1:
            notes.append("the mean divides by the realized |P_t|, which the sampled-Gaussian analysis does not strictly cover")
        notes.extend(self.claim_notes())
        return PrivacyClaim(report.epsilon, delta, "client", report.label, schedule.describe(), "; ".join(notes))

    def claim_notes(self) -> list[str]:
        """Caveats specific to a variant (e.g. a data-dependent sparsity pattern)."""
        return []

    def epsilon_trajectory(self, training, num_clients, delta, accounting) -> list[float]:
        schedule = self.schedule(training, num_clients)
        if accounting.accountant == "rdp":
            return [float(e) for e in epsilon_trajectory(schedule, delta, accounting.conversion)]
        return [compute_epsilon(schedule.with_steps(t), delta, "pld").epsilon for t in range(1, training.rounds + 1)]

    # ---------------------------------------------------------------- the privatisation pipeline

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sparsify the raw updates before clipping; returns (updates, kept mask or None)."""
        return updates, None

    def post_noise(self, clipped: torch.Tensor, noisy: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Transform the noisy uploads (e.g. keep only a top-k support)."""
        return noisy

    def clip(self, updates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.params.clip_mode == "flat":
            return clip_rows(updates, self.params.clip)
        return clip_rows_per_tensor(updates, self.params.clip, list(self.layout.slices().values()))

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        sparse, kept = self.pre_clip(updates, ctx)
        clipped, norms, was_clipped = self.clip(sparse)
        diagnostics = {"clip_fraction": float(was_clipped.double().mean()), "clip_input_norms": norms}
        noisy = clipped
        if self.params.noise_placement == "client":
            std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(ctx.participants))
            generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
            noise = gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
            if kept is not None and self.noise_on_kept_only:
                noise = noise * kept
            noisy = clipped + noise
        return self.post_noise(clipped, noisy, ctx), diagnostics

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        total = uploads.sum(0)
        if self.params.noise_placement == "aggregate":
            std = self.params.clip * self.params.noise_multiplier
            total = total + gaussian_rows(1, uploads.shape[1], std, [ctx.server_generator("noise")], uploads.device)[0]
        denominator = (ctx.training.sampling_rate(ctx.num_clients) * ctx.num_clients
                       if self.params.denominator == "expected" else len(ctx.participants))
        return total / denominator
