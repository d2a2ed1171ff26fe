"""The randomized Hadamard rotation of distributed DP (Kairouz, Liu, Steinke 2021, §4.2).

R x = H·D·x/√d′ with H the d′×d′ Walsh–Hadamard matrix (d′ a power of two) and D a diagonal of
random signs shared by all clients of a round. R is orthonormal, so ℓ2 norms are kept, and it
spreads a vector's mass evenly over the coordinates ("flattens" it), which makes coordinate-wise
rounding and modular wrap-around rare. R⁻¹ y = D·H·y/√d′ because H·H = d′·I.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def padded_dimension(dim: int) -> int:
    """The next power of two ≥ dim."""
    return 1 << max(0, (dim - 1).bit_length())


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh–Hadamard transform along the last axis (length a power of two)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"length {n} is not a power of two")
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    half = 1
    while half < n:
        pairs = y.view(y.shape[0], n // (2 * half), 2, half)
        y = torch.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=2).view(-1, n)
        half *= 2
    return y.view(*lead, n)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """R x = H D x / √d′ for each row of x (already padded to d′)."""
    return hadamard(x * signs) / math.sqrt(x.shape[-1])


def unrotate(y: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """R⁻¹ y = D H y / √d′."""
    return signs * hadamard(y) / math.sqrt(y.shape[-1])


def random_signs(dim: int, generator: torch.Generator, dtype: torch.dtype | None = None) -> torch.Tensor:
    """±1 per coordinate (float64 unless ``dtype``)."""
    return (torch.randint(0, 2, (dim,), generator=generator) * 2 - 1).to(torch.float64 if dtype is None else dtype)
