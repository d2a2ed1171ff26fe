"""FL-CS(-DP), the compressive-sensing baseline of Kerkouche, Ács, Castelluccia, Genevès,
"Constrained Differentially Private Federated Learning for Low-bandwidth Devices" (UAI 2021;
§4), from Kerkouche et al. 2021 "Compression boosts DP FL", in a form of our choosing — the paper
gives only a sketch, and the original paper was not available offline to check the operator or
the solver.

Per chunk of 10⁴ coordinates, m = ⌊r·b⌋ rows of the orthonormal DCT-II chosen by a per-round
shared seed compress the update, y = A·Δ (``partial_dct.py``; linear, so secure aggregation
works); FL-CS-DP clips y to S and adds N(0, (Sσ)²/|𝕂|) per client; the server reconstructs
Δ̂ = argmin ½‖A x − ȳ‖² + λ‖x‖₁ with FISTA from the mean ȳ, which is post-processing of the
released statistic. The full model goes down; the rest of the round is ``subset_training.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.base import DEFENSES
from defenses.blocks.clipping import clip_rows
from defenses.blocks.noise import gaussian_rows
from defenses.blocks.partial_dct import PartialDCT
from defenses.blocks.sparsify import exact_count
from defenses.federated.training_job import RoundContext, TrainingConfig
from defenses.subset_training import SubsetAuditHooks, SubsetFL, SubsetParams, SubsetState, masked_public_update, run_clip

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class FLCSParams(SubsetParams):
    chunk: int = field(default=10_000, metadata={"min": 16, "help": "coordinates per compressed chunk"})
    solver_iterations: int = field(default=50, metadata={"min": 1, "help": "FISTA iterations of the server's reconstruction"})
    sparsity_weight: float = field(default=0.05, metadata={"min": 0.0, "help": "λ relative to max|Aᵀȳ| in the ℓ1 reconstruction"})


@dataclass(frozen=True)
class FLCSDPParams(FLCSParams):
    clip: float = field(default=0.0,
                        metadata={"min": 0.0, "help": "S on the compressed update (0: calibrate on the public batch)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True, "help": "σ"})


class _CS(SubsetFL):
    downstream_full = True

    def sketch(self, ctx: RoundContext) -> PartialDCT:
        return PartialDCT(ctx.layout.dim, self.params.chunk, self.params.keep_fraction, ctx.server_generator("sketch"))

    def upload_floats(self, dim: int) -> int:
        return sum(exact_count(self.params.keep_fraction, min(self.params.chunk, dim - s), "floor")
                   for s in range(0, dim, self.params.chunk))

    def calibrated_clip(self, job, model, initial, state: SubsetState, mask: torch.Tensor | None) -> float:
        """S on the compressed update: the norm of the sketched public round's update."""
        dim = sum(p.numel() for p in initial.values())
        full = torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
        update = masked_public_update(model, initial, full, state.public_x, state.public_y, job.training, job.seed)
        sketch = PartialDCT(dim, self.params.chunk, self.params.keep_fraction, torch_generator(job.seed, "cs-calibration"))
        return float(np.linalg.norm(sketch.compress(update.double().cpu().numpy()[None, :])))

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        measured = torch.as_tensor(self.sketch(ctx).compress(updates.double().cpu().numpy()), device=updates.device)
        diagnostics = {**self.bandwidth(updates.shape[1]), "clip_input_norms": torch.linalg.vector_norm(measured, dim=1)}
        if not self.private:
            return measured, diagnostics
        clip = run_clip(ctx)
        clipped, _, was_clipped = clip_rows(measured, clip)
        std = clip * self.params.noise_multiplier / math.sqrt(len(ctx.participants))
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noisy = clipped + gaussian_rows(len(ctx.participants), measured.shape[1], std, generators, updates.device).double()
        diagnostics.update(clip_fraction=float(was_clipped.double().mean()), clip=clip)
        return noisy, diagnostics

    def compressed_mean(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """The mean of the (noisy) compressed uploads; the ℓ1 reconstruction is post-processing of it."""
        return uploads.sum(0) / len(ctx.participants)

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        mean = self.compressed_mean(uploads, ctx).cpu().numpy()
        estimate = self.sketch(ctx).reconstruct(mean, self.params.solver_iterations, self.params.sparsity_weight)
        return torch.as_tensor(estimate, dtype=ctx.global_vector.dtype, device=ctx.global_vector.device)

    def audit_hooks(self) -> CompressedAuditHooks:
        return CompressedAuditHooks(self)


class CompressedAuditHooks(SubsetAuditHooks):
    """The released statistic is the mean of the compressed uploads (:meth:`_CS.compressed_mean`)."""

    defense: _CS

    def release_statistic(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return self.defense.compressed_mean(uploads, ctx)

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """A client uploads m ≪ d measurements of its update (a partial DCT), not one value per
        coordinate: a one-coordinate canary spreads over every measurement, and the server's ℓ1
        reconstruction is not a sum of the uploads, so no canary coordinate can be read alone."""
        return ("its uploads are compressed measurements (partial DCT) reconstructed by ℓ1 at the server, not one value "
                "per coordinate summed: a Dirac canary cannot be read alone (the dense client-canaries audit applies)")


@DEFENSES.register
class FLCS(_CS):
    name = "fl-cs"
    summary = "Compressive sensing of updates (partial DCT up, ℓ1 reconstruction at the server; non-private)"
    reference = "Kerkouche et al. 2021, Compression Boosts Differentially Private Federated Learning (our form of its sketch)"
    Params = FLCSParams


@DEFENSES.register("fl-cs-dp")
class FLCSDP(_CS):
    name = "fl-cs-dp"
    summary = "FL-CS with the compressed update clipped and noised under secure aggregation"
    reference = "Kerkouche et al. 2021, Compression Boosts Differentially Private Federated Learning (our form of its sketch)"
    Params = FLCSDPParams
    private = True
