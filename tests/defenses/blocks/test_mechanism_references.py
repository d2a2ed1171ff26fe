"""Privatisation steps against references computed independently of the code path:
DP-SGD's clipped sum and per-example noise scale, SAM's perturbation, FL-CS-DP's compress-clip-noise,
fixed-size sampling accounting, and Poisson sampling exercised end to end."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from defenses.blocks.dp_sgd import DPSGDObjective
from defenses.blocks.mechanisms import make_mechanism
from defenses.dp_fedsam import sam_perturbation
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.engine import sample_participants
from defenses.federated.training_job import TrainingConfig
from defenses.fl_cs import FLCSDP, FLCSDPParams
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon, rdp_per_round
from defenses.privacy.subsampled_rdp import INTEGER_ORDERS, without_replacement_subsampled_rdp
from tests.defenses.test_blur_lus import _round_context


def _model_and_batch(digits, count=12):
    from audit.core.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, {"hidden": [16]})
    return model, digits.train.features[:count], digits.train.labels[:count]


def test_dp_sgd_step_against_a_per_example_autograd_loop(digits):
    """g̃·(q·n) − Σ_i clip(g_i) is the step's noise: per coordinate N(0, (zC)²) (χ² over 40 steps × d
    coordinates), with the clipped sum computed here one example at a time with autograd."""
    model, x, y = _model_and_batch(digits)
    clip, z, expected_batch = 0.3, 1.7, 5.0
    reference = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        reference += g * min(1.0, clip / float(g.norm()))
    mechanism = make_mechanism("gaussian", z)
    objective = DPSGDObjective(clip, "l2", lambda client: mechanism, lambda client: expected_batch, seed=5)
    params = {n: p.detach()[None] for n, p in model.named_parameters()}
    mask = torch.ones(1, len(y))
    noises = []
    for step in range(40):
        objective.at_step(step, [3])
        gradient = objective.batched_gradient(model, params, params, x[None], y[None], mask)
        flat = torch.cat([gradient[n][0].reshape(-1) for n, _ in model.named_parameters()]).double()
        noises.append((flat * expected_batch - reference).numpy())
    noise = np.stack(noises)
    assert abs(noise.mean()) < 4 * z * clip / math.sqrt(noise.size)  # the clipped sum is right: no offset
    statistic = float((noise ** 2).sum() / (z * clip) ** 2)
    assert stats.chi2.ppf(1e-4, noise.size) < statistic < stats.chi2.ppf(1 - 1e-4, noise.size)


@pytest.mark.parametrize("variant", ["sam", "asam"])
def test_sam_perturbation_against_autograd(digits, variant):
    """e = ρ·g/‖g‖ (SAM) or ρ·w²g/‖|w|g‖ (ASAM), g = ∇F(w; ξ) over all parameters, from autograd."""
    model, x, y = _model_and_batch(digits)
    rho = 0.05
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    named = dict(model.named_parameters())
    g = {n: p.grad.detach().clone() for n, p in named.items()}
    w = {n: p.detach().clone() for n, p in named.items()}
    if variant == "sam":
        norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in g.values()))
        expected = {n: rho * g[n] / norm for n in g}
    else:
        norm = math.sqrt(sum(float(((w[n].abs() * g[n]).double() ** 2).sum()) for n in g))
        expected = {n: rho * w[n] ** 2 * g[n] / norm for n in g}
    got = sam_perturbation({n: v[None] for n, v in w.items()}, {n: v[None] for n, v in g.items()}, rho, variant)
    for n in g:
        assert torch.allclose(got[n][0], expected[n], rtol=1e-5, atol=1e-9)
    total = math.sqrt(sum(float((got[n][0].double() ** 2).sum()) for n in g))
    if variant == "sam":
        assert total == pytest.approx(rho, rel=1e-6)


def test_fl_cs_dp_privatize_compresses_clips_and_noises(digits_job):
    """upload_i = clip_S(A·Δ_i) + N(0, (Sσ)²/m) with A the round's rows of the orthonormal DCT-II, built
    here from its definition: the noise-free part matches, and the noise has the claimed scale."""
    job = digits_job()
    defense = FLCSDP(FLCSDPParams(keep_fraction=0.1, clip=0.2, noise_multiplier=1e-9))
    ctx, updates = _round_context(job, defense)
    sketch = defense.sketch(ctx)
    dim = updates.shape[1]
    (start, stop), rows = sketch.bounds[0], sketch.rows[0]
    width = stop - start
    k = np.arange(width)
    dct = np.sqrt(2.0 / width) * np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * width))
    dct[0] /= math.sqrt(2.0)
    assert np.allclose(dct @ dct.T, np.eye(width), atol=1e-9)  # the reference is orthonormal
    compressed = updates.double().numpy()[:, start:stop] @ dct[rows].T
    expected = compressed * np.minimum(1.0, 0.2 / np.linalg.norm(compressed, axis=1))[:, None]
    uploads, _ = defense.privatize(updates, ctx)
    assert len(sketch.bounds) == 1 and dim == width
    assert np.allclose(uploads.numpy(), expected, atol=1e-7)
    noisy = FLCSDP(FLCSDPParams(keep_fraction=0.1, clip=0.2, noise_multiplier=2.0))
    clean = FLCSDP(FLCSDPParams(keep_fraction=0.1, clip=0.2, noise_multiplier=1e-9))
    samples = []
    for t in range(20):  # the sketch's rows change every round: compare each round with its own clean part
        ctx = replace(ctx, round=t)
        samples.append(noisy.privatize(updates, ctx)[0].numpy() - clean.privatize(updates, ctx)[0].numpy())
    noise = np.concatenate(samples).ravel()
    std = 0.2 * 2.0 / math.sqrt(len(updates))
    statistic = float((noise ** 2).sum() / std ** 2)
    assert stats.chi2.ppf(1e-4, noise.size) < statistic < stats.chi2.ppf(1 - 1e-4, noise.size)


def test_fixed_size_sampling_accounting_against_known_values():
    """Sampling m of N without replacement, replace-one neighbours (Wang, Balle, Kasiviswanathan 2019):
    at α = 2 the RDP is log(1 + γ²·min{4(e^{ε(2)} − 1), 2e^{ε(2)}}), ε(2) = 2·2/σ² (the sensitivity
    doubles), computed here by hand; our general bound agrees with dp-accounting's Gaussian one
    wherever both lie below the unsampled curve; m = N is the plain Gaussian with add/remove."""
    for sigma, m, population in ((1.3, 10, 200), (4.0, 5, 500), (0.8, 50, 250)):
        gamma = m / population
        eps2 = 2 * 2 / sigma ** 2
        by_hand = math.log1p(gamma ** 2 * min(4 * math.expm1(eps2), 2 * math.exp(eps2)))
        schedule = GaussianSchedule(sigma, gamma, 1, "fixed", population)
        assert rdp_per_round(schedule, [2.0])[0] == pytest.approx(by_hand, rel=1e-9)
        ours = without_replacement_subsampled_rdp(lambda a, s=sigma: 2 * a / s ** 2, gamma)
        assert ours[0] == pytest.approx(by_hand, rel=1e-9)
        library = rdp_per_round(schedule, [float(a) for a in INTEGER_ORDERS])
        base = 2 * np.array(INTEGER_ORDERS, dtype=float) / sigma ** 2
        below = library < base
        assert np.all(ours[below] >= library[below] * (1 - 1e-9))
        # replace-one is the stronger relation: never a smaller ε than Poisson add/remove at the same q
        assert compute_epsilon(schedule.with_steps(100), 1e-5).epsilon >= compute_epsilon(
            GaussianSchedule(sigma, gamma, 100), 1e-5).epsilon
    everyone = compute_epsilon(GaussianSchedule(1.1, 1.0, 50, "fixed", 20), 1e-5).epsilon
    assert everyone == compute_epsilon(GaussianSchedule(1.1, 1.0, 50), 1e-5).epsilon


def test_poisson_participants_follow_the_binomial_and_the_claim_amplifies(digits_job):
    """Poisson sampling at q: the number of participants of 400 rounds is Binomial(N, q) (χ² goodness of
    fit), empty rounds happen and still count, and training with q < 1 runs and is accounted at q."""
    clients, rate = 8, 0.3
    training = TrainingConfig(client_rate=rate)
    counts = np.array([len(sample_participants(clients, training, 3, t)) for t in range(400)])
    observed = np.bincount(counts, minlength=clients + 1)
    expected = 400 * stats.binom.pmf(np.arange(clients + 1), clients, rate)
    pooled_obs = np.r_[observed[:5], observed[5:].sum()]
    pooled_exp = np.r_[expected[:5], expected[5:].sum()]
    assert stats.chisquare(pooled_obs, pooled_exp).pvalue > 1e-3
    job = digits_job(rounds=12, client_rate=rate)
    outcome = DPFedAvg(DPFedAvgParams(noise_multiplier=1.0)).train(job)
    participants = [row["participants"] for row in outcome.metrics]
    assert len(set(participants)) > 1 and all(0 <= p <= clients for p in participants)
    assert outcome.claim.epsilon == pytest.approx(compute_epsilon(GaussianSchedule(1.0, rate, 12), 1e-5).epsilon)
    assert outcome.claim.against("server").epsilon > outcome.claim.epsilon
