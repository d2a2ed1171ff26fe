"""Constrained DP federated learning for low-bandwidth devices: Kerkouche, Ács, Castelluccia,
Genevès, "Constrained Differentially Private Federated Learning for Low-bandwidth Devices"
(UAI 2021; §3) — FL-TOP(-DP), the paper's algorithm.

* **FL-TOP** (Alg. 1, 2): before training the server runs T_init SGD steps on a small public
  batch and keeps the K = ⌊r·n⌋ coordinates with the largest accumulated |gradient| (§3.1, §4).
  Clients train only those K weights (Top_k-SGD: the others stay at w0 bit for bit) and
  exchange only K values each way. **FL-TOP-DP** (Alg. 3): each client clips its K-dim update to
  S and adds N(0, (Sσ)²/|𝕂|); secure aggregation gives the server only the sum (§3.2.2). The clip
  S is calibrated on the public batch: one server-side round, S = ‖(w − w0)[𝕋]‖₂ (§4). Optional
  ``topk_selection: private`` (our form of the alternative in §3.2.3) chooses 𝕋 from the clients'
  noisy local top-K indicators in one extra round instead of public data, and accounts for that
  round.

The baselines the paper compares it with, one file each: FL-BASIC(-DP) (§4, a fresh random
K-subset per round) in ``fl_basic.py``, FL-STD(-DP) (FedAvg, the full model each way) in
``fl_std.py``, FL-CS(-DP) (§4, compressive sensing of the update) in ``fl_cs.py``. The blocks
they share: ``subset_training.py`` (Top_k-SGD, the round with clip and noise under secure
aggregation, the bandwidth of §4.1 and the accounting), ``top_k_selection.py`` (how 𝕋 is chosen,
§3.1, §4 and §3.2.3) and ``partial_dct.py`` (FL-CS's sketch and its ℓ1 reconstruction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from audit.core.lazy_modules import lazy_module
from defenses.base import DEFENSES
from defenses.blocks.top_k_selection import private_top_k, select_top_k
from defenses.federated.training_job import RoundContext
from defenses.subset_training import (
    SubsetDPParams,
    SubsetFL,
    SubsetParams,
    kept_count,
    masked_public_update,
)

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class FLTopParams(SubsetParams):
    init_steps: int = field(default=10, metadata={"min": 1, "help": "T_init: SGD steps on the public batch"})
    topk_score: Literal["abs_gradient", "change"] = field(default="abs_gradient",
                                                          metadata={"help": "Σ|g| (default) or |w_T − w0|"})


@dataclass(frozen=True)
class FLTopDPParams(SubsetDPParams):
    init_steps: int = field(default=10, metadata={"min": 1, "help": "T_init: SGD steps on the public batch"})
    topk_score: Literal["abs_gradient", "change"] = field(default="abs_gradient",
                                                          metadata={"help": "Σ|g| (default) or |w_T − w0|"})
    topk_selection: Literal["public", "private"] = field(
        default="public", metadata={"help": "choose the Top-K on public data, or from the clients' noisy local top-K (§3.2.3)"})


class _TopK(SubsetFL):
    def prepare(self, job, model=None, initial=None) -> None:
        super().prepare(job, model, initial)
        dim = sum(p.numel() for p in initial.values())
        keep = kept_count(self.params.keep_fraction, dim)
        if getattr(self.params, "topk_selection", "public") == "private":
            indices = self._private_selection(job, model, initial, keep)
        else:
            x, y = self._public
            indices = select_top_k(model, initial, x, y, self.params.init_steps, job.training.lr, keep, self.params.topk_score)
        self._mask = torch.zeros(dim, dtype=torch.bool, device=job.pool_x.device)
        self._mask[indices.to(self._mask.device)] = True
        if self.private and not self.params.clip:
            update = masked_public_update(model, initial, self._mask, *self._public, job.training, job.seed)
            self._clip = float(torch.linalg.vector_norm(update.double()))

    def _private_selection(self, job, model, initial, keep: int) -> torch.Tensor:
        """§3.2.3 (:func:`private_top_k`), with S calibrated first unless it is given."""
        dim = sum(p.numel() for p in initial.values())
        if not self.params.clip:  # calibrate S on the public batch with every coordinate trainable
            full = torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
            self._clip = float(torch.linalg.vector_norm(masked_public_update(model, initial, full, *self._public,
                                                                            job.training, job.seed).double()))
        return private_top_k(job, model, initial, keep, self._clip, self.params.noise_multiplier)

    @property
    def extra_rounds(self) -> int:  # type: ignore[override]
        return 1 if getattr(self.params, "topk_selection", "public") == "private" else 0

    def trainable(self, ctx: RoundContext) -> torch.Tensor:
        return self._mask


@DEFENSES.register("fl-top")
class FLTop(_TopK):
    name = "fl-top"
    summary = "Clients train and exchange only a Top-K set of coordinates chosen on public data (non-private)"
    reference = "Kerkouche et al. 2021, Constrained Differentially Private FL for Low-bandwidth Devices (Alg. 1, 2)"
    Params = FLTopParams


@DEFENSES.register("fl-top-dp")
class FLTopDP(_TopK):
    name = "fl-top-dp"
    summary = "FL-TOP with client clipping and noise Sσ/√|𝕂| under secure aggregation (client-level DP)"
    reference = "Kerkouche et al. 2021, Constrained Differentially Private FL for Low-bandwidth Devices (Alg. 3)"
    Params = FLTopDPParams
    private = True
