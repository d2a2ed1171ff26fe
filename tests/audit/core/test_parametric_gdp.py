"""The gated parametric test of a Gaussian claim (an estimate-based verdict).

Expected values come from the model, not the code: two normal samples with standardised mean
difference δ; an exact level-α test of δ ≤ μ_claim rejects in a fraction α of the audits when
δ = μ_claim (Binomial(n, α) bounds the count both ways: the test is exact, not merely valid), its
lower confidence bound covers δ in a fraction 1 − α, and the goodness-of-fit gate refuses noise
of the claimed variance but another shape (uniform, Laplace) at the sizes of a canary audit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from audit.core.audit_power import gdp_mu
from audit.core.fdp_one_run import gdp_epsilon
from audit.core.parametric_gdp import MIN_PER_GROUP, parametric_gdp_test

DELTA = 1e-5
REPLICATES = 300
COINS = 4000


def audit(rng, mu_true, mu_claim, noise="gaussian", coins=COINS, alpha=0.05):
    inserted = rng.random(coins) < 0.5
    if noise == "gaussian":
        e = rng.standard_normal(coins)
    elif noise == "uniform":  # variance 1
        e = rng.uniform(-math.sqrt(3), math.sqrt(3), coins)
    else:  # Laplace of variance 1
        e = rng.laplace(0, 1 / math.sqrt(2), coins)
    return parametric_gdp_test(mu_true * inserted + e, inserted, mu_claim, alpha=alpha)


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_an_exactly_tight_claim_is_rejected_at_the_tests_level_and_no_more(epsilon):
    rng = np.random.default_rng(int(epsilon * 100))
    mu = gdp_mu(epsilon, DELTA)
    tests = [audit(rng, mu, mu) for _ in range(REPLICATES)]
    rejected = sum(t.p_value <= 0.05 for t in tests)
    assert stats.binom.ppf(0.0005, REPLICATES, 0.05) <= rejected <= stats.binom.ppf(0.9995, REPLICATES, 0.05), rejected
    # the lower confidence bound covers the true μ exactly when the test of μ does not reject
    assert sum(t.mu_low <= mu for t in tests) == REPLICATES - rejected
    # the gate (1 % in all) lets honest Gaussian scores through
    assert sum(t.applies for t in tests) >= stats.binom.ppf(0.0005, REPLICATES, 0.99)


def test_one_claimed_mu_estimates_cohens_d():
    """Two groups and one claimed μ: the estimated μ is the standardised mean difference with the
    pooled variance (Hedges & Olkin 1985), computed here from its definition."""
    rng = np.random.default_rng(2)
    inserted = rng.random(1000) < 0.5
    scores = 0.7 * inserted + 2.0 * rng.standard_normal(1000) + 3.0
    a, b = scores[inserted], scores[~inserted]
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (scores.size - 2)
    t = parametric_gdp_test(scores, inserted, 0.35)
    assert t.mu_hat == pytest.approx((a.mean() - b.mean()) / math.sqrt(pooled), rel=1e-10)
    assert t.ratio_hat == pytest.approx(t.mu_hat / 0.35, rel=1e-12)


def test_per_canary_claimed_shifts_tight_and_halved():
    """Canaries that joined different numbers of steps: claimed μᵢ = √nᵢ/σ. At the claim the test
    rejects at its level; with half the noise (every shift doubled in noise units) always."""
    rng = np.random.default_rng(21)
    sigma = 3.0
    rejected, halved = 0, 0
    for _ in range(REPLICATES):
        inserted = rng.random(COINS) < 0.5
        mu = np.sqrt(rng.integers(1, 11, COINS)) / sigma
        noise = rng.standard_normal(COINS)
        rejected += parametric_gdp_test(mu * inserted + noise, inserted, mu).p_value <= 0.05
        halved += parametric_gdp_test(2 * mu * inserted + noise, inserted, mu).violation
    assert stats.binom.ppf(0.0005, REPLICATES, 0.05) <= rejected <= stats.binom.ppf(0.9995, REPLICATES, 0.05), rejected
    # misses: the gate's 1 % on Gaussian scores (and the test's power, ≈ 1 here)
    assert halved >= REPLICATES - stats.binom.ppf(0.9995, REPLICATES, 0.02)


def test_the_lower_bound_and_the_test_are_dual():
    rng = np.random.default_rng(3)
    t = audit(rng, 1.0, 1.0)
    at_bound = audit(np.random.default_rng(3), 1.0, t.mu_low)
    assert at_bound.p_value == pytest.approx(0.05, abs=1e-7)
    assert t.mu_low < t.mu_hat
    # the same duality at another null ratio: θ₀ = θ_low gives p = α
    scores_rng = np.random.default_rng(4)
    inserted = scores_rng.random(COINS) < 0.5
    scores = 1.5 * inserted + scores_rng.standard_normal(COINS)
    low = parametric_gdp_test(scores, inserted, 1.0).ratio_low
    assert parametric_gdp_test(scores, inserted, 1.0, null_ratio=low).p_value == pytest.approx(0.05, abs=1e-7)
    assert parametric_gdp_test(scores, inserted, 1.0, null_ratio=2.0).p_value > 0.5  # θ ≈ 1.5 < 2
    assert t.epsilon_low(DELTA) == pytest.approx(gdp_epsilon(t.mu_low, DELTA))


def test_a_conservative_claim_is_never_rejected_and_half_the_noise_always_is():
    rng = np.random.default_rng(11)
    mu = gdp_mu(4.0, DELTA)
    conservative = [audit(rng, mu, gdp_mu(8.0, DELTA)) for _ in range(100)]
    assert not any(t.violation for t in conservative)
    halved = [audit(rng, 2 * mu, mu) for _ in range(20)]  # half the noise doubles the standardised shift
    assert sum(t.violation for t in halved) >= 19
    assert all(t.mu_hat > 1.5 * mu for t in halved)


@pytest.mark.parametrize("noise", ["uniform", "laplace"])
def test_the_gate_refuses_noise_of_the_claimed_variance_but_another_shape(noise):
    rng = np.random.default_rng(5)
    mu = gdp_mu(4.0, DELTA)
    tests = [audit(rng, mu, mu, noise=noise, coins=10_000) for _ in range(10)]
    assert sum(not t.applies for t in tests) >= 9
    assert not any(t.violation for t in tests)


def test_a_mixture_of_inserted_scores_fails_the_variance_check():
    """Participation hidden from the observer: an inserted canary joins half the time, so its
    scores are a mixture whose variance exceeds the held-out one's; the Gaussian model is refused."""
    rng = np.random.default_rng(9)
    coins = 10_000
    inserted = rng.random(coins) < 0.5
    joined = inserted & (rng.random(coins) < 0.5)
    t = parametric_gdp_test(3.0 * joined + rng.standard_normal(coins), inserted, 1.0)
    assert t.variance_p < 1e-6 and not t.applies and not t.violation


def test_too_few_coins_or_bad_input():
    rng = np.random.default_rng(0)
    few = np.arange(2 * MIN_PER_GROUP - 2) % 2 == 0
    assert parametric_gdp_test(rng.standard_normal(few.size), few, 1.0) is None
    with pytest.raises(ValueError, match="claimed_mu"):
        parametric_gdp_test(np.zeros(200), np.arange(200) % 2 == 0, -1.0)
    with pytest.raises(ValueError, match="claimed_mu"):
        parametric_gdp_test(np.zeros(200), np.arange(200) % 2 == 0, np.inf)
    with pytest.raises(ValueError, match="null_ratio"):
        parametric_gdp_test(np.zeros(200), np.arange(200) % 2 == 0, 1.0, null_ratio=0.0)
    with pytest.raises(ValueError, match="finite"):
        parametric_gdp_test(np.full(200, np.nan), np.arange(200) % 2 == 0, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        parametric_gdp_test(np.zeros(200), np.zeros(100, dtype=bool), 1.0)
