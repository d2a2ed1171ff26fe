"""The sketch of FL-CS (Kerkouche et al., UAI 2021, §4), in a form of our choosing: a partial
orthonormal DCT-II, chunk by chunk, and its ℓ1 reconstruction.

The update is cut into chunks of b coordinates; chunk j keeps m_j = ⌊r·b_j⌋ rows of the
orthonormal DCT-II, drawn without replacement from a generator every client shares (one draw per
round). Those rows are orthonormal, so A Aᵀ = I: the adjoint is the exact pseudo-inverse and the
gradient step of FISTA (Beck & Teboulle 2009) for argmin ½‖A x − y‖² + λ‖x‖₁ has step size 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from defenses.blocks.sparsify import exact_count

if TYPE_CHECKING:
    import torch
    from scipy import fft
else:  # imported when first used (audit.core.lazy_modules): registering FL-CS loads no scipy
    torch = lazy_module("torch")
    fft = lazy_module("scipy.fft")


class PartialDCT:
    """m_j rows of the orthonormal DCT-II of each chunk j: A Aᵀ = I, so the least-squares step of
    FISTA has step size 1 and Aᵀ is the exact adjoint."""

    def __init__(self, dim: int, chunk: int, fraction: float, generator: torch.Generator):
        self.bounds = [(s, min(dim, s + chunk)) for s in range(0, dim, chunk)]
        self.rows = []
        for start, stop in self.bounds:
            width = stop - start
            kept = exact_count(fraction, width, "floor")
            self.rows.append(np.sort(torch.randperm(width, generator=generator)[:kept].numpy()))
        self.measurements = sum(len(r) for r in self.rows)

    def compress(self, x: np.ndarray) -> np.ndarray:
        """[C, d] → [C, M]."""
        return np.concatenate([fft.dct(x[:, s:e], norm="ortho", axis=1)[:, rows] for (s, e), rows in zip(self.bounds, self.rows)],
                              axis=1)

    def adjoint(self, y: np.ndarray) -> np.ndarray:
        """[M] → [d]."""
        out, offset = [], 0
        for (start, stop), rows in zip(self.bounds, self.rows):
            full = np.zeros(stop - start)
            full[rows] = y[offset:offset + len(rows)]
            offset += len(rows)
            out.append(fft.idct(full, norm="ortho"))
        return np.concatenate(out)

    def reconstruct(self, y: np.ndarray, iterations: int, weight: float) -> np.ndarray:
        """FISTA for argmin ½‖Ax − y‖² + λ‖x‖₁, λ = weight·max|Aᵀy| (Beck & Teboulle 2009)."""
        start = self.adjoint(y)
        threshold = weight * float(np.abs(start).max()) if len(start) else 0.0
        x = previous = np.zeros_like(start)
        momentum, z = 1.0, x
        for _ in range(iterations):
            residual = self.compress(z[None, :])[0] - y
            step = z - self.adjoint(residual)
            x = np.sign(step) * np.maximum(np.abs(step) - threshold, 0.0)
            following = (1 + math.sqrt(1 + 4 * momentum ** 2)) / 2
            z = x + ((momentum - 1) / following) * (x - previous)
            previous, momentum = x, following
        return x
