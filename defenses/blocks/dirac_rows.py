"""Client updates that are zero except on one coordinate each — Dirac canary clients — kept in
structured form, so that a round can carry 10⁴ of them without a dense 10⁴ × d matrix.

Row k is ``values[k]·e_{coords[k]}`` plus, once noised, its own Gaussian noise N(0, std²·I). A
dense row of noise per client is what makes 10⁴ canary clients expensive (10⁴ × d normal
draws a round), yet two numbers per row carry everything any observer can use:

* **the row's noise on its own coordinate** (``own_noise``): what an observer of the single
  upload (the server without secure aggregation) reads at the canary's coordinate — the upload
  is noise alone on every other coordinate, independent of the canary;
* **the sum of all rows' noise** (``noise_total``, a d-vector): what the aggregate carries.

Both are drawn *jointly* with the exact distribution of K independent noise rows: the own
values are K independent N(0, std²), and on coordinate j the other rows' noise adds
N(0, (K − c_j)·std²), c_j being the number of rows whose coordinate is j — so the sum over rows
is exactly N(0, K·std²) on every coordinate and contains each row's own value. Nothing about
the noise is approximated; only the rows' noise off their own coordinate, which no statistic
of a single canary depends on except through the sum, is not materialised row by row.

Clipping is exact too: a Dirac row's ℓ2 norm (and its norm within the one tensor it touches) is
|value|, so flat and per-tensor clipping both scale it to min(|value|, S)·sign.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class DiracRows:
    """K client rows, each zero except ``values[k]`` at coordinate ``coords[k]`` of a d-vector,
    and — once :meth:`with_gaussian_noise` has run — their noise, as (own coordinate, sum)."""

    coords: torch.Tensor  # int64 [K]
    values: torch.Tensor  # [K], the dtype and device of the dense updates
    dim: int
    own_noise: torch.Tensor | None = None  # [K]: row k's noise at coords[k]
    noise_total: torch.Tensor | None = None  # [d]: the sum over rows of their noise

    def __post_init__(self) -> None:
        if self.coords.shape != self.values.shape or self.coords.dim() != 1:
            raise ValueError(f"coords and values must be 1-D of one length, got {tuple(self.coords.shape)} "
                             f"and {tuple(self.values.shape)}")

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def norms(self) -> torch.Tensor:
        """The rows' ℓ2 norms (float64): |value| — before any noise."""
        return self.values.abs().to(torch.float64)

    def clipped(self, clip: float) -> tuple[DiracRows, torch.Tensor, torch.Tensor]:
        """Each row clipped to ℓ2 norm ≤ ``clip`` (flat, or per tensor: a Dirac row lies in one
        tensor, where its norm is its whole norm). Returns (rows, pre-clip norms, clipped?) as
        :func:`defenses.blocks.clipping.clip_rows` does: the factor min(1, S/|v|) in float64."""
        norms = self.norms()
        clipped = norms > clip
        scale = torch.where(clipped, clip / norms.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(norms))
        return replace(self, values=self.values * scale.to(self.values.dtype)), norms, clipped

    def with_gaussian_noise(self, std: float, generator: torch.Generator) -> DiracRows:
        """The rows plus independent N(0, std²·I) noise each (see the module docstring for why two
        draws — K own values and one d-vector — have exactly the joint law of K dense rows)."""
        if self.own_noise is not None:
            raise ValueError("these rows already carry noise")
        device, dtype = self.values.device, self.values.dtype
        own = torch.randn(len(self), generator=generator, dtype=torch.float64).mul_(std)
        owners = torch.zeros(self.dim, dtype=torch.float64).index_add_(0, self.coords.cpu(),
                                                                       torch.ones(len(self), dtype=torch.float64))
        others = (torch.randn(self.dim, generator=generator, dtype=torch.float64)
                  * (std * (len(self) - owners).clamp_min(0).sqrt()))
        total = others.index_add_(0, self.coords.cpu(), own)
        return replace(self, own_noise=own.to(device=device, dtype=dtype), noise_total=total.to(device=device, dtype=dtype))

    def own_uploads(self) -> torch.Tensor:
        """Each upload's value at its own coordinate (value plus its own noise): the single
        upload's reading a server without secure aggregation has of the canary."""
        return self.values if self.own_noise is None else self.values + self.own_noise

    def total(self) -> torch.Tensor:
        """The sum of the rows (a dense d-vector), noise included."""
        out = torch.zeros(self.dim, dtype=self.values.dtype, device=self.values.device)
        out.index_add_(0, self.coords.to(self.values.device), self.values)
        return out if self.noise_total is None else out + self.noise_total
