"""Sparsification masks for client updates: per-tensor top-k, global top-k, random-k.

Used by LUS (Cheng et al. 2022: per-tensor top-s of |g ⊙ Δ|), DP-FedSAM-top_k (Shi et al. 2023:
per-tensor top-⌈p·d_l⌉ of |Δ|) and Fed-SMP (Hu et al. 2022: global random-k or top-k). Ties are
broken by the lower index (a stable sort), so masks are deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from defenses.blocks.flat import ParamLayout

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

ROUNDINGS = ("ceil", "floor", "nearest")


def exact_fraction(value: float | Fraction) -> Fraction:
    """The decimal a user wrote, exactly: 0.55 is 11/20, not the binary double 0.55000000000000004."""
    return value if isinstance(value, Fraction) else Fraction(repr(float(value)))


def exact_count(fraction: float | Fraction, size: int, rounding: str) -> int:
    """How many of ``size`` entries a share ``fraction`` keeps, in exact rational arithmetic, clamped
    to [1, size]: ``ceil`` ⌈p·d⌉ (DP-FedSAM-top_k, Fed-SMP: our rounding of k = p·d), ``floor``
    ⌊r·n⌋ (FL-TOP: it reproduces the bandwidth cells of Kerkouche et al.'s Table 1), ``nearest``
    round(x·d) with halves up (LUS: our choice, the paper does not say how to round).

    Floating point would misplace the boundaries: (1 − 0.55)·10 is 4.4999999999999996 in doubles,
    which rounds to 4 where the paper's s_j = round(4.5) = 5.
    """
    product = exact_fraction(fraction) * size
    if rounding == "ceil":
        count = math.ceil(product)
    elif rounding == "floor":
        count = math.floor(product)
    elif rounding == "nearest":
        count = math.floor(product + Fraction(1, 2))
    else:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding}")
    return min(size, max(1, count))


def kept_per_tensor(layout: ParamLayout, fraction: float | Fraction, rounding: str) -> list[int]:
    """How many entries of each tensor to keep (:func:`exact_count` per tensor): ``ceil`` for
    DP-FedSAM-top_k (⌈p·d_l⌉), ``nearest`` for LUS (max(1, round((1 − c)·d_l)))."""
    return [exact_count(fraction, d, rounding) for d in layout.sizes]


def top_rows(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Boolean mask of the ``keep`` largest entries of each row (ties: lower index first)."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    if keep >= scores.shape[1]:
        return mask.fill_(True)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]
    return mask.scatter_(1, order, True)


def per_tensor_top_mask(scores: torch.Tensor, layout: ParamLayout, keep: list[int]) -> torch.Tensor:
    """C×d mask keeping, within each parameter tensor, the entries with the largest scores."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    for part, count in zip(layout.slices().values(), keep):
        mask[:, part] = top_rows(scores[:, part], count)
    return mask


def random_mask(rows: int, dim: int, keep: int, generators: list[torch.Generator], device="cpu") -> torch.Tensor:
    """Each row keeps ``keep`` coordinates drawn uniformly without replacement from its own generator."""
    mask = torch.zeros(rows, dim, dtype=torch.bool, device=device)
    for i, generator in enumerate(generators):
        mask[i, torch.randperm(dim, generator=generator)[:keep].to(device)] = True
    return mask
