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
from defenses.subset_training import (
    SubsetDPParams,
    SubsetFL,
    SubsetParams,
    SubsetState,
    kept_count,
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
    def trainable_mask(self, job, model, initial, state: SubsetState) -> tuple[torch.Tensor, None]:
        """𝕋 for the whole run: the top-K coordinates on the run's public batch (§3.1), or chosen
        privately (§3.2.3); the clip is then calibrated with 𝕋 (:meth:`SubsetFL.calibrated_clip`)."""
        dim = sum(p.numel() for p in initial.values())
        keep = kept_count(self.params.keep_fraction, dim)
        if getattr(self.params, "topk_selection", "public") == "private":
            indices = self._private_selection(job, model, initial, keep, state)
        else:
            indices = select_top_k(model, initial, state.public_x, state.public_y, self.params.init_steps, job.training.lr, keep,
                                   self.params.topk_score)
        mask = torch.zeros(dim, dtype=torch.bool, device=job.pool_x.device)
        mask[indices.to(mask.device)] = True
        return mask, None

    def _private_selection(self, job, model, initial, keep: int, state: SubsetState) -> torch.Tensor:
        """§3.2.3 (:func:`private_top_k`), with S calibrated first (every coordinate trainable) unless it is given."""
        clip = state.clip or self.calibrated_clip(job, model, initial, state, None)
        return private_top_k(job, model, initial, keep, clip, self.params.noise_multiplier)

    @property
    def extra_rounds(self) -> int:  # type: ignore[override]
        return 1 if getattr(self.params, "topk_selection", "public") == "private" else 0


@DEFENSES.register
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
