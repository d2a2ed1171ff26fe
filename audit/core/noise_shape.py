"""Two tests of noise beyond its level, for the conformance audit: is it drawn afresh, and is it
as heavy-tailed as the Gaussian the claim accounts?

* **Fresh noise.** Noise reused across rounds (a stream keyed without the round) leaves the
  released differences of consecutive models without noise. Coupled trials give, for one seed and
  the same participants, the noise n₁ of one round and n₂ of another; with fresh noise they are
  independent and, the noise being symmetric, ρ = ⟨n₁, n₂⟩/(‖n₁‖‖n₂‖) is symmetric about 0. The
  one-sided t-test of mean ρ > 0 over independent pairs rejects reuse (ρ = 1 every time).
* **Lighter tails than Gaussian.** Bounded noise of the claimed variance (uniform, a truncated
  Gaussian) has an unbounded privacy loss where a Gaussian's is bounded at every δ. Its excess
  kurtosis is negative (uniform: −1.2); a Gaussian's is 0, and a scale mixture of Gaussians
  (noise whose std varies from trial to trial with |P_t|) has kurtosis ≥ 0. D'Agostino's
  kurtosis test (Anscombe & Glynn 1983), one-sided "less", is valid against every such null.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic: `list` and `config` name attacks without scipy.stats
    stats = lazy_module("scipy.stats")


#: samples below which the tails are not tested (the kurtosis test's normal approximation needs them)
MIN_SHAPE = 200
#: pairs of rounds below which fresh noise is not tested
MIN_PAIRS = 20


def fresh_noise_p(first: np.ndarray, second: np.ndarray) -> float | None:
    """p of the one-sided t-test that the noise of paired rounds is positively correlated:
    ``first[i]`` and ``second[i]`` are pair i's noise vectors (rows). None: too few pairs, or no noise."""
    norms = np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)
    usable = norms > 0
    if int(usable.sum()) < MIN_PAIRS:
        return None
    rho = np.einsum("ij,ij->i", first[usable], second[usable]) / norms[usable]
    spread = float(np.std(rho, ddof=1))
    if not spread > 0:  # every pair alike: ρ = 1 is reuse, ρ = 0 a constant without noise
        return 0.0 if float(np.mean(rho)) > 0.5 else 1.0
    t = float(np.mean(rho)) / (spread / math.sqrt(len(rho)))
    return float(stats.t.sf(t, len(rho) - 1))


def lighter_tails_p(samples: np.ndarray) -> float | None:
    """p of D'Agostino's one-sided test that ``samples`` have lighter tails than a Gaussian
    (excess kurtosis below 0); None below :data:`MIN_SHAPE` samples or without spread."""
    samples = np.asarray(samples, dtype=np.float64)
    if len(samples) < MIN_SHAPE or not float(np.std(samples)) > 0:
        return None
    return float(stats.kurtosistest(samples, alternative="less").pvalue)
