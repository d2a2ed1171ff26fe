"""The fresh-noise and light-tails tests (audit.core.noise_shape), validated by simulation: under
their nulls they reject at most at their level, and they catch the bugs they are built for."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.noise_shape import MIN_SHAPE, fresh_noise_p, lighter_tails_p

REPS, ALPHA = 400, 0.05


def _binomial_ceiling(n: int, rate: float) -> float:
    """Rate plus 3 binomial standard errors: what a valid level-``rate`` test stays under."""
    return rate + 3 * np.sqrt(rate * (1 - rate) / n)


@pytest.mark.parametrize("law", ["gaussian", "scale mixture"])
def test_the_light_tails_test_holds_its_level_on_gaussian_noise(law):
    """Gaussian noise, and Gaussian noise whose std varies from sample to sample (|P_t| varies with
    random participation), reject at most α (3 binomial standard errors over 400 replicates)."""
    rng = np.random.default_rng(1)
    rejected = 0
    for _ in range(REPS):
        scale = 1.0 if law == "gaussian" else 1.0 / np.sqrt(rng.integers(1, 12, size=MIN_SHAPE))
        p = lighter_tails_p(rng.normal(size=MIN_SHAPE) * scale)
        rejected += p is not None and p < ALPHA
    assert rejected / REPS <= _binomial_ceiling(REPS, ALPHA)


def test_the_light_tails_test_catches_uniform_noise_of_the_same_variance():
    """Uniform noise (excess kurtosis −1.2): rejected at 10⁻³ in every one of 50 replicates of 600."""
    rng = np.random.default_rng(2)
    assert all(lighter_tails_p(rng.uniform(-1, 1, size=600)) < 1e-3 for _ in range(50))
    assert lighter_tails_p(rng.normal(size=MIN_SHAPE - 1)) is None


def test_the_fresh_noise_test_holds_its_level_on_independent_rounds():
    """Independent noise in the two rounds of each pair: false rejections at most α."""
    rng = np.random.default_rng(3)
    rejected = sum(fresh_noise_p(rng.normal(size=(60, 50)), rng.normal(size=(60, 50))) < ALPHA for _ in range(REPS))
    assert rejected / REPS <= _binomial_ceiling(REPS, ALPHA)


def test_the_fresh_noise_test_catches_noise_reused_or_partly_reused():
    """The same draw in both rounds (ρ = 1), or half of it reused (ρ = ½): p below 10⁻⁶."""
    rng = np.random.default_rng(4)
    first = rng.normal(size=(60, 50))
    assert fresh_noise_p(first, first.copy()) < 1e-6
    partly = (first + rng.normal(size=(60, 50))) / np.sqrt(2)
    assert fresh_noise_p(first, partly) < 1e-6
    assert fresh_noise_p(first[:10], first[:10]) is None  # too few pairs to test
