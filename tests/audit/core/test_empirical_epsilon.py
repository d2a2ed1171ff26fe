"""Empirical ε from canaries: the one-run audit (Steinke et al. 2023) and the Gaussian fit
(Andrew et al. 2024), against reference values, dp-accounting and null data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from audit.core.empirical_epsilon import (
    gaussian_fit_epsilon,
    gaussian_pair_delta,
    gaussian_pair_epsilon,
    one_run_audit,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)


@pytest.mark.parametrize("canaries,guesses,correct,delta,expected", [
    (1000, 100, 100, 0.0, 3.493), (1000, 100, 90, 0.0, 1.631), (1000, 1000, 1000, 0.0, 5.809),
    (10_000, 1000, 900, 1e-5, 2.015),
])
def test_one_run_reference_values(canaries, guesses, correct, delta, expected):
    """The one-run bound (Steinke, Nasr & Jagielski 2023) as Privacy Meter's get_eps_audit computes it, p = 0.05."""
    assert one_run_epsilon_lower_bound(canaries, guesses, correct, delta, 0.05) == pytest.approx(expected, abs=5e-4)


def test_one_run_closed_form_and_monotonicity():
    # δ = 0, all r guesses right: p = q^r, so the bound solves q = alpha^(1/r), ε = logit(q)
    q = 0.05 ** (1 / 100)
    assert one_run_epsilon_lower_bound(1000, 100, 100) == pytest.approx(math.log(q / (1 - q)), abs=1e-8)
    assert one_run_p_value(100, 50, 30, 1.0, 0.0) < one_run_p_value(100, 50, 30, 2.0, 0.0)
    bounds = [one_run_epsilon_lower_bound(1000, 100, v) for v in (60, 70, 80, 90)]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1]
    assert one_run_epsilon_lower_bound(1000, 100, 50) == 0.0  # coin flipping proves nothing
    assert one_run_epsilon_lower_bound(1000, 100, 90, delta=1e-3) < one_run_epsilon_lower_bound(1000, 100, 90)


def test_one_run_audit_null_and_leaky():
    rng = np.random.default_rng(0)
    inserted = rng.random(1000) < 0.5
    null = one_run_audit(rng.normal(size=1000), inserted)
    assert null.epsilon == 0.0 or null.epsilon < 0.3
    separated = one_run_audit(np.where(inserted, 10.0, 0.0) + rng.normal(size=1000), inserted)
    assert separated.epsilon > 3.0 and separated.correct == separated.guesses


def test_one_run_audit_is_valid_for_randomised_response():
    """ε-randomised response on each canary's bit: the bound must stay below ε (95 %)."""
    epsilon, violations = 1.0, 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        inserted = rng.random(2000) < 0.5
        truthful = rng.random(2000) < math.exp(epsilon) / (1 + math.exp(epsilon))
        report = np.where(truthful, inserted, ~inserted).astype(float) + 1e-3 * rng.random(2000)
        violations += one_run_audit(report, inserted).epsilon > epsilon
    # at most alpha = 5 % of audits may exceed the truth; 40 trials: allow the binomial 99.9 % quantile
    assert violations <= 7


def test_gaussian_pair_matches_dp_accounting():
    """A Gaussian mechanism of sensitivity 1 and noise σ is the pair N(1, σ²) vs N(0, σ²)."""
    for sigma in (0.8, 1.0, 2.0):
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_event.GaussianDpEvent(sigma))
        expected = accountant.get_epsilon(1e-5)
        assert gaussian_pair_epsilon(1e-5, 1.0, sigma, 0.0, sigma) == pytest.approx(expected, rel=2e-3)


def test_gaussian_pair_delta_against_numerical_integration():
    from scipy import integrate, stats

    for (mp, sp, mq, sq) in ((1.0, 1.0, 0.0, 1.0), (0.5, 1.3, 0.0, 1.0), (0.0, 0.7, 0.2, 1.1)):
        for epsilon in (0.0, 0.5, 2.0):
            def integrand(x, mp=mp, sp=sp, mq=mq, sq=sq, epsilon=epsilon):
                return max(0.0, stats.norm.pdf(x, mp, sp) - math.exp(epsilon) * stats.norm.pdf(x, mq, sq))

            numeric = integrate.quad(integrand, -30, 30, limit=400, points=[mp, mq])[0]
            assert gaussian_pair_delta(epsilon, mp, sp, mq, sq) == pytest.approx(numeric, abs=1e-7)


def test_gaussian_fit_recovers_a_known_shift_and_covers_zero_on_null_data():
    rng = np.random.default_rng(1)
    truth = gaussian_pair_epsilon(1e-5, 1.0, 1.0, 0.0, 1.0)
    estimate = gaussian_fit_epsilon(rng.normal(1, 1, 5000), rng.normal(0, 1, 5000), 1e-5)
    assert estimate.low <= truth <= estimate.high and estimate.value == pytest.approx(truth, rel=0.1)
    covered = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        null = gaussian_fit_epsilon(rng.normal(0, 1, 100), rng.normal(0, 1, 100), 1e-5)
        covered += null.low == 0.0
    assert covered >= 15  # a 95 % interval covering ε = 0: fewer than 15 of 20 has probability 0.3 %
    # invariant to an affine change of the statistic
    a, b = rng.normal(0.5, 2, 300), rng.normal(0, 2, 300)
    assert gaussian_fit_epsilon(a, b, 1e-5).value == pytest.approx(gaussian_fit_epsilon(3 * a + 7, 3 * b + 7, 1e-5).value)
