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


def test_the_mirrored_ratio_is_the_log_density_ratio_of_the_replace_one_pair():
    """Mirrored pairs (replace-one): each step (1 − q)N(0, 1) + qN(μ, 1) against
    (1 − q)N(0, 1) + qN(−μ, 1); the ratio is the log of the two densities' quotient, summed over
    steps — at q = 1 that is 2μz per step, N(±2μ², 4μ²) under either hypothesis."""
    from scipy.stats import norm

    rng = np.random.default_rng(2)
    z = 3 * rng.standard_normal((6, 5))
    for q in (0.2, 0.7):
        inserted = (1 - q) * norm.pdf(z) + q * norm.pdf(z - 0.6)
        held_out = (1 - q) * norm.pdf(z) + q * norm.pdf(z + 0.6)
        direct = np.log(inserted / held_out).sum(axis=1)
        assert np.allclose(mixture_log_likelihood_ratio(z, 0.6, q, mirrored=True), direct)
    assert np.allclose(mixture_log_likelihood_ratio(z, 0.6, 1.0, mirrored=True), 1.2 * z.sum(axis=1))
    # the ratio is antisymmetric: a held-out canary's reading −z scores the negative
    assert np.allclose(mixture_log_likelihood_ratio(-z, 0.6, 0.2, mirrored=True),
                       -mixture_log_likelihood_ratio(z, 0.6, 0.2, mirrored=True))
