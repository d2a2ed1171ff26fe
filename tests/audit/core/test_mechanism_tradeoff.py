"""The accounted mechanism's own trade-off curve (Dong, Roth & Su 2022, Prop. 2.12, from the privacy
profile) and the one-run test against it (Mahloujifar, Melis & Chaudhuri 2024): checked against
closed forms, and by simulation at the mechanism itself (false rejections at most their level)
and at a leakier one (rejected)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from audit.core.empirical_epsilon import guess_counts
from audit.core.fdp_one_run import ApproximateDPTradeOff, GaussianTradeOff, fdp_p_value
from audit.core.mechanism_tradeoff import (
    ProfileTradeOff,
    composed_epsilon,
    composed_tradeoff,
    mechanism_one_run_audit,
)

FRACTIONS = (0.02, 0.1, 0.5)


def test_a_one_point_profile_is_the_epsilon_delta_curve():
    curve, plain = ProfileTradeOff((1.3,), (1e-3,)), ApproximateDPTradeOff(1.3, 1e-3)
    for x in (0.0, 1e-6, 0.01, 0.2, 0.5, 0.9, 1.0):
        assert curve(x) == pytest.approx(plain(x), abs=1e-15)
        assert curve.floor(x) == pytest.approx(plain.floor(x), abs=1e-15)


def test_the_gaussian_curve_lies_just_below_the_exact_one():
    """One unsubsampled Gaussian step of std σ at sensitivity 1 is exactly (1/σ)-GDP: the curve from
    the PLD's profile may only lie below f(x) = Φ(Φ⁻¹(1 − x) − 1/σ) (valid), and close to it."""
    sigma = 1.5
    curve, exact = composed_tradeoff("gaussian", sigma, 1.0, 1), GaussianTradeOff(1.0 / sigma)
    for x in np.linspace(0.001, 0.999, 60):
        assert curve(x) <= exact(x) + 1e-9
        assert curve(x) >= exact(x) - 0.01


def test_the_laplace_epsilon_is_the_closed_form_and_composition_adds_up():
    """Laplace of scale b at sensitivity 1 is (1/b, 0)-DP: at δ → 0 its ε is 1/b; T compositions are
    at most T/b."""
    assert composed_epsilon("laplace", 0.5, 1.0, 1, 1e-9) == pytest.approx(2.0, abs=0.01)
    assert composed_epsilon("laplace", 0.5, 1.0, 5, 1e-9) <= 10.0 + 0.01


def _counts(rng, m: int, scale: float):
    """A one-run audit of one Laplace step of noise scale ``scale`` on m Dirac canaries: the reading
    is the noise plus the canary's shift 1 when inserted, scored by the reading itself."""
    inserted = rng.random(m) < 0.5
    reading = rng.laplace(scale=scale, size=m) + inserted
    return guess_counts(reading, inserted, FRACTIONS)


def test_the_mechanism_itself_is_rejected_at_most_at_the_level():
    """120 audits of honest code (noise scale b = 0.5 as accounted), each tested at α = 0.05 against
    its own curve with Bonferroni over the levels: false rejections at most what Binomial(120, 0.05)
    exceeds with probability 1 % (the analysis is conservative: expect far fewer)."""
    rng = np.random.default_rng(7)
    curve = composed_tradeoff("laplace", 0.5, 1.0, 1)
    trials, m = 120, 2000
    rejected = 0
    for _ in range(trials):
        tried = _counts(rng, m, 0.5)
        p = min(1.0, len(tried) * min(fdp_p_value(m, g, c, curve) for g, c in tried))
        rejected += p <= 0.05
    assert rejected <= binom.ppf(0.99, trials, 0.05), rejected


def test_a_tenth_of_the_noise_is_rejected_and_its_bound_stays_below_the_truth():
    """Scale b/10 against the accounted b: rejected, and the ε reported — the least-noise member of the
    family the counts reject — is above the accounted ε = 1/b and below the true ε = 10/b."""
    rng = np.random.default_rng(8)
    m = 2000
    tested = mechanism_one_run_audit(m, _counts(rng, m, 0.05), "laplace", 0.5, 1.0, 1, 1e-5, fractions=FRACTIONS)
    assert tested.p_value(0.0, 0.0) <= 0.05 and tested.scale < 1.0
    assert 2.0 < tested.epsilon <= composed_epsilon("laplace", 0.05, 1.0, 1, 1e-5)
    honest = mechanism_one_run_audit(m, _counts(rng, m, 0.5), "laplace", 0.5, 1.0, 1, 1e-5, fractions=FRACTIONS)
    assert honest.epsilon <= 2.0 and (honest.scale == 0.0 or honest.scale > 1.0)


def test_the_gaussian_curve_has_the_power_the_epsilon_delta_curve_lacks():
    """One Gaussian step of std σ = 1 (ε ≈ 4.4 at δ = 1e-5) audited with std 0.5: against the
    (ε, δ) curve at the accounted ε the counts are not significant; against the mechanism's own curve
    the same counts reject it."""
    rng = np.random.default_rng(9)
    m = 2000
    inserted = rng.random(m) < 0.5
    reading = rng.normal(scale=0.5, size=m) + inserted
    tried = guess_counts(reading, inserted, FRACTIONS)
    accounted = composed_epsilon("gaussian", 1.0, 1.0, 1, 1e-5)
    generic = min(fdp_p_value(m, g, c, ApproximateDPTradeOff(accounted, 1e-5)) for g, c in tried)
    own = min(fdp_p_value(m, g, c, composed_tradeoff("gaussian", 1.0, 1.0, 1)) for g, c in tried)
    assert generic > 0.05 and own < 0.005
