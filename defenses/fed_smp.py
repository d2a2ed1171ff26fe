"""Fed-SMP: Hu, Guo, Gong, "Federated Learning with Sparsified Model Perturbation" (2022), the
rand_k and top_k baselines of paper 002 (spec 002 §2.3, as the spec proposes them).

Each client sparsifies its update to k = ⌈p·d⌉ coordinates (over the whole model), clips the
sparse update, and adds Gaussian noise on the kept coordinates only:

    M_i = rand_k (fresh per client and round) or top_k(|Δ_i|);   upload_i = M_i ⊙ (clip(M_i ⊙ Δ_i) + N(0, σ²C²/m))

The accounting is DP-FedAvg's with no amplification from sparsification (spec 002 §2.3 [PROP]).
A rand_k mask is independent of the data; a top_k mask is not, and the claim notes say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from defenses.base import DEFENSES
from defenses.engine import RoundContext
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.sparsify import random_mask, top_rows


@dataclass(frozen=True)
class FedSMPParams(DPFedAvgParams):
    keep_fraction: float = field(default=0.4, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                        "help": "p: share of the d coordinates each upload keeps (k = ⌈p·d⌉)"})


class _FedSMP(DPFedAvg):
    Params = FedSMPParams
    noise_on_kept_only: ClassVar[bool] = True

    def kept(self, dim: int) -> int:
        return min(dim, max(1, math.ceil(self.params.keep_fraction * dim - 1e-12)))


@DEFENSES.register("fed-smp-randk")
class FedSMPRandK(_FedSMP):
    name = "fed-smp-randk"
    summary = "Fed-SMP: random-k sparsified update, clipped, noise on the kept coordinates"
    reference = "Hu, Guo, Gong 2022, Federated Learning with Sparsified Model Perturbation (rand_k)"

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        generators = [ctx.client_generator(int(c), "mask") for c in ctx.participants]
        mask = random_mask(updates.shape[0], updates.shape[1], self.kept(updates.shape[1]), generators, updates.device)
        return updates * mask, mask


@DEFENSES.register("fed-smp-topk")
class FedSMPTopK(_FedSMP):
    name = "fed-smp-topk"
    summary = "Fed-SMP: top-k (magnitude) sparsified update, clipped, noise on the kept coordinates"
    reference = "Hu, Guo, Gong 2022, Federated Learning with Sparsified Model Perturbation (top_k)"

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        mask = top_rows(updates.abs(), self.kept(updates.shape[1]))
        return updates * mask, mask

    def claim_notes(self) -> list[str]:
        return ["the top-k support depends on the client's data and is released with the upload: "
                "not covered by the DP analysis"]
