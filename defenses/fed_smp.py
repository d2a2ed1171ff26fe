"""Fed-SMP: Hu, Guo, Gong, "Federated Learning with Sparsified Model Perturbation" (2022), the
rand_k and top_k baselines of Shi et al. 2023 (§6.1; the paper gives no details, so these are
our reading).

Each client sparsifies its update to k = ⌈p·d⌉ coordinates (over the whole model), clips the
sparse update and adds Gaussian noise:

    M_i = rand_k (fresh per client and round) or top_k(|Δ_i|);   upload_i = clip(M_i ⊙ Δ_i) + noise_i

``noise_support`` says where noise_i goes:

* ``dense`` (default, sound): N(0, σ²C²/m) on every coordinate, so the sum carries N(0, σ²C²)
  everywhere and the sparsification is pre-processing of the client's data — DP-FedAvg's
  accounting holds with σ; the uploads are dense;
* ``kept`` (the paper's variant): N(0, σ²C²/m) on the kept coordinates only, uploads stay sparse.
  A coordinate kept by k_j of the m clients then carries k_j·σ²C²/m in the sum — a coordinate
  kept by the target alone only σ²C²/m — so the claim is accounted with σ/√m_max (rand_k, whose
  mask does not depend on the data), and top_k makes no finite claim at all: its support depends
  on the client's data and is released with the upload (zero vs non-zero coordinates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from audit.core.lazy_modules import lazy_module
from defenses.base import DEFENSES
from defenses.blocks.sparsify import exact_count, random_mask, top_rows
from defenses.fedavg import DPFedAvg, DPFedAvgParams, NoiseSupport
from defenses.federated.training_job import RoundContext

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class FedSMPParams(DPFedAvgParams):
    keep_fraction: float = field(default=0.4, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                        "help": "p: share of the d coordinates each upload keeps (k = ⌈p·d⌉)"})
    noise_support: Literal["dense", "kept"] = field(
        default="dense", metadata={"help": "dense: noise on every coordinate (sound with σ); kept: only on the kept "
                                           "coordinates, as the paper (accounted with σ/√m, no finite claim for top_k)"})


class _FedSMP(DPFedAvg):
    Params = FedSMPParams

    def kept(self, dim: int) -> int:
        return exact_count(self.params.keep_fraction, dim, "ceil")

    def noise_support(self) -> NoiseSupport:
        return NoiseSupport.kept() if self.params.noise_support == "kept" else NoiseSupport()


@DEFENSES.register
class FedSMPRandK(_FedSMP):
    name = "fed-smp-randk"
    summary = "Fed-SMP: random-k sparsified update, clipped, Gaussian noise (dense, or on the kept coordinates)"
    reference = "Hu, Guo, Gong 2022, Federated Learning with Sparsified Model Perturbation (rand_k)"

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        generators = [ctx.client_generator(int(c), "mask") for c in ctx.participants]
        mask = random_mask(updates.shape[0], updates.shape[1], self.kept(updates.shape[1]), generators, updates.device)
        return updates * mask, mask


@DEFENSES.register("fed-smp-topk")
class FedSMPTopK(_FedSMP):
    name = "fed-smp-topk"
    summary = "Fed-SMP: top-k (magnitude) sparsified update, clipped, Gaussian noise (dense, or on the kept coordinates)"
    reference = "Hu, Guo, Gong 2022, Federated Learning with Sparsified Model Perturbation (top_k)"
    #: the top-k of a one-coordinate update (k ≥ 1) is the update itself, whichever its coordinate
    canaries_alike: ClassVar[bool] = True

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        mask = top_rows(updates.abs(), self.kept(updates.shape[1]))
        return updates * mask, mask

    def noise_support(self) -> NoiseSupport:
        if self.params.noise_support == "kept":
            return NoiseSupport.kept("noise only on the top-k coordinates: the support depends on the client's data and is "
                                     "released with the upload (and in the sum's zero pattern)")
        return NoiseSupport()


__all__ = ["FedSMPParams", "FedSMPRandK", "FedSMPTopK"]
