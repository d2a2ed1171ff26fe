"""Noise mechanisms (Gaussian, Laplace, the staircase of Geng & Viswanath 2015), their RDP curves and UDP-FL's
Harmonizer (Feng et al. 2024): densities, samplers, closed forms against integration, reference values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from audit.core.errors import UserInputError
from defenses.blocks.harmonizer import PAPER_ORDERS, dominance, epsilon, harmonize, rdp_per_step
from defenses.blocks.mechanisms import GaussianNoise, LaplaceNoise, StaircaseNoise, numeric_rdp
from defenses.privacy.accounting import GaussianSchedule, calibrate_noise, rdp_per_round

# ------------------------------------------------------------------ the staircase density and sampler


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_staircase_density(eps):
    """The staircase density: ∫f = 1; mass on [0, Δ) = (1 − b)/2; f(x) = e^ε·f(x + Δ) for x ≥ 0."""
    mechanism, delta = StaircaseNoise(eps), 0.7
    b, a, g = math.exp(-eps), mechanism.height(delta), mechanism.gamma
    steps = np.arange(0, 400)
    total = 2 * np.sum(a * delta * b ** steps * (g + (1 - g) * b))  # exact sum of the step masses
    assert total == pytest.approx(1.0, abs=1e-12)
    assert a * delta * (g + (1 - g) * b) == pytest.approx((1 - b) / 2, rel=1e-12)
    x = np.linspace(0, 5 * delta, 1001)
    assert np.allclose(mechanism.density(x, delta), math.exp(eps) * mechanism.density(x + delta, delta))
    assert np.allclose(mechanism.density(-x, delta), mechanism.density(x, delta))


def test_staircase_sampler_distribution_and_moments():
    """Geng's sampler: χ² against the exact bin probabilities; E|X| and Var at γ*, ε = 1, Δ = 1."""
    mechanism = StaircaseNoise(1.0)
    samples = mechanism.sample(torch.Generator().manual_seed(0), (400_000,)).numpy()
    assert mechanism.mean_abs() == pytest.approx(0.95952, abs=1e-5) and mechanism.variance() == pytest.approx(1.91968, abs=1e-5)
    n = len(samples)
    # 1e6-sample moments: standard errors ≈ 2e-3 (|X|) and 5e-3 (X²); allow 5 of them
    assert abs(np.abs(samples).mean() - 0.95952) < 5 * np.abs(samples).std() / math.sqrt(n)
    assert abs(samples.var() - 1.91968) < 5 * np.sqrt(np.var(samples ** 2) / n)
    # bins at the breakpoints ±(k + γ) and ±k: the G = −1 bug of the public code would put mass in the wrong bins
    g = mechanism.gamma
    edges = np.unique(np.concatenate([np.arange(-8, 9), np.arange(-8, 8) + g, -(np.arange(-8, 8) + g)]))
    edges = np.concatenate([[-np.inf], edges, [np.inf]])
    counts = np.histogram(samples, edges)[0]
    mids = (np.clip(edges[1:], -20, 20) + np.clip(edges[:-1], -20, 20)) / 2
    widths = np.diff(np.clip(edges, -8, 8))
    probabilities = mechanism.density(mids) * widths
    probabilities[0] = probabilities[-1] = (1 - probabilities[1:-1].sum()) / 2  # the two tails
    keep = probabilities * n > 5
    assert stats.chisquare(counts[keep], probabilities[keep] / probabilities[keep].sum() * counts[keep].sum()).pvalue > 1e-3


def test_laplace_and_gaussian_sampler_std():
    """Per-coordinate std zC (Gaussian) and √2·λC (Laplace) within 1 %."""
    generator = torch.Generator().manual_seed(1)
    assert GaussianNoise(1.3).sample(generator, (400_000,), 2.0).std().item() == pytest.approx(2.6, rel=0.01)
    assert LaplaceNoise(0.7).sample(generator, (400_000,), 2.0).std().item() == pytest.approx(math.sqrt(2) * 1.4, rel=0.01)


# ------------------------------------------------------------------ RDP curves


def test_staircase_rdp_reference_values_and_integration():
    """The staircase's RDP: closed form vs numerical ∫p^α q^{1−α} (< 1e-4) and the reference values."""
    assert StaircaseNoise(1.0).rdp_1d([2, 8]) == pytest.approx([0.710577, 0.948387], abs=1e-6)
    assert StaircaseNoise(0.5).rdp_1d([2])[0] == pytest.approx(0.223454, abs=1e-6)
    assert StaircaseNoise(2.0).rdp_1d([2])[0] == pytest.approx(1.811294, abs=1e-6)
    for eps in (0.3, 1.0, 2.5):
        mechanism = StaircaseNoise(eps)
        for order in (1.5, 2.0, 8.0, 30.0):
            assert mechanism.rdp_1d([order])[0] == pytest.approx(numeric_rdp(mechanism, order), rel=1e-4)


def test_staircase_rdp_limits_and_simplified_form():
    eps = 1.0
    mechanism = StaircaseNoise(eps)
    kl = 0.5 * (2 - math.exp(-eps / 2)) * eps * (1 - math.exp(-eps))
    assert mechanism.rdp_1d([1.000001])[0] == pytest.approx(kl, rel=1e-4)
    assert mechanism.rdp_1d([1e4])[0] == pytest.approx(eps, rel=2e-3)
    values = mechanism.rdp_1d(np.linspace(1.1, 60, 200))
    assert np.all(np.diff(values) > 0)
    orders = np.array([2.0, 5.0, 8.0])
    simplified = np.log(0.5 * (2 - math.exp(-eps / 2)) * (np.exp((orders - 1) * eps) + np.exp(-orders * eps))
                        + (math.cosh(eps / 2) - 1) * math.exp(-eps)) / (orders - 1)
    assert np.allclose(mechanism.rdp_1d(orders), simplified)


def test_staircase_small_shift_grows_linearly():
    """The discontinuous density: D(0.02Δ)/0.02 ≈ 21.1 at ε = 1, α = 8, versus D(Δ) = 0.948: a 1-D curve at
    shift Δ does not bound a shift spread over many coordinates."""
    mechanism = StaircaseNoise(1.0)
    assert numeric_rdp(mechanism, 8.0, shift=0.02) / 0.02 == pytest.approx(21.1, abs=0.1)
    slope = mechanism.small_shift_slope([8.0])[0]
    for shift in (1e-4, 1e-2, 0.3):  # exact for shifts below min(γ, 1 − γ)·Δ = 0.3775Δ
        assert numeric_rdp(mechanism, 8.0, shift=shift) == pytest.approx(math.log1p(shift * 7 * slope) / 7, rel=1e-9)
    assert math.isinf(mechanism.sound_rdp([8.0], "l2")[0]) and mechanism.sound_rdp([8.0], "l1")[0] == pytest.approx(slope)


def test_laplace_rdp_reference_values():
    """Laplace RDP (Mironov 2017): λ=1 → 0.619124 (α=2), 0.910199 (α=8); λ=.5, α=2 → 1.595774; λ=2 → 0.200304; ≤ α/(2λ²)."""
    assert LaplaceNoise(1.0).rdp_1d([2, 8]) == pytest.approx([0.619124, 0.910199], abs=1e-6)
    assert LaplaceNoise(0.5).rdp_1d([2])[0] == pytest.approx(1.595774, abs=1e-6)
    assert LaplaceNoise(2.0).rdp_1d([2])[0] == pytest.approx(0.200304, abs=1e-6)
    orders = np.array(PAPER_ORDERS)
    for lam in (0.3, 1.0, 4.0):
        assert np.all(LaplaceNoise(lam).rdp_1d(orders) <= LaplaceNoise(lam).sound_rdp(orders, "l2") + 1e-12)
        assert LaplaceNoise(lam).rdp_1d([3.0])[0] == pytest.approx(numeric_rdp(LaplaceNoise(lam), 3.0), rel=1e-4)


def test_gaussian_rdp():
    """q = 1 gives α/(2z²); the subsampled curve is dp-accounting's sampled Gaussian."""
    assert GaussianNoise(1.5).rdp_1d([2, 10]) == pytest.approx([2 / 4.5, 10 / 4.5])
    orders, rdp = rdp_per_step(GaussianNoise(1.1), 0.05)
    assert np.allclose(rdp, rdp_per_round(GaussianSchedule(1.1, 0.05, 1), orders))


# ------------------------------------------------------------------ the Harmonizer


@pytest.mark.parametrize("kind", ["gaussian", "laplace", "staircase"])
def test_harmonizer_meets_the_target_with_least_noise(kind):
    """The Harmonizer's least noise: ε_target − tol < ε(θ*) ≤ ε_target."""
    mechanism = harmonize(kind, 3.0, 1e-5, 0.05, 300)
    value = epsilon(mechanism, 0.05, 300, 1e-5)
    assert 3.0 * (1 - 1e-3) < value <= 3.0


def test_harmonizer_gaussian_is_dp_sgd():
    z = harmonize("gaussian", 2.0, 1e-5, 0.01, 1000).parameter
    assert z == pytest.approx(calibrate_noise(2.0, GaussianSchedule(1.0, 0.01, 1000), 1e-5, conversion="classic"), rel=1e-6)


def test_dominance_reference_values():
    """Dominance (no weaker than the Gaussian at every order): z = 1 gives λ ≈ 0.8269 and ε_s ≈ 1.0838; the binding
    order is the grid's smallest."""
    laplace, staircase = dominance("laplace", 1.0), dominance("staircase", 1.0)
    assert laplace.parameter == pytest.approx(0.8269, abs=1e-4) and staircase.parameter == pytest.approx(1.0838, abs=1e-4)
    assert math.sqrt(laplace.variance()) == pytest.approx(1.169, abs=1e-3)
    assert math.sqrt(staircase.variance()) == pytest.approx(1.274, abs=1e-3)
    gap = np.array(PAPER_ORDERS) / 2 - laplace.rdp_1d(PAPER_ORDERS)
    assert int(np.argmin(gap)) == 0


def test_monotonicity():
    """ε non-increasing in δ and in the noise; RDP linear in the number of steps."""
    mechanism = LaplaceNoise(1.5)
    assert epsilon(mechanism, 0.05, 200, 1e-6) >= epsilon(mechanism, 0.05, 200, 1e-4)
    assert epsilon(LaplaceNoise(2.0), 0.05, 200, 1e-5) <= epsilon(mechanism, 0.05, 200, 1e-5)
    assert epsilon(StaircaseNoise(0.5), 0.05, 200, 1e-5) <= epsilon(StaircaseNoise(1.0), 0.05, 200, 1e-5)


def test_sound_accounting():
    rate, steps = 0.05, 200
    assert epsilon(GaussianNoise(1.2), rate, steps, 1e-5, "sound") == epsilon(GaussianNoise(1.2), rate, steps, 1e-5, "paper_1d")
    assert epsilon(LaplaceNoise(1.2), rate, steps, 1e-5, "sound") > epsilon(LaplaceNoise(1.2), rate, steps, 1e-5, "paper_1d")
    assert epsilon(LaplaceNoise(1.2), rate, steps, 1e-5, "sound", "l1") == epsilon(LaplaceNoise(1.2), rate,
                                                                                   steps, 1e-5, "paper_1d")
    assert math.isinf(epsilon(StaircaseNoise(1.0), rate, steps, 1e-5, "sound"))
    assert math.isfinite(epsilon(StaircaseNoise(1.0), rate, steps, 1e-5, "sound", "l1"))
    with pytest.raises(UserInputError, match="no finite sound bound"):
        harmonize("staircase", 2.0, 1e-5, rate, steps, "sound", "l2")
