"""Gaussian noise for updates, drawn from per-(run, round, client) generators.

Each client's noise comes from its own :func:`audit.seeding.torch_generator` stream, so the
noise a client adds does not depend on which other clients are in the round, on the order in
which they are processed, or on whether the batched or the per-client engine path runs.
"""

from __future__ import annotations

import torch


def gaussian_rows(rows: int, dim: int, std: float, generators: list[torch.Generator],
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """A rows×dim matrix of N(0, std²) entries, row i from ``generators[i]``."""
    if len(generators) != rows:
        raise ValueError("one generator per row is needed")
    out = torch.empty(rows, dim, dtype=torch.float32, device=device)
    for i, generator in enumerate(generators):
        out[i] = torch.randn(dim, generator=generator, device=generator.device).to(device)
    return out.mul_(std)
