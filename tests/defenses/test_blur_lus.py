"""BLUR and LUS (Cheng et al. 2022, §4.1–4.2, Alg. 2): the LUS mask, BLUR's penalty and its closed-form step,
the FedAvg limit, and the clip-and-noise error of Eq. 2."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from audit.core.errors import UserInputError
from defenses.blocks.flat import parameters_of
from defenses.blocks.local_training import LocalObjective, mean_loss_gradient
from defenses.blocks.sparsify import kept_per_tensor
from defenses.blur_lus import (
    BLURLUSParams,
    BLURObjective,
    BLURParams,
    DPFedAvgBLUR,
    DPFedAvgBLURLUS,
    DPFedAvgLUS,
    LUSParams,
    lus_mask,
)
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg
from defenses.federated.engine import FederatedEngine
from defenses.federated.training_job import TrainingConfig


def _same(a, b) -> bool:
    return all(torch.equal(a.final_params[k], b.final_params[k]) for k in a.final_params)


def _round_context(job, defense, round_index=0):
    """A round context built exactly as the engine builds it, with the clients' raw updates.

    Like the engine, it binds ``defense`` to the model's layout and prepares the run
    (:meth:`FederatedEngine.start`): the context carries the run's state. A defense is a value, so a
    caller that needs the bound one (a claim that depends on the layout) binds its own.
    """
    engine = FederatedEngine(defense, job)
    state = engine.start()
    participants = np.arange(len(job.clients))
    ctx = engine.context(round_index, participants, state.model, state.layout, state.global_vector, job.training.lr,
                         state.defense_state)
    return ctx, engine.local_updates(ctx)


def test_lambda_zero_and_c_zero_give_dp_fedavg_bit_for_bit(digits_job):
    job = digits_job(rounds=3)
    base = DPFedAvgParams(clip=0.5, noise_multiplier=0.8)
    reference = DPFedAvg(base).train(job)
    blur = DPFedAvgBLUR(BLURParams(clip=0.5, noise_multiplier=0.8, blur_lambda=0.0)).train(job)
    lus = DPFedAvgLUS(LUSParams(clip=0.5, noise_multiplier=0.8, lus_sparsity=0.0)).train(job)
    both = DPFedAvgBLURLUS(BLURLUSParams(clip=0.5, noise_multiplier=0.8, blur_lambda=0.0, lus_sparsity=0.0)).train(job)
    assert _same(reference, blur) and _same(reference, lus) and _same(reference, both)
    changed = DPFedAvgBLURLUS(BLURLUSParams(clip=0.5, noise_multiplier=0.8)).train(job)
    assert not _same(reference, changed)


def test_no_clip_no_noise_is_fedavg(digits_job):
    """S = ∞, σ → 0, λ = 0, c = 0: uniform FedAvg."""
    job = digits_job(rounds=3)
    plain = FedAvg().train(job)
    ours = DPFedAvgBLURLUS(BLURLUSParams(clip=1e6, noise_multiplier=1e-15, blur_lambda=0.0, lus_sparsity=0.0)).train(job)
    assert max(float((plain.final_params[k] - ours.final_params[k]).abs().max()) for k in plain.final_params) < 1e-5


def test_blur_penalty_gradient(digits_job):
    """Zero inside the ball ‖w − w0‖ ≤ S, λ(w − w0) outside; both paths agree."""
    job = digits_job()
    model = job.model_factory()
    anchor = parameters_of(model)
    generator = torch.Generator().manual_seed(0)
    offsets = {n: torch.randn(p.shape, generator=generator) for n, p in anchor.items()}
    distance = math.sqrt(sum(float((o ** 2).sum()) for o in offsets.values()))
    x, y = job.pool_x[:8][None], job.pool_y[:8][None]
    mask = torch.ones(1, 8)
    for radius, outside in ((distance * 2, False), (distance / 2, True)):
        params = {n: (anchor[n] + offsets[n])[None] for n in anchor}
        plain = LocalObjective().batched_gradient(model, params, anchor, x, y, mask)
        blur = BLURObjective(0.3, radius).batched_gradient(model, params, anchor, x, y, mask)
        for n in anchor:
            expected = 0.3 * offsets[n] if outside else torch.zeros_like(offsets[n])
            assert torch.allclose(blur[n][0] - plain[n][0], expected, atol=1e-6)
        # the loop path's explicit gradient is the same
        local = job.model_factory()
        with torch.no_grad():
            for n, p in local.named_parameters():
                p.copy_(params[n][0])
        BLURObjective(0.3, radius).module_backward(local, anchor, x[0], y[0])
        for n, p in local.named_parameters():
            assert torch.allclose(p.grad, blur[n][0], atol=1e-5)


def test_blur_closed_form_recursion(digits_job):
    """Outside the ball, one SGD step is u_q = (1 − λη)u_{q−1} − η·g_q exactly (BLUR, Cheng et al. 2022, §4.1)."""
    job = digits_job()
    model = job.model_factory()
    anchor = parameters_of(model)
    params = {n: (p + 0.5)[None] for n, p in anchor.items()}
    x, y, mask = job.pool_x[:8][None], job.pool_y[:8][None], torch.ones(1, 8)
    lam, lr = 0.4, 0.1
    g = LocalObjective().batched_gradient(model, params, anchor, x, y, mask)
    h = BLURObjective(lam, 0.01).batched_gradient(model, params, anchor, x, y, mask)
    for n in anchor:
        u_next = (params[n] - lr * h[n]) - anchor[n]
        assert torch.allclose(u_next, (1 - lam * lr) * (params[n] - anchor[n]) - lr * g[n], atol=1e-6)


def test_lemma2_step_size_condition():
    with pytest.raises(UserInputError, match="blur_lambda"):
        DPFedAvgBLUR(BLURParams(blur_lambda=20.0)).validate(TrainingConfig(lr=0.05), 10)
    DPFedAvgBLUR(BLURParams(blur_lambda=19.0)).validate(TrainingConfig(lr=0.05), 10)


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.7, 0.95])
def test_lus_mask_counts_and_choice(digits_job, sparsity):
    """LUS (Cheng et al. 2022, §4.2): exactly s_j = max(1, round((1 − c)·d_j)) ones per tensor, at the largest |g ⊙ Δ|."""
    job = digits_job()
    defense = DPFedAvgLUS(LUSParams(lus_sparsity=sparsity))
    ctx, updates = _round_context(job, defense)
    mask = lus_mask(updates, ctx, sparsity, "full")
    layout = ctx.layout
    expected = kept_per_tensor(layout, 1 - sparsity, "nearest")
    assert expected == [max(1, math.floor((1 - sparsity) * d + 0.5)) for d in layout.sizes]
    # recompute |g ⊙ Δ| independently for client 0
    final = ctx.global_vector + updates[0]
    stacked = {n: final[part].view(1, *shape) for (n, part), shape in zip(layout.slices().items(), layout.shapes)}
    g = layout.flatten_stacked(mean_loss_gradient(ctx.model, stacked, [ctx.client_data[0]], ctx.pool_x, ctx.pool_y))[0]
    scores = (g * updates[0]).abs()
    for part, count in zip(layout.slices().values(), expected):
        assert int(mask[:, part].sum(1).min()) == int(mask[:, part].sum(1).max()) == count
        kept, dropped = scores[part][mask[0, part]], scores[part][~mask[0, part]]
        if len(dropped):
            assert float(kept.min()) >= float(dropped.max())
    sparse, _ = defense.pre_clip(updates, ctx)
    assert (torch.linalg.vector_norm(sparse, dim=1) <= torch.linalg.vector_norm(updates, dim=1) + 1e-7).all()
    if sparsity == 0.0:
        assert torch.equal(sparse, updates)


def test_lus_full_data_gradient_is_batching_invariant(digits_job):
    job = digits_job()
    model = job.model_factory()
    params = {n: p[None].repeat(2, *([1] * p.dim())) for n, p in parameters_of(model).items()}
    sets = [job.clients[0], job.clients[1]]
    small = mean_loss_gradient(model, params, sets, job.pool_x, job.pool_y, batch_size=3)
    large = mean_loss_gradient(model, params, sets, job.pool_x, job.pool_y, batch_size=1000)
    for n in small:
        assert torch.allclose(small[n], large[n], atol=1e-6)


def test_lus_noise_covers_masked_coordinates(digits_job):
    """The LUS mask is data-dependent, so noise goes on all d coordinates (Alg. 2)."""
    job = digits_job()
    defense = DPFedAvgLUS(LUSParams(lus_sparsity=0.9, noise_multiplier=1.0))
    ctx, updates = _round_context(job, defense)
    uploads, _ = defense.bind(ctx.layout).privatize(updates, ctx)
    assert (uploads != 0).all()


def test_lus_last_batch_option_trains(digits_job):
    outcome = DPFedAvgBLURLUS(BLURLUSParams(lus_gradient="last_batch", noise_multiplier=0.5)).train(digits_job(rounds=2))
    assert math.isfinite(outcome.metrics[-1]["test_loss"])


def test_clip_then_noise_error_decomposition(digits_job):
    """Cheng et al. 2022, Eq. 2: E‖Δ̄ − Δ‖²/d = (max(0, ‖Δ‖ − S))²/d + σ²S²/|P_t|."""
    dim, participants, clip, sigma = 200_000, 4, 1.0, 0.7
    generator = torch.Generator().manual_seed(5)
    updates = torch.randn(participants, dim, generator=generator) * 0.01  # norms ≈ 4.5 > S
    job = digits_job()
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma))
    ctx, _ = _round_context(job, defense)
    ctx = replace(ctx, participants=np.arange(participants), sizes=np.ones(participants))
    uploads, _ = defense.privatize(updates, ctx)
    norms = torch.linalg.vector_norm(updates.double(), dim=1)
    expected = (norms - clip).clamp_min(0) ** 2 / dim + sigma ** 2 * clip ** 2 / participants
    observed = ((uploads.double() - updates.double()) ** 2).sum(1) / dim
    # each observed value averages 2e5 squared Gaussians: relative sd ≈ √(2/2e5) ≈ 0.3 %
    assert torch.allclose(observed, expected, rtol=0.02)
