"""Simulated secure aggregation (Bonawitz et al. 2017) over the integers modulo 2^bits.

Clients upload vectors in Z_m, m = 2^bits, represented in [−m/2, m/2); the server learns only
their sum modulo m. Values that leave the range wrap around — which is why DDGauss scales its
inputs so that a sum of n clients fits with high probability.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def wrap(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Map integers to their representative in [−2^(bits−1), 2^(bits−1))."""
    modulus = 1 << bits
    return torch.remainder(values + modulus // 2, modulus) - modulus // 2


def modular_sum(uploads: torch.Tensor, bits: int) -> torch.Tensor:
    """The sum of integer uploads (rows) modulo 2^bits — all the server of SecAgg sees."""
    if uploads.dtype != torch.int64:
        raise TypeError("secure aggregation works on int64 vectors")
    if bits > 62:
        raise ValueError("bits must be ≤ 62 for int64 arithmetic")
    return wrap(wrap(uploads, bits).sum(0), bits)
