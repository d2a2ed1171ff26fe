"""BLUR and LUS: Cheng, Wang, Zhang, Cheng, "Differentially Private Federated Learning with Local
Regularization and Sparsification" (CVPR 2022; §4.1–4.2, Alg. 2).

Both make client updates small *before* DP-FedAvg's clip, so less is lost to clipping and the
same noise hurts less. The accounting is DP-FedAvg's, unchanged.

* **BLUR** (Bounded Local Update Regularization, §4.1, Eq. 5/7): the local loss gets the hinge
  penalty (λ/2)·max(0, ‖w − w0‖² − S²), whose gradient λ(w − w0)·1[‖w − w0‖ > S] is added
  explicitly at every local step (w0: the downloaded global model, S: the clip). Lemma 2 needs
  λ·η_l < 1, which :meth:`validate` enforces.
* **LUS** (Local Update Sparsification, §4.2, Eq. 9–15): after local training, each parameter
  tensor keeps the s_j = max(1, round((1 − c)·d_j)) entries with the largest first-order utility
  cost |g ⊙ Δ|, g the gradient of the *unregularised* mean loss over the client's full data at
  the final local model, dropout off (our choice: the paper does not say which data or mode;
  ``lus_gradient: last_batch`` is the cheaper alternative). The mask depends on the data, so
  noise is added to all d coordinates, masked ones included (Alg. 2): uploads stay dense.

λ = 0 and c = 0 give DP-FedAvg bit for bit (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from defenses.base import DEFENSES
from defenses.blocks.local_training import LocalObjective, mean_loss_gradient
from defenses.blocks.sparsify import exact_fraction, kept_per_tensor, per_tensor_top_mask
from defenses.fedavg import DPFedAvg, DPFedAvgAuditHooks, DPFedAvgParams
from defenses.federated.training_job import RoundContext, TrainingConfig

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


class BLURObjective(LocalObjective):
    """Cross-entropy plus the BLUR hinge penalty (Eq. 5), its gradient added explicitly (our choice, not autograd)."""

    def __init__(self, penalty: float, radius: float):
        self.penalty = penalty
        self.radius = radius

    def batched_gradient(self, model, params, anchor, x, y, mask):
        gradients = super().batched_gradient(model, params, anchor, x, y, mask)
        clients = next(iter(params.values())).shape[0]
        squared = sum(((params[n] - anchor[n]) ** 2).reshape(clients, -1).sum(1) for n in params)
        outside = (squared.sqrt() > self.radius).to(squared.dtype)
        return {n: g + self.penalty * outside.view(-1, *([1] * (g.dim() - 1))) * (params[n] - anchor[n])
                for n, g in gradients.items()}

    def module_backward(self, model, anchor, x, y):
        super().module_backward(model, anchor, x, y)
        with torch.no_grad():
            named = list(model.named_parameters())
            distance = torch.sqrt(sum(((p - anchor[n]) ** 2).sum() for n, p in named))
            if distance > self.radius:
                for n, p in named:
                    p.grad += self.penalty * (p - anchor[n])


def lus_mask(updates: torch.Tensor, ctx: RoundContext, sparsity: float, source: str) -> torch.Tensor:
    """LUS's per-tensor mask: top-s_j of |g ⊙ Δ| with g at the final local model w0 + Δ (Eq. 9–15)."""
    layout = ctx.layout
    keep = kept_per_tensor(layout, 1 - exact_fraction(sparsity), "nearest")  # exact: s_j = round((1 − c)·d_j)
    mask = torch.zeros_like(updates, dtype=torch.bool)
    for chunk in ctx.chunks():
        final = ctx.global_vector[None, :] + updates[chunk]
        stacked = {n: final[:, part].reshape(len(chunk), *shape)
                   for (n, part), shape in zip(layout.slices().items(), layout.shapes)}
        if source == "full":
            records = [ctx.client_data[i] for i in chunk]
        else:  # the last local mini-batch of each client
            records = []
            for i in chunk:
                last = ctx.schedule.steps[i] - 1
                records.append(ctx.schedule.indices[i, last][ctx.schedule.mask[i, last] > 0].numpy().astype(np.int64))
        gradient = layout.flatten_stacked(mean_loss_gradient(ctx.model, stacked, records, ctx.pool_x, ctx.pool_y))
        mask[chunk] = per_tensor_top_mask((gradient * updates[chunk]).abs(), layout, keep)
    return mask


@dataclass(frozen=True)
class BLURParams(DPFedAvgParams):
    blur_lambda: float = field(default=0.4, metadata={"min": 0.0, "help": "λ of the BLUR penalty (paper default 0.4)"})


@dataclass(frozen=True)
class LUSParams(DPFedAvgParams):
    lus_sparsity: float = field(default=0.7, metadata={"min": 0.0, "max": 1.0, "max_exclusive": True,
                                                       "help": "c: share of each tensor's entries zeroed (paper default 0.7)"})
    lus_gradient: Literal["full", "last_batch"] = field(
        default="full", metadata={"help": "g of |g⊙Δ|: full local data (our choice) or the last local batch"})


@dataclass(frozen=True)
class BLURLUSParams(LUSParams):
    blur_lambda: float = field(default=0.4, metadata={"min": 0.0, "help": "λ of the BLUR penalty (paper default 0.4)"})


class _BLURMixin:
    def local_objective(self) -> LocalObjective:
        return BLURObjective(self.params.blur_lambda, self.params.clip)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        super().validate(training, num_clients)
        if self.params.blur_lambda * training.lr >= 1.0:
            raise UserInputError(f"params.blur_lambda: λ·lr must be < 1 (Lemma 2), got "
                                 f"{self.params.blur_lambda}·{training.lr} = {self.params.blur_lambda * training.lr:g}")


class _LUSMixin:
    def audit_hooks(self) -> DPFedAvgAuditHooks:
        # no canary clients: LUS's mask needs each client's data (its gradient at the final local model)
        return DPFedAvgAuditHooks(self, update_canaries=False)

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        kept = lus_mask(updates, ctx, self.params.lus_sparsity, self.params.lus_gradient)
        return updates * kept, kept  # noise still goes on every coordinate (noise_on_kept_only = False)


@DEFENSES.register
class DPFedAvgBLUR(_BLURMixin, DPFedAvg):
    name = "dp-fedavg-blur"
    summary = "DP-FedAvg with BLUR: hinge penalty keeping local models within the clip radius"
    reference = "Cheng et al. 2022, DP Federated Learning with Local Regularization and Sparsification (§4.1)"
    Params = BLURParams


@DEFENSES.register("dp-fedavg-lus")
class DPFedAvgLUS(_LUSMixin, DPFedAvg):
    name = "dp-fedavg-lus"
    summary = "DP-FedAvg with LUS: per-tensor top-(1−c) of |g⊙Δ| before clipping, dense noise"
    reference = "Cheng et al. 2022, DP Federated Learning with Local Regularization and Sparsification (§4.2)"
    Params = LUSParams


@DEFENSES.register
class DPFedAvgBLURLUS(_BLURMixin, _LUSMixin, DPFedAvg):
    name = "dp-fedavg-blur-lus"
    summary = "DP-FedAvg with BLUR and LUS (the paper's method, Alg. 2)"
    reference = "Cheng et al. 2022, DP Federated Learning with Local Regularization and Sparsification (Alg. 2)"
    Params = BLURLUSParams
