"""Sparsification masks for client updates: per-tensor top-k, global top-k, random-k.

Used by LUS (paper 000: per-tensor top-s of |g ⊙ Δ|), DP-FedSAM-top_k (paper 002: per-tensor
top-⌈p·d_l⌉ of |Δ|) and Fed-SMP (Hu et al. 2022: global random-k or top-k). Ties are broken by
the lower index (a stable sort), so masks are deterministic.
"""

from __future__ import annotations

import math

import torch

from defenses.flat import ParamLayout


def kept_per_tensor(layout: ParamLayout, fraction: float, rounding: str) -> list[int]:
    """How many entries of each tensor to keep.

    ``rounding="ceil"``: ⌈fraction·d_l⌉ (DP-FedSAM-top_k, spec 002 §2.2);
    ``rounding="nearest"``: max(1, round(fraction·d_l)) with halves rounded up (LUS, spec 000 §2.3).
    """
    if rounding == "ceil":
        return [min(d, max(1, math.ceil(fraction * d - 1e-12))) for d in layout.sizes]
    return [min(d, max(1, math.floor(fraction * d + 0.5))) for d in layout.sizes]


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
