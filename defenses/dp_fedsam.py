"""DP-FedSAM and DP-FedSAM-top_k: Shi, Wei, Shen, Liu, Wang, Yuan, Tao, "Towards the Flatter
Landscape and Better Generalization in Federated Learning under Client-level Differential
Privacy" (arXiv 2305.00873; Def. 5, Eq. 7–12), and non-private FedSAM as the ceiling.

Each local step is sharpness-aware (SAM, Foret et al. 2021; Eq. 7–9): on one batch ξ,

    g = ∇F(w; ξ);   e = ρ·g/‖g‖₂;   g̃ = ∇F(w + e; ξ);   w ← w − η·g̃,

with ‖·‖ over all parameters. ``sam_variant: asam`` is the adaptive SAM of the public code
(Kwon et al. 2021): e = ρ·(w⊙w⊙g)/‖|w|⊙g‖. Flatter local models give smaller updates, so less is
lost to clipping. Clip and noise are DP-FedAvg's (Eq. 10–11), so is the accounting.

DP-FedSAM-top_k (Def. 5, Eq. 12) keeps, per tensor, the ⌈p·d_l⌉ largest-magnitude entries.
The paper masks the *noisy* upload, Δ̃ = M ⊙ (clip(Δ) + N(0, σ²C²/m)), so noise survives only on
kept coordinates — and a coordinate kept by one client carries only that client's share σ²C²/m
of the noise the accountant assumes in the sum. ``mask_stage`` chooses:

* ``before_noise`` (default, sound): Δ̃ = clip(M ⊙ Δ) + N(0, σ²C²/m) on every coordinate, M from
  the clean update — sparsification is pre-processing of the client's data (as LUS does), the
  sum carries N(0, σ²C²) everywhere and DP-FedAvg's accounting holds with σ;
* ``after_noise`` (the paper's Eq. 12): with ``topk_source: noisy`` M comes from the noisy upload,
  so each upload is post-processing of a Gaussian mechanism with σ/√m and the sum is no more
  private than one upload — accounted with σ/√m_max; with ``topk_source: clean`` (our
  reading of the paper) the released support depends on the clean update: no finite claim.

Reductions (tests): ρ = 0 gives DP-FedAvg bit for bit; p = 1 gives DP-FedSAM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from audit.core.lazy_modules import lazy_module
from defenses.base import DEFENSES, NO_STATE, Defense, PrivacyClaim
from defenses.blocks.local_training import LocalObjective, Params
from defenses.blocks.sparsify import kept_per_tensor, per_tensor_top_mask
from defenses.fedavg import DPFedAvg, DPFedAvgParams, NoiseSupport
from defenses.federated.training_job import RoundContext

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")

SAM_VARIANTS = ("sam", "asam")
_NORM_GUARD = 1e-12  # as in the paper's code: e = ρ·g/(‖g‖ + 1e-12)


def sam_perturbation(params: Params, gradients: Params, rho: float, variant: str) -> Params:
    """e for stacked clients [C, *shape]: ρ·g/‖g‖ (SAM) or ρ·w²g/‖|w|g‖ (ASAM), norms per client."""
    clients = next(iter(params.values())).shape[0]
    direction = gradients if variant == "sam" else {n: params[n].abs() * gradients[n] for n in params}
    norm = torch.sqrt(sum((direction[n] ** 2).reshape(clients, -1).sum(1) for n in params)) + _NORM_GUARD
    scale = rho / norm
    if variant == "sam":
        return {n: scale.view(-1, *([1] * (g.dim() - 1))) * g for n, g in gradients.items()}
    return {n: scale.view(-1, *([1] * (g.dim() - 1))) * params[n].abs() * direction[n] for n, g in gradients.items()}


class SAMObjective(LocalObjective):
    """The SAM/ASAM gradient g̃ = ∇F(w + e; ξ) on the same batch for both passes."""

    def __init__(self, rho: float, variant: str):
        self.rho = rho
        self.variant = variant

    def batched_gradient(self, model, params, anchor, x, y, mask):
        gradients = super().batched_gradient(model, params, anchor, x, y, mask)
        perturbation = sam_perturbation(params, gradients, self.rho, self.variant)
        return super().batched_gradient(model, {n: params[n] + perturbation[n] for n in params}, anchor, x, y, mask)

    def module_backward(self, model, anchor, x, y):
        named = list(model.named_parameters())
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            stacked = {n: p.detach()[None] for n, p in named}
            gradients = {n: p.grad[None] for n, p in named}
            perturbation = {n: e[0] for n, e in sam_perturbation(stacked, gradients, self.rho, self.variant).items()}
            for n, p in named:
                p.add_(perturbation[n])
                p.grad = None
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():  # restore the weights before the optimiser's base step
            for n, p in named:
                p.sub_(perturbation[n])


@dataclass(frozen=True)
class FedSAMParams:
    rho: float = field(default=0.5, metadata={"min": 0.0, "help": "SAM radius ρ (0.5 is the public code's ASAM-scale value)"})
    sam_variant: Literal["sam", "asam"] = field(default="sam", metadata={"help": "sam (paper) or asam (public code)"})


@DEFENSES.register
class FedSAM(Defense):
    """FedAvg with SAM local steps, no privacy (our addition: the non-private ceiling)."""

    name = "fedsam"
    summary = "FedAvg with sharpness-aware local steps, no privacy"
    reference = "Shi et al. 2023 (non-private FedSAM ceiling); Foret et al. 2021 (SAM)"
    Params = FedSAMParams

    def local_objective(self) -> LocalObjective:
        return SAMObjective(self.params.rho, self.params.sam_variant)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        return PrivacyClaim.non_private("non-private: SAM local steps, no clipping, no noise")


@dataclass(frozen=True)
class DPFedSAMParams(DPFedAvgParams):
    rho: float = field(default=0.5, metadata={"min": 0.0, "help": "SAM radius ρ (0 gives DP-FedAvg)"})
    sam_variant: Literal["sam", "asam"] = field(default="sam", metadata={"help": "sam (paper) or asam (public code)"})


@DEFENSES.register
class DPFedSAM(DPFedAvg):
    name = "dp-fedsam"
    summary = "DP-FedAvg with sharpness-aware (SAM/ASAM) local steps"
    reference = "Shi et al. 2023, Towards the Flatter Landscape ... under Client-level DP (Eq. 7–11)"
    Params = DPFedSAMParams

    def local_objective(self) -> LocalObjective:
        return SAMObjective(self.params.rho, self.params.sam_variant)


@dataclass(frozen=True)
class DPFedSAMTopKParams(DPFedSAMParams):
    topk_fraction: float = field(default=0.4, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                        "help": "p: kept share of each tensor (1 gives DP-FedSAM)"})
    mask_stage: Literal["before_noise", "after_noise"] = field(
        default="before_noise", metadata={"help": "before_noise: mask the clipped update, dense noise (sound with σ); "
                                                  "after_noise: mask the noisy upload, the paper's Eq. 12 (see the claim)"})
    topk_source: Literal["clean", "noisy"] = field(
        default="clean", metadata={"help": "after_noise only: mask from the clean clipped update (no finite claim) or the "
                                           "noisy one (post-processing, accounted with σ/√m)"})


@DEFENSES.register
class DPFedSAMTopK(DPFedSAM):
    name = "dp-fedsam-topk"
    summary = "DP-FedSAM whose noisy uploads keep only each tensor's top-⌈p·d⌉ coordinates"
    reference = "Shi et al. 2023, Towards the Flatter Landscape ... under Client-level DP (Def. 5, Eq. 12)"
    Params = DPFedSAMTopKParams
    #: each tensor's top-⌈p·d_l⌉ (≥ 1) of a one-coordinate update is the update itself (before the
    #: noise; a mask chosen after it is not alike: ``noise_support().kept_only``)
    canaries_alike: ClassVar[bool] = True

    def keep(self, ctx: RoundContext) -> list[int]:
        return kept_per_tensor(ctx.layout, self.params.topk_fraction, "ceil")

    def noise_support(self) -> NoiseSupport:
        if self.params.mask_stage != "after_noise":
            return NoiseSupport()
        if self.params.topk_source == "clean":
            return NoiseSupport.kept("the top-k support is chosen on the clean update and released with the noisy one: "
                                     "its zero pattern reveals the client's data")
        return NoiseSupport.kept()

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.noise_support().kept_only:
            return updates, None
        # clipping scales a row (or each tensor) uniformly, so the top-k of |Δ| is the top-k of |clip(Δ)|
        mask = per_tensor_top_mask(updates.abs(), ctx.layout, self.keep(ctx))
        return updates * mask, mask

    def post_noise(self, clipped: torch.Tensor, noisy: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if not self.noise_support().kept_only:
            return noisy
        source = clipped if self.params.topk_source == "clean" else noisy
        return noisy * per_tensor_top_mask(source.abs(), ctx.layout, self.keep(ctx))
