"""Flat parameter vectors: the view of a model that clipping, noise and aggregation work on.

DP-FedAvg clips "the whole client update" (McMahan et al. 2018): the ℓ2 norm over all
trainable parameters together, so updates are handled as one vector of length d.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a model's trainable parameters in a flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for name, size in zip(self.names, self.sizes):
            out[name] = slice(start, start + size)
            start += size
        return out

    def flatten(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """dict of tensors → vector of length d."""
        return torch.cat([params[n].reshape(-1) for n in self.names])

    def flatten_stacked(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """dict of [C, *shape] tensors → matrix C×d."""
        return torch.cat([params[n].reshape(params[n].shape[0], -1) for n in self.names], dim=1)

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """vector of length d → dict of tensors (views into the vector)."""
        return {n: vector[s].view(shape) for (n, s), shape in zip(self.slices().items(), self.shapes)}

    def unflatten_stacked(self, matrix: torch.Tensor) -> dict[str, torch.Tensor]:
        """matrix C×d → dict of [C, *shape] tensors (copies, contiguous)."""
        return {n: matrix[:, s].reshape(matrix.shape[0], *shape)
                for (n, s), shape in zip(self.slices().items(), self.shapes)}


def parameters_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of a model's trainable parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
