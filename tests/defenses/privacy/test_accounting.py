"""Accounting against reference values (the test suites of opacus and dp-accounting; the σ of Cheng et al. 2022's
settings and the ε of Kerkouche et al. 2021, Table 1) and numerical integration.

Each test says which accountant and conversion it checks: ``improved`` is dp-accounting's
RDP→(ε, δ) conversion (Balle et al. 2020), ``classic`` is Mironov 2017's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from audit.core.errors import UserInputError
from defenses.privacy.accounting import (
    GaussianSchedule,
    calibrate_noise,
    compute_epsilon,
    epsilon_trajectory,
    rdp_per_round,
    rdp_to_epsilon,
)
from defenses.privacy.pld_grid import pld_round_points


def eps(sigma, q, steps, delta, **kw):
    return compute_epsilon(GaussianSchedule(sigma, q, steps), delta, **kw).epsilon


# ------------------------------------------------------------------ reference values


def test_opacus_reference_rdp_improved():
    # opacus accountants_test: exact fractional-order RDP gives 7.32911117143; dp-accounting 0.6.0
    # bounds fractional orders by a looser (sound) series, 7.32933. Ours is dp-accounting's.
    value = eps(1.5, 0.04, 2250, 1e-5)
    assert value == pytest.approx(7.32933, abs=2e-4)
    assert value >= 7.32911117143 - 1e-9  # a sound upper bound never undercuts the exact value


def test_opacus_cross_check_on_a_grid():
    """Our improved RDP ε agrees with opacus's RDP accountant (same conversion) within 0.1 %."""
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant

    for sigma, q, steps in [(0.8, 0.01, 500), (1.2, 0.1, 100), (2.0, 0.001, 10000), (1.0, 1.0, 5)]:
        accountant = RDPAccountant()
        accountant.history = [(sigma, q, steps)]
        reference = accountant.get_epsilon(1e-5)
        assert eps(sigma, q, steps, 1e-5) == pytest.approx(reference, rel=1e-3)


def test_classic_conversion_fl_top_calibration():
    # Kerkouche et al. 2021 (§3.2.2, Table 1): σ=1.5406, C=1/60, δ=1e-5, classic conversion: ε(200)=1 and Table 1's ε(t).
    schedule = GaussianSchedule(1.5406, 1 / 60, 200)
    assert compute_epsilon(schedule, 1e-5, conversion="classic").epsilon == pytest.approx(1.000, abs=0.005)
    trajectory = epsilon_trajectory(schedule, 1e-5, "classic")
    for t, expected in [(60, 0.763), (152, 0.923), (157, 0.931), (160, 0.935), (167, 0.947), (189, 0.982), (195, 0.992)]:
        assert trajectory[t - 1] == pytest.approx(expected, abs=0.002)


@pytest.mark.parametrize("q,steps,delta,expected", [
    (0.04, 1000, 1 / 3400, {2: 2.84, 4: 1.62, 6: 1.23, 8: 1.04}),
    (0.06, 300, 1 / 100, {2: 1.93, 4: 1.19, 6: 0.95, 8: 0.83}),
    (0.05, 100, 1 / 1000, {2: 1.34, 4: 0.92, 6: 0.77, 8: 0.67}),
])
def test_sigma_table_classic(q, steps, delta, expected):
    """σ for ε = 2, 4, 6, 8 in Cheng et al. 2022's EMNIST and CIFAR-10 settings and a CPU proxy (classic)."""
    for target, sigma in expected.items():
        found = calibrate_noise(target, GaussianSchedule(1.0, q, steps), delta, conversion="classic")
        assert found == pytest.approx(sigma, rel=0.02)


def test_sigma_table_improved():
    """The EMNIST setting of Cheng et al. 2022 (q = 0.04, 1,000 rounds, δ = 1/3400), improved conversion."""
    for target, sigma in {2: 2.38, 4: 1.45, 6: 1.14, 8: 0.98}.items():
        assert calibrate_noise(target, GaussianSchedule(1.0, 0.04, 1000), 1 / 3400) == pytest.approx(sigma, rel=0.02)


def test_dp_sgd_sanity_point_classic():
    """MNIST-sized DP-SGD: q = 256/60000, σ = 1.1, 60 epochs (14,040 steps), δ = 1e-5 give ε ≈ 3.0 (classic)."""
    assert eps(1.1, 256 / 60000, 14040, 1e-5, conversion="classic") == pytest.approx(3.0, rel=0.02)


def test_dp_accounting_rdp_reference():
    # rdp_privacy_accountant_test: Poisson(q=0.01, σ=2.5) composed 50 times.
    orders = [1.5, 2.5, 5, 50, 100]
    rdp = 50 * rdp_per_round(GaussianSchedule(2.5, 0.01, 50), orders)
    np.testing.assert_allclose(rdp, [6.7058e-4, 1.08549e-3, 2.18076e-3, 2.38460e-2, 167.416], rtol=1e-4)


def test_dp_accounting_gaussian_exact_point():
    assert eps(4.530877117, 1.0, 1, 1e-6) == pytest.approx(1.0, abs=1e-6)


def test_fl4health_client_level_table_improved():
    # FL4Health test_fl_accountants: N=1e5, 100 clients per round, z=1, δ=N^-1.1.
    n = 1e5
    for steps, expected in [(1, 0.697), (1000, 0.774), (100000, 1.899)]:
        assert eps(1.0, 100 / n, steps, n ** -1.1) == pytest.approx(expected, abs=1.5e-3)


def test_opacus_noise_calibration_reference():
    # opacus: noise for ε=8, δ=1e-5, q=0.04 over 90 epochs (2250 steps) → 1.416; 2000 steps → 1.3562.
    assert calibrate_noise(8, GaussianSchedule(1.0, 0.04, 2250), 1e-5) == pytest.approx(1.416, abs=0.003)
    assert calibrate_noise(8, GaussianSchedule(1.0, 0.04, 2000), 1e-5) == pytest.approx(1.3562, abs=0.003)


@pytest.mark.parametrize("sigma,q,steps,expected",
                         [(0.8, 0.001, 100, 0.27040), (2.0, 0.05, 1000, 4.17280), (3.0, 0.2, 100, 3.38122)])
def test_pld_close_to_prv_reference(sigma, q, steps, expected):
    # opacus prv_accountant test values (δ=1e-6): PLD and PRV are two numerical approximations
    # of the same privacy curve; they agree within a few percent.
    assert eps(sigma, q, steps, 1e-6, accountant="pld") == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.1, 10), (0.5, 1.0, 3), (1.5, 0.04, 2250), (0.8, 0.001, 1)])
def test_pld_is_dp_accountings_own_pld_accountant(sigma, q, steps):
    # ε is computed from a PLD built and composed the way dp-accounting's PLDAccountant does (so its
    # grid can be sized first): it must give the accountant's own ε, to the last bit
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_event.GaussianDpEvent(sigma) if q >= 1 else dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    assert eps(sigma, q, steps, 1e-5, accountant="pld") == accountant.get_epsilon(1e-5)


@pytest.mark.parametrize("sigma,q", [(0.1, 1.0), (0.5, 0.3), (1.0, 0.5), (3.0, 1.0)])
def test_pld_grid_estimate_bounds_the_grid_dp_accounting_builds(sigma, q):
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(standard_deviation=sigma, value_discretization_interval=1e-4,
                                                            sampling_prob=q)
    built = max(pld._pmf_remove.size, pld._pmf_add.size)
    assert built <= pld_round_points(sigma)
    if q == 1:  # tight without sampling (sampling only narrows the grid)
        assert pld_round_points(sigma) <= 1.05 * built


@pytest.mark.parametrize("args,field", [
    ((0.05, 0.1, 10), "noise"),        # a round's grid of 7.9e6 points: 25 s before
    ((1.0, 0.1, 10**9), "steps"),      # 2e10 points composed: asked for 154 GiB before
    ((2.0, 1.0, 10**6), "noise"),      # σ/√T = 0.002: killed for memory before
])
def test_pld_refuses_a_grid_too_large_before_allocating_it(args, field):
    with pytest.raises(UserInputError, match=f"^{field}: .*allowed: .*accountant 'rdp'"):
        compute_epsilon(GaussianSchedule(*args), 1e-5, accountant="pld")


@pytest.mark.parametrize("target,q,steps", [(1.0, 0.01, 1000), (8.0, 0.04, 2250), (30.0, 0.1, 10)])
def test_pld_calibration_round_trip_never_overshoots(target, q, steps):
    sigma = calibrate_noise(target, GaussianSchedule(1.0, q, steps), 1e-5, accountant="pld")
    value = eps(sigma, q, steps, 1e-5, accountant="pld")
    assert target * (1 - 1e-3) <= value <= target
    # and it is below the RDP's σ: the PLD is the tighter upper bound
    assert sigma <= calibrate_noise(target, GaussianSchedule(1.0, q, steps), 1e-5)


def test_pld_calibration_beyond_the_grid_is_one_line():
    with pytest.raises(UserInputError, match="^target-epsilon: 10000 cannot be calibrated with accountant 'pld'"):
        calibrate_noise(1e4, GaussianSchedule(1.0, 0.1, 10), 1e-5, accountant="pld")


# ------------------------------------------------------------------ closed forms and integration


def test_gaussian_rdp_closed_form():
    orders = [2.0, 3.0, 8.0, 32.0]
    for sigma in (0.7, 1.5, 4.0):
        np.testing.assert_allclose(rdp_per_round(GaussianSchedule(sigma, 1.0, 1), orders),
                                   [a / (2 * sigma ** 2) for a in orders], rtol=1e-12)


@pytest.mark.parametrize("order", [2, 3, 8])
def test_sampled_gaussian_rdp_matches_numerical_integration(order):
    """RDP(α) = log E_{z~μ0}[(μ(z)/μ0(z))^α]/(α−1), μ0 = N(0,σ²), μ = (1−q)μ0 + qN(1,σ²) (Mironov et al. 2019)."""
    q, sigma = 0.1, 1.2

    def integrand(z):
        mu0 = stats.norm.pdf(z, 0, sigma)
        mu = (1 - q) * mu0 + q * stats.norm.pdf(z, 1, sigma)
        return mu0 * (mu / mu0) ** order

    value, _ = integrate.quad(integrand, -40, 40, limit=400, epsabs=1e-14)
    expected = math.log(value) / (order - 1)
    assert rdp_per_round(GaussianSchedule(sigma, q, 1), [float(order)])[0] == pytest.approx(expected, rel=1e-8)


def test_classic_is_never_below_improved():
    for sigma, q, steps in [(1.0, 0.01, 1000), (2.0, 0.1, 50), (0.9, 1.0, 3)]:
        assert eps(sigma, q, steps, 1e-5, conversion="classic") >= eps(sigma, q, steps, 1e-5) - 1e-12


def test_rdp_to_epsilon_classic_definition():
    orders, rdp = [2.0, 4.0, 16.0], [0.5, 1.0, 2.5]
    expected = min(r + math.log(1e5) / (a - 1) for a, r in zip(orders, rdp))
    assert rdp_to_epsilon(orders, rdp, 1e-5, "classic")[0] == pytest.approx(expected, rel=1e-15)


# ------------------------------------------------------------------ properties


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.6, 5.0), q=st.floats(0.001, 0.5), steps=st.integers(1, 2000))
def test_epsilon_monotone(sigma, q, steps):
    base = eps(sigma, q, steps, 1e-5)
    assert eps(sigma, q, steps + 10, 1e-5) >= base - 1e-9
    assert eps(sigma, min(1.0, q * 1.5), steps, 1e-5) >= base - 1e-9
    assert eps(sigma * 1.2, q, steps, 1e-5) <= base + 1e-9


@settings(max_examples=8, deadline=None)
@given(target=st.floats(0.3, 12.0), q=st.floats(0.005, 1.0), steps=st.integers(1, 500),
       conversion=st.sampled_from(["improved", "classic"]))
def test_calibration_round_trip_never_overshoots(target, q, steps, conversion):
    sigma = calibrate_noise(target, GaussianSchedule(1.0, q, steps), 1e-5, conversion=conversion)
    value = eps(sigma, q, steps, 1e-5, conversion=conversion)
    assert value <= target
    assert value >= target * (1 - 1e-3)


def test_fixed_size_sampling():
    everyone = GaussianSchedule(2.0, 1.0, 10, "fixed", 20)
    assert compute_epsilon(everyone, 1e-5).epsilon == pytest.approx(eps(2.0, 1.0, 10, 1e-5))
    half = GaussianSchedule(2.0, 0.5, 10, "fixed", 20)
    assert "replace-one" in half.describe()
    assert compute_epsilon(half, 1e-5).epsilon > 0
    with pytest.raises(UserInputError, match="pld"):
        compute_epsilon(half, 1e-5, accountant="pld")


@pytest.mark.parametrize("kwargs,field", [
    (dict(noise_multiplier=0.0, sampling_rate=0.1, steps=10), "noise"),
    (dict(noise_multiplier=1.0, sampling_rate=1.5, steps=10), "rate"),
    (dict(noise_multiplier=1.0, sampling_rate=0.1, steps=-1), "steps"),
    (dict(noise_multiplier=1.0, sampling_rate=0.1, steps=1, sampling="bogus"), "sampling"),
])
def test_bad_schedules_are_rejected(kwargs, field):
    with pytest.raises(UserInputError, match=field):
        GaussianSchedule(**kwargs)


def test_bad_delta_and_conversion():
    with pytest.raises(UserInputError, match="delta"):
        compute_epsilon(GaussianSchedule(1.0, 0.1, 10), 0.0)
    with pytest.raises(UserInputError, match="conversion"):
        compute_epsilon(GaussianSchedule(1.0, 0.1, 10), 1e-5, conversion="fancy")


def test_calibration_finds_the_integer_order_dip():
    """ε is not unimodal in the order (dp-accounting's fractional orders are looser than the integers);
    a window of orders around one integer's dip once left σ 0.5 % too large here (found by Hypothesis)."""
    schedule = GaussianSchedule(1.0, 0.5, 264)
    sigma = calibrate_noise(9.5, schedule, 1e-5, conversion="improved")
    assert 9.5 * (1 - 1e-3) <= eps(sigma, 0.5, 264, 1e-5) <= 9.5


def test_the_written_out_default_orders_are_dp_accountings():
    """The RDP orders are written out (naming a defense loads no dp-accounting); they must be the
    library's defaults, order for order."""
    from dp_accounting.rdp import rdp_privacy_accountant

    from audit.core.vocabulary import Relation
    from defenses.privacy.accounting import DEFAULT_ORDERS, neighboring_relation

    assert tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS) == DEFAULT_ORDERS
    import dp_accounting

    assert neighboring_relation(Relation.ADD_REMOVE) is dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    assert neighboring_relation(Relation.REPLACE_ONE) is dp_accounting.NeighboringRelation.REPLACE_ONE
