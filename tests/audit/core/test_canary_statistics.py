"""The per-canary statistics against a Gaussian claim have the laws the theory gives them."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.gaussian_canary_statistics import mixture_log_likelihood_ratio, standardised_sum


def test_the_weighted_standardised_sum_is_n_of_the_root_sum_of_squared_shifts():
    """Readings z_t ~ N(μ_t, 1) in the steps taken: Σ μ_t z_t / √Σ μ_t² ~ N(√Σ μ_t², 1)."""
    rng = np.random.default_rng(0)
    shifts = np.array([0.2, 0.5, 1.0, 0.3])
    taken = np.array([True, False, True, True])
    z = rng.standard_normal((200_000, 4)) + shifts
    scores = standardised_sum(z, np.broadcast_to(taken, z.shape), shifts)
    expected = np.sqrt(np.sum(shifts[taken] ** 2))
    assert scores.mean() == pytest.approx(expected, abs=0.01) and scores.std() == pytest.approx(1.0, abs=0.01)
    assert standardised_sum(np.ones((1, 3)), np.zeros((1, 3), dtype=bool))[0] == 0.0  # joined no step


def test_at_full_participation_the_mixture_ratio_is_the_gaussian_one():
    rng = np.random.default_rng(1)
    z = rng.standard_normal((5, 7))
    assert np.allclose(mixture_log_likelihood_ratio(z, 0.4, 1.0), 0.4 * z.sum(axis=1) - 7 * 0.08)
    # q < 1: each step contributes log(1 − q + q·e^{μz − μ²/2})
    partial = mixture_log_likelihood_ratio(z, 0.4, 0.3)
    direct = np.log(0.7 + 0.3 * np.exp(0.4 * z - 0.08)).sum(axis=1)
    assert np.allclose(partial, direct)
