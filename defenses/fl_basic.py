"""FL-BASIC(-DP), the random-subset baseline of Kerkouche, Ács, Castelluccia, Genevès,
"Constrained Differentially Private Federated Learning for Low-bandwidth Devices" (UAI 2021;
§4), on the frame of ``subset_training.py``.

Each round the server draws a fresh random K-subset (K = ⌊r·n⌋), shared by all clients; clients
train only those coordinates, the others stay at the previous global model. The full model goes
down, K values go up. FL-BASIC-DP clips and noises the K-dim update as FL-TOP-DP does (Alg. 3,
under secure aggregation), with S the median over 100 random subsets of the public round's
update norm (§4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.base import DEFENSES
from defenses.federated.training_job import RoundContext
from defenses.subset_training import (
    SubsetDPParams,
    SubsetFL,
    SubsetParams,
    SubsetState,
    kept_count,
    masked_public_update,
)

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class FLBasicDPParams(SubsetDPParams):
    calibration_subsets: int = field(default=100, metadata={"min": 1, "help": "random subsets for the median clip (§4)"})


class _Basic(SubsetFL):
    downstream_full = True

    def trainable(self, ctx: RoundContext) -> torch.Tensor:
        dim = ctx.layout.dim
        order = torch.randperm(dim, generator=ctx.server_generator("random-subset"))
        mask = torch.zeros(dim, dtype=torch.bool)
        mask[order[:kept_count(self.params.keep_fraction, dim)]] = True
        return mask.to(ctx.global_vector.device)

    def calibrated_clip(self, job, model, initial, state: SubsetState, mask: torch.Tensor | None) -> float:
        """S: the median over random K-subsets of the public round's update norm (§4)."""
        dim = sum(p.numel() for p in initial.values())
        keep = kept_count(self.params.keep_fraction, dim)
        norms = []
        for k in range(self.params.calibration_subsets):
            order = torch.randperm(dim, generator=torch_generator(job.seed, "basic-calibration", k))
            subset = torch.zeros(dim, dtype=torch.bool)
            subset[order[:keep]] = True
            update = masked_public_update(model, initial, subset.to(job.pool_x.device), state.public_x, state.public_y,
                                          job.training, job.seed)
            norms.append(float(torch.linalg.vector_norm(update.double())))
        return float(np.median(norms))


@DEFENSES.register
class FLBasic(_Basic):
    name = "fl-basic"
    summary = "Clients train and upload a fresh random K-subset each round; the full model goes down (non-private)"
    reference = "Kerkouche et al. 2021 (§4 baseline FL-BASIC)"
    Params = SubsetParams


@DEFENSES.register("fl-basic-dp")
class FLBasicDP(_Basic):
    name = "fl-basic-dp"
    summary = "FL-BASIC with clipping and noise under secure aggregation"
    reference = "Kerkouche et al. 2021 (§4 baseline FL-BASIC-DP)"
    Params = FLBasicDPParams
    private = True
