"""Noise for updates — Gaussian and discrete Gaussian — drawn from per-(run, round, client) generators.

Each client's noise comes from its own :func:`audit.core.seeding.torch_generator` stream, so the
noise a client adds does not depend on which other clients are in the round, on the order in
which they are processed, or on whether the batched or the per-client engine path runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def gaussian_rows(rows: int, dim: int, std: float | Sequence[float], generators: list[torch.Generator],
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """A rows×dim matrix of N(0, std²) entries, row i from ``generators[i]``; ``std`` is one value
    or one per row (several runs' clients, each run with its own share σS/√|P_t|).

    Row i's values do not depend on the other rows: each is its generator's draw of ``dim``
    normals, scaled by its std in float32 (a float32 product of the same two numbers, whether the
    std is one scalar or a per-row column). Rows drawn from CPU generators are filled on the CPU
    and moved to ``device`` in one transfer (not one per row).
    """
    if len(generators) != rows:
        raise ValueError("one generator per row is needed")
    on_cpu = all(generator.device.type == "cpu" for generator in generators)
    out = torch.empty(rows, dim, dtype=torch.float32, device="cpu" if on_cpu else device)
    for i, generator in enumerate(generators):
        if on_cpu:
            torch.randn(dim, generator=generator, out=out[i])
        else:
            out[i] = torch.randn(dim, generator=generator, device=generator.device).to(out.device)
    out = out.to(device)
    if isinstance(std, (int, float)):
        return out.mul_(std)
    if len(std) != rows:
        raise ValueError("one std per row is needed")
    return out.mul_(torch.as_tensor(np.asarray(std, dtype=np.float64), device=out.device).to(torch.float32)[:, None])


def discrete_laplace(rng: np.random.Generator, scale: float, size: int) -> np.ndarray:
    """P(Y = y) ∝ exp(−|y|/scale) on the integers: the difference of two iid geometric variables."""
    success = -math.expm1(-1.0 / scale)  # 1 − e^{−1/t}
    return (rng.geometric(success, size) - rng.geometric(success, size)).astype(np.int64)


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: int) -> np.ndarray:
    """Samples of the discrete Gaussian N_Z(0, σ²), P(y) ∝ exp(−y²/(2σ²)) on the integers.

    Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for Differential Privacy", Alg. 3):
    with t = ⌊σ⌋ + 1, draw Y from the discrete Laplace of scale t and accept it with probability
    exp(−(|Y| − σ²/t)²/(2σ²)); repeat for the rejected ones. Vectorised; the accept decisions use
    float64 exponentials (the algorithm is exact given exact Bernoulli draws).
    """
    out = np.zeros(size, dtype=np.int64)
    if sigma <= 0 or size == 0:
        return out
    t = math.floor(sigma) + 1
    pending = np.arange(size)
    while len(pending):
        candidates = discrete_laplace(rng, t, len(pending))
        accept = rng.random(len(pending)) < np.exp(-((np.abs(candidates) - sigma ** 2 / t) ** 2) / (2 * sigma ** 2))
        out[pending[accept]] = candidates[accept]
        pending = pending[~accept]
    return out
