"""What an honest-but-curious server sees of one client upload, defense by defense.

The run attacks that replay uploads (gradient inversion, property inference) need the
defense's privatisation of a single upload. It is replayed exactly for the defenses listed in
:data:`REPLAYED`:

* FedAvg / FedSAM: the upload as it is;
* DP-FedAvg: ℓ2 clip to S — of the whole flat upload (``clip_mode: flat``), or of every
  parameter tensor separately (``per_tensor``, as :meth:`defenses.fedavg.DPFedAvg.clip` does;
  the replay calls the same :func:`defenses.blocks.clipping.clip_rows_per_tensor`) — then Gaussian noise.
  With client-side noise each upload carries noise std S·σ/√m (m the expected participants; the
  same S·σ in either clip mode, as :meth:`~defenses.fedavg.DPFedAvg.privatize` draws it) and the
  server sees it alone; with the noise on the aggregate, or secure aggregation, the server sees
  only the sum of the m uploads with total noise S·σ — equivalently each upload's share S·σ/√m,
  summed (m independent N(0, S²σ²/m) add up to N(0, S²σ²)).

An attack on the aggregate must attack the sum: the target's upload plus m − 1 others
(:attr:`UploadView.clients`), not the target's upload alone — that is what the server has.

Other defenses privatise differently (sparsification, per-example DP-SGD, LDP perturbation,
votes); replaying them approximately would attack an upload the defense never sends, so the
attacks report themselves as not run there, with this module's reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observation
from defenses.blocks.clipping import clip_rows, clip_rows_per_tensor, tensor_slices

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: defense name → how its uploads are privatised
REPLAYED = {"fedavg": "plain", "fedsam": "plain", "dp-fedavg": "gaussian"}

CLIP_MODES = ("flat", "per_tensor")


@dataclass(frozen=True)
class UploadView:
    clip: float | None  # ℓ2 clip S of each upload (None: not clipped)
    noise: float  # each upload's Gaussian noise std, in units of the clip
    clients: int  # uploads the server sees summed (1: each upload on its own)
    clip_mode: str = "flat"  # "flat": one ℓ2 clip of the whole upload; "per_tensor": each parameter tensor to ≤ S
    #: the sizes of the defense's parameter tensors (per-tensor clipping with a bound defense: a check
    #: that the replayed upload holds the same tensors; None: not checked)
    tensors: tuple[int, ...] | None = None
    summed_by: str = ""  # why the server sees only the sum ("secure aggregation", …); "" when it sees each upload

    def __post_init__(self) -> None:
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode must be one of {', '.join(CLIP_MODES)}, got {self.clip_mode!r}")

    @property
    def observed_noise(self) -> float:
        """Noise std per coordinate of what the server sees, in the upload's units: one upload's
        S·σ/√m, or the sum of ``clients`` independent shares, S·σ/√m·√m = S·σ."""
        if self.clip is None:
            return 0.0
        return self.noise * self.clip * math.sqrt(self.clients)

    def clip_rows(self, rows: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Clip each row of a C×d matrix of flat uploads as the defense does. ``sizes``: the
        parameter tensors each row holds back to back, in the row's order (per-tensor clipping
        clips each of them; the order need not be the defense's layout order)."""
        if self.clip is None:
            return rows
        if sum(int(s) for s in sizes) != rows.shape[1]:
            raise ValueError(f"the tensor sizes add up to {sum(sizes)} numbers, the uploads hold {rows.shape[1]}")
        if self.clip_mode == "flat":
            return clip_rows(rows, self.clip)[0]
        if self.tensors is not None and sorted(int(s) for s in sizes) != sorted(self.tensors):
            raise ValueError("the replayed upload's tensors are not the defense's parameter tensors "
                             f"(sizes {sorted(sizes)} vs {sorted(self.tensors)})")
        return clip_rows_per_tensor(rows, self.clip, tensor_slices(sizes))[0]

    def describe_clip(self) -> str:
        if self.clip is None:
            return "not clipped"
        return f"{'each parameter tensor ' if self.clip_mode == 'per_tensor' else ''}clipped to {self.clip:g}"

    def observation(self) -> str:
        """What the server observes, in words: each upload, or the aggregate of m uploads (and why)."""
        if self.clients == 1:
            return Observation.EACH_UPLOAD
        return f"the aggregate of {self.clients} uploads ({self.summed_by})"


def not_replayed_reason(defense) -> str | None:
    if defense.name in REPLAYED:
        return None
    return f"the upload privatisation of '{defense.name}' is not replayed (replayed: {', '.join(REPLAYED)})"


def upload_view(defense, training, num_clients: int) -> UploadView:
    """The privatisation of one upload of ``defense`` in a round with the expected participants."""
    if REPLAYED.get(defense.name) != "gaussian":
        return UploadView(None, 0.0, 1)
    params = defense.params
    expected = max(1, int(round(training.sampling_rate(num_clients) * num_clients)))
    noise = float(params.noise_multiplier) / math.sqrt(expected)
    clip_mode = getattr(params, "clip_mode", "flat")
    layout = getattr(defense, "layout", None)
    tensors = tuple(layout.sizes) if clip_mode == "per_tensor" and layout is not None else None
    if defense.observes == "uploads":
        return UploadView(float(params.clip), noise, 1, clip_mode, tensors)
    summed_by = ("secure aggregation" if params.secure_aggregation
                 else "a trusted aggregator adds the noise to the sum; the server sees only the noisy sum")
    return UploadView(float(params.clip), noise, expected, clip_mode, tensors, summed_by)
