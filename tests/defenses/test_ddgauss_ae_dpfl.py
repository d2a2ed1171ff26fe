"""DDGauss (Kairouz, Liu & Steinke 2021) and AE-DPFL (Zhu et al. 2020), the baselines of Cheng et al. 2022:
building blocks, decoding, accounting."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from audit.core.errors import UserInputError
from defenses.ae_dpfl import AEDPFL, AEDPFLParams, vote_histogram
from defenses.base import AccountingSettings
from defenses.blocks.clipping import clip_rows
from defenses.blocks.flat import ParamLayout
from defenses.blocks.noise import discrete_gaussian
from defenses.blocks.rotation import hadamard, padded_dimension, random_signs, rotate, unrotate
from defenses.blocks.secure_aggregation import modular_sum, wrap
from defenses.ddgauss import DDGauss, DDGaussParams, DDGaussSetting
from defenses.federated.canary_clients import add_canaries
from defenses.federated.training_job import TrainingConfig
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon, rdp_per_round, rdp_to_epsilon
from defenses.privacy.subsampled_rdp import poisson_subsampled_rdp
from tests.defenses.test_blur_lus import _round_context


def test_rotation_is_orthonormal_and_invertible():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, dtype=torch.float64, generator=generator)
    signs = random_signs(64, generator)
    y = rotate(x, signs)
    assert torch.allclose(torch.linalg.vector_norm(y, dim=1), torch.linalg.vector_norm(x, dim=1))
    assert torch.allclose(unrotate(y, signs), x, atol=1e-12)
    matrix = hadamard(torch.eye(8, dtype=torch.float64))
    assert torch.allclose(matrix @ matrix, 8 * torch.eye(8, dtype=torch.float64))
    assert padded_dimension(9610) == 16384 and padded_dimension(1024) == 1024


def test_modular_arithmetic():
    values = torch.tensor([[32767, -32768, 5], [1, -1, -10]], dtype=torch.int64)
    assert modular_sum(values, 16).tolist() == [-32768, 32767, -5]
    assert wrap(torch.tensor([65536 + 3]), 16).tolist() == [3]


def test_discrete_gaussian_pmf():
    """χ² goodness of fit of 200k samples against P(y) ∝ exp(−y²/(2σ²)) (CKS sampler)."""
    rng = np.random.default_rng(3)
    for sigma in (0.8, 3.0):
        samples = discrete_gaussian(rng, sigma, 200_000)
        support = np.arange(-int(6 * sigma) - 1, int(6 * sigma) + 2)
        pmf = np.exp(-support ** 2 / (2 * sigma ** 2))
        pmf /= pmf.sum()
        counts = np.array([(samples == v).sum() for v in support])
        keep = pmf * len(samples) >= 5
        expected = pmf[keep] * len(samples)
        observed = counts[keep] * expected.sum() / counts[keep].sum()
        assert stats.chisquare(observed, expected).pvalue > 1e-3
        assert abs(samples.mean()) < 5 * sigma / math.sqrt(len(samples))


def _setting(**overrides) -> DDGaussSetting:
    values = dict(clip=1.0, local_std=0.2, gamma=1e-3, beta=math.exp(-0.5), dim=1024, clients=10)
    values.update(overrides)
    return DDGaussSetting(**values)


def test_ddgauss_rdp_approaches_the_gaussian_when_rounding_is_fine():
    """With a tiny γ the discrete mechanism's RDP tends to the continuous Gaussian's α·l2²/2."""
    setting = _setting(gamma=1e-7, beta=0.0)
    sigma_total = setting.local_std * math.sqrt(setting.clients)
    orders = np.array([2.0, 8.0, 32.0])
    assert np.allclose(setting.rdp(orders), orders / (2 * (sigma_total / setting.clip) ** 2), rtol=1e-3)
    coarse = _setting(gamma=1e-2)
    assert (coarse.rdp(orders) > setting.rdp(orders)).all()  # rounding inflates the sensitivity


def test_zhu_wang_bound_is_sound_for_the_gaussian():
    """The general bound never undercuts the exact subsampled-Gaussian RDP and is tight at α = 2."""
    sigma, rate = 1.5, 0.05
    orders = [2, 3, 10, 40]
    general = poisson_subsampled_rdp(lambda a: a / (2 * sigma ** 2), rate, orders)
    exact = rdp_per_round(GaussianSchedule(sigma, rate, 1), [float(a) for a in orders])
    assert (general >= exact - 1e-12).all() and general[0] == pytest.approx(exact[0], rel=1e-9)


def _bound_ddgauss(job, **params):
    layout = ParamLayout.of(job.model_factory())
    return DDGauss(DDGaussParams(**params), layout)


def test_ddgauss_zero_noise_decodes_to_the_mean(digits_job):
    """σ_loc = 0 and many bits decode to the mean of the clipped updates within γ√d′/n.

    γ√d′/n is a high-probability bound for n ≤ 6 clients (the rounding errors are independent with
    variance ≤ 1/4, so the typical error of the mean is γ√(d′/(6n))); the worst case is γ√d′."""
    job = digits_job(sampling="fixed", clients_per_round=4)
    defense = _bound_ddgauss(job, noise_multiplier=0.0, bits=16, clip=0.5)
    ctx, updates = _round_context(job, defense)
    ctx = replace(ctx, participants=ctx.participants[:4], client_data=ctx.client_data[:4])
    updates = updates[:4]
    setting = defense.setting(ctx.training, ctx.num_clients)
    uploads, _ = defense.privatize(updates, ctx)
    decoded = defense.aggregate(uploads, ctx)
    clipped, _, _ = clip_rows(updates.double(), 0.5)
    error = float(torch.linalg.vector_norm(decoded.double() - clipped.mean(0)))
    assert error <= setting.gamma * math.sqrt(setting.dim) / 4
    assert error > 0, "rounding leaves some error"


def test_ddgauss_rounded_norm_bound_and_uploads_in_range(digits_job):
    job = digits_job(sampling="fixed", clients_per_round=8)
    defense = _bound_ddgauss(job, noise_multiplier=0.0, bits=20, clip=0.5)
    ctx, updates = _round_context(job, defense)
    setting = defense.setting(ctx.training, ctx.num_clients)
    uploads, _ = defense.privatize(updates, ctx)
    assert uploads.dtype == torch.int64 and uploads.shape[1] == setting.dim
    assert int(uploads.abs().max()) < 2 ** 19
    norms = torch.linalg.vector_norm(uploads.double(), dim=1)  # no noise, no wrap: the rounded vectors
    assert (norms <= setting.rounded_l2 + 1e-9).all()


def test_ddgauss_calibration_and_trajectory(digits_job):
    job = digits_job(rounds=5, sampling="fixed", clients_per_round=4)
    defense = _bound_ddgauss(job)
    calibrated = defense.calibrate(6.0, job.delta, job.training, 8, AccountingSettings())
    claim = calibrated.privacy_claim(job.training, 8, 5, job.delta, AccountingSettings())
    assert claim.epsilon <= 6.0 and claim.epsilon == pytest.approx(6.0, rel=1e-3)
    assert "discrete Gaussian" in claim.mechanism and claim.unit == "client"
    trajectory = calibrated.epsilon_trajectory(job.training, 8, job.delta, AccountingSettings())
    assert trajectory[-1] == pytest.approx(claim.epsilon) and all(b > a for a, b in zip(trajectory, trajectory[1:]))
    outcome = calibrated.train(job)
    assert math.isfinite(outcome.metrics[-1]["test_loss"]) and outcome.claim.epsilon == pytest.approx(claim.epsilon)


def test_ddgauss_at_fine_granularity_matches_the_continuous_gaussian():
    """With many bits the discrete mechanism is the continuous Gaussian: every client every round gives
    dp-accounting's T-fold Gaussian ε (σ, zero-out sensitivity); a fixed-size sample of m < N gives at
    least dp-accounting's sampled-without-replacement Gaussian ε (replace-one) and not much more (our
    general Wang–Balle–Kasiviswanathan bound is its Thm. 9, dp-accounting's the Gaussian Thm. 27)."""
    layout = ParamLayout(("w",), ((1000,),))
    defense = DDGauss(DDGaussParams(noise_multiplier=3.0, bits=60, beta=0.0), layout)
    everyone = TrainingConfig(rounds=10)
    claim = defense.privacy_claim(everyone, 100, 10, 1e-5, AccountingSettings())
    orders = list(range(2, 129)) + [256]  # DDGauss's bound holds at integer orders: compare on the same grid
    reference = rdp_to_epsilon(orders, 10 * np.array(orders) / (2 * 3.0 ** 2), 1e-5, "improved")[0]
    assert claim.epsilon == pytest.approx(reference, rel=0.01) and claim.epsilon >= reference * (1 - 1e-3)
    assert claim.relation == "zero-out"
    defense = DDGauss(DDGaussParams(noise_multiplier=1.2, bits=60, beta=0.0), layout)
    sampled = TrainingConfig(rounds=100, sampling="fixed", clients_per_round=10)
    claim = defense.privacy_claim(sampled, 100, 100, 1e-5, AccountingSettings())
    reference = compute_epsilon(GaussianSchedule(1.2, 0.1, 100, "fixed", 100), 1e-5).epsilon
    assert claim.relation == "replace-one" and reference <= claim.epsilon <= 1.1 * reference


def test_ddgauss_needs_a_fixed_number_of_clients_per_round():
    """Poisson rounds with fewer clients than expected would carry less noise than accounted."""
    defense = DDGauss(DDGaussParams(), ParamLayout(("w",), ((100,),)))
    with pytest.raises(UserInputError, match="training.sampling"):
        defense.validate(TrainingConfig(client_rate=0.5), 10)
    defense.validate(TrainingConfig(sampling="fixed", clients_per_round=5), 10)
    defense.validate(TrainingConfig(client_rate=1.0), 10)


def _real_round(job, defense, clients: int):
    """The engine's round context for the first ``clients`` clients of ``job``, with zero updates."""
    ctx, updates = _round_context(job, defense)
    ctx = replace(ctx, participants=ctx.participants[:clients], sizes=ctx.sizes[:clients], client_data=ctx.client_data[:clients])
    return ctx, torch.zeros_like(updates[:clients])


def test_ddgauss_refuses_a_round_whose_realised_count_is_not_n(digits_job):
    """σ_loc = σc/√n is set from the configured n: with n − 1 clients the summed noise would be σc·√((n−1)/n),
    less than accounted, so such a round is refused rather than released; canary clients beyond the n
    real ones do not count (they add no share)."""
    job = digits_job(sampling="fixed", clients_per_round=4)
    defense = _bound_ddgauss(job, noise_multiplier=1.0, clip=0.5)
    for count in (3, 5):
        ctx, updates = _real_round(job, defense, count)
        with pytest.raises(ValueError, match="exactly n = 4"):
            defense.privatize(updates, ctx)
        with pytest.raises(ValueError, match="exactly n = 4"):
            defense.aggregate(torch.zeros(count, padded_dimension(ctx.layout.dim), dtype=torch.int64), ctx)
    ctx, updates = _real_round(job, defense, 4)
    defense.aggregate(defense.privatize(updates, ctx)[0], ctx)


def test_ddgauss_summed_noise_is_the_accounted_one_with_and_without_canaries(digits_job):
    """With zero updates nothing is rounded, so the modular sum the server sees is the clients' noise alone.
    The claim accounts it as variance (σ_srv·c)² per coordinate — σ_srv the server figure's noise
    multiplier, per change c of one client (zero-out) — whoever joins the round. Canary clients added
    by the engine's own injection (here with zero updates, so they only could add noise) must leave it
    so. The d′ coordinates are independent, so with v the accounted variance N·s²/v ~ χ²_N (a sum of
    discrete Gaussians of scale 2500 is Gaussian far within the tolerance): s² must lie in
    [χ²_N(α/2), χ²_N(1 − α/2)]·v/N at α = 1e-6."""

    clip, sigma = 0.5, 1.0
    job = digits_job(sampling="fixed", clients_per_round=4)
    # γ fixed and 40 bits: the sum (std σc/γ = 5000 in integer units) never wraps
    defense = _bound_ddgauss(job, noise_multiplier=sigma, clip=clip, bits=40, gamma=1e-4)
    claim = defense.privacy_claim(job.training, 8, job.training.rounds, job.delta, AccountingSettings())
    server = claim.against("server")
    assert server.relation == "zero-out"
    accounted = (server.noise_multiplier * clip) ** 2
    released = claim.against("released")  # replace-one under fixed-size sampling: σ/2 per change of 2c, the same noise
    assert released.relation == "replace-one" and (released.noise_multiplier * 2 * clip) ** 2 == pytest.approx(accounted)

    ctx, updates = _real_round(job, defense, 4)
    dim = padded_dimension(ctx.layout.dim)
    low, high = (stats.chi2.ppf(q, dim) / dim * accounted for q in (0.5e-6, 1 - 0.5e-6))
    setting = defense.setting(job.training, 8)

    def summed_variance(uploads: torch.Tensor) -> float:
        total = modular_sum(uploads, defense.params.bits).to(torch.float64) * setting.gamma
        return float((total ** 2).mean())

    uploads, _ = defense.privatize(updates, ctx)
    assert low <= summed_variance(uploads) <= high

    canaries = replace(job, update_canaries=torch.zeros(16, ctx.layout.dim))
    with_canaries, canary_ctx = add_canaries(defense, canaries, updates, ctx, {})
    joined = len(canary_ctx.participants) - 4
    assert joined > 0 and (canary_ctx.participants[4:] >= 8).all()
    uploads, _ = defense.privatize(with_canaries, canary_ctx)
    assert len(uploads) == 4 + joined
    assert low <= summed_variance(uploads) <= high, f"{joined} canary clients changed the summed noise"
    # the released mean is that sum over the configured n, whoever joined
    decoded = defense.aggregate(uploads, canary_ctx).double()
    signs = random_signs(setting.dim, canary_ctx.server_generator("rotation"))
    total = unrotate(modular_sum(uploads, defense.params.bits).to(torch.float64) * setting.gamma, signs)
    assert torch.allclose(decoded, (total[: ctx.layout.dim] / 4).float().double())


def test_vote_histogram_sums_to_the_voters():
    predictions = torch.tensor([[0, 1, 2], [0, 2, 2], [1, 1, 2], [0, 0, 0]])
    histogram = vote_histogram(predictions, 3)
    assert histogram.sum(1).tolist() == [4, 4, 4]
    assert histogram[0].tolist() == [3, 1, 0]
    # sensitivity 1: removing one voter changes each histogram by one one-hot vector
    difference = histogram - vote_histogram(predictions[:3], 3)
    assert torch.linalg.vector_norm(difference, dim=1).tolist() == [1.0, 1.0, 1.0]


def test_ae_dpfl_trains_and_claims(digits_job):
    job = digits_job()
    defense = AEDPFL(AEDPFLParams(queries=50, local_epochs=3, server_epochs=5)).calibrate(
        4.0, 1e-5, job.training, len(job.clients), AccountingSettings())
    outcome = defense.train(job)
    row = outcome.metrics[0]
    assert row["queries"] == 50 and 0 <= row["vote_accuracy"] <= 1 and math.isfinite(row["test_accuracy"])
    assert outcome.claim.epsilon == pytest.approx(4.0, rel=1e-3) and outcome.claim.epsilon <= 4.0
    expected = compute_epsilon(GaussianSchedule(defense.params.noise_multiplier, 1.0, 50), 1e-5).epsilon
    assert outcome.claim.epsilon == pytest.approx(expected)
    # overwhelming noise leaves labels at chance (10 classes), whatever the agents agree on
    loud = AEDPFL(AEDPFLParams(queries=50, local_epochs=20, server_epochs=5, noise_multiplier=1e4)).train(job)
    assert loud.metrics[0]["vote_accuracy"] < 0.3 < 0.5 < loud.metrics[0]["noiseless_vote_accuracy"]
