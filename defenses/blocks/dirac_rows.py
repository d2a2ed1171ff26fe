"""Client updates that are zero except on one coordinate each — Dirac canary clients — kept in
structured form, so that a round can carry 10⁴ of them without a dense 10⁴ × d matrix.

Row k is ``values[k]·e_{coords[k]}``. The rows are never privatised as such: what the defense's
own code makes of them is measured on dense probe rows (:mod:`defenses.federated.dirac_passage`),
so the canaries meet exactly the clipping, selection, noise and aggregation real uploads meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class DiracRows:
    """K client rows, each zero except ``values[k]`` at coordinate ``coords[k]`` of a d-vector."""

    coords: torch.Tensor  # int64 [K]
    values: torch.Tensor  # [K], the dtype and device of the dense updates
    dim: int

    def __post_init__(self) -> None:
        if self.coords.shape != self.values.shape or self.coords.dim() != 1:
            raise ValueError(f"coords and values must be 1-D of one length, got {tuple(self.coords.shape)} "
                             f"and {tuple(self.values.shape)}")

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def subset(self, index: torch.Tensor) -> DiracRows:
        """The rows at ``index`` (positions)."""
        return DiracRows(self.coords[index.to(self.coords.device)], self.values[index.to(self.values.device)], self.dim)
