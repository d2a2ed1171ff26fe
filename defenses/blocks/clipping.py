"""ℓ2 clipping of client updates (McMahan et al. 2018, Alg. 1: Δ̃ = Δ / max(1, ‖Δ‖₂/S))."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def clip_rows(updates: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip each row of a C×d matrix to ℓ2 norm ≤ ``clip`` (flat clipping over all parameters).

    Returns (clipped rows, pre-clip norms, whether each row was clipped). The scale factor
    min(1, S/‖Δ‖) is computed in float64 so a clipped row's norm exceeds S by at most float32
    rounding (≈1e-7 relative); rows already inside the ball are returned bit for bit.
    """
    norms = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64)
    clipped = norms > clip
    scale = torch.where(clipped, clip / norms.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(norms))
    # rows inside the ball are multiplied by exactly 1.0, which leaves every bit as it was
    return updates * scale.to(updates.dtype)[:, None], norms, clipped


def clip_rows_per_tensor(updates: torch.Tensor, clip: float,
                         slices: list[slice]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip every parameter tensor of every row to ℓ2 norm ≤ ``clip`` separately.

    This is what DP-FedSAM's public code does: the whole update's sensitivity is
    then clip·√L for L tensors, which the accountant must reflect. Returns (clipped rows, flat
    pre-clip norms, whether any tensor of a row was clipped).
    """
    out = updates.clone()
    any_clipped = torch.zeros(updates.shape[0], dtype=torch.bool, device=updates.device)
    for part in slices:
        out[:, part], _, clipped = clip_rows(updates[:, part], clip)
        any_clipped |= clipped
    return out, torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64), any_clipped


def tensor_slices(sizes: Sequence[int]) -> list[slice]:
    """The slices of a flat vector that holds tensors of ``sizes`` numbers back to back (in that order)."""
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + int(size)))
        start += int(size)
    return out


def joined_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The row blocks ``parts`` (each C_k×d) as one matrix: a view when they lie back to back in one
    storage (the slices of one batched computation), else a copy."""
    first = parts[0]
    if len(parts) == 1:
        return first
    dim = first.shape[1]
    offset = first.storage_offset()
    adjacent = True
    for part in parts:
        adjacent = adjacent and (part.is_contiguous() and part.shape[1] == dim and part.dtype == first.dtype
                                 and part.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
                                 and part.storage_offset() == offset)
        offset += part.numel()
    if adjacent:
        return first.as_strided((sum(p.shape[0] for p in parts), dim), (dim, 1), first.storage_offset())
    return torch.cat(list(parts))
