"""Top-K selection against brute-force references, and the keep counts in exact decimal arithmetic:
FL-TOP's public Top-K, LUS's per-tensor top-s_j of |g ⊙ Δ|, DP-FedSAM-top_k's
per-tensor top-⌈p·d_l⌉."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_UP, Decimal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from defenses.blocks.sparsify import exact_count, exact_fraction, kept_per_tensor
from defenses.blocks.top_k_selection import select_top_k
from defenses.blur_lus import DPFedAvgLUS, LUSParams
from defenses.dp_fedsam import DPFedSAMTopK, DPFedSAMTopKParams
from tests.defenses.test_blur_lus import _round_context


def brute_top(scores: list[float], keep: int) -> set[int]:
    """The ``keep`` largest scores, ties to the lower index — by sorting (score, index) pairs."""
    return {i for _, i in sorted(((-s, i) for i, s in enumerate(scores)))[:keep]}


@pytest.mark.parametrize("fraction,size,rounding,expected", [
    (0.45, 10, "nearest", 5),  # (1 − 0.55)·10 = 4.5 → 5; floating point gives 4.4999999999999996 → 4
    (0.3, 10, "ceil", 3), (0.1, 30, "ceil", 3), (0.07, 100, "floor", 7), (0.05, 1210, "floor", 60),
])
def test_exact_counts(fraction, size, rounding, expected):
    assert exact_count(fraction, size, rounding) == expected


def test_exact_counts_match_decimal_arithmetic():
    """Against Python's decimal module for 2,000 random (share, size) pairs, every rounding."""
    rng = np.random.default_rng(0)
    modes = {"ceil": ROUND_CEILING, "floor": ROUND_FLOOR, "nearest": ROUND_HALF_UP}
    for _ in range(2000):
        share = round(float(rng.uniform(0.001, 1.0)), int(rng.integers(1, 5)))
        size = int(rng.integers(1, 5000))
        for rounding, mode in modes.items():
            exact = int((Decimal(repr(share)) * size).quantize(Decimal(1), rounding=mode))
            assert exact_count(share, size, rounding) == min(size, max(1, exact)), (share, size, rounding)
    assert exact_count(1 - exact_fraction(0.55), 10, "nearest") == 5  # what LUS computes for c = 0.55


def test_fl_top_selection_against_autograd_and_sorting(digits_job):
    """T_init SGD steps on the public batch accumulate Σ|g| (computed here with a plain autograd loop
    on a module copy); the K largest, ties to the lower index, sorted."""
    job = digits_job()
    model = job.model_factory()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = job.test_x[:10], job.test_y[:10]
    steps, lr, keep = 4, 0.1, 37
    reference = job.model_factory()
    with torch.no_grad():
        for n, p in reference.named_parameters():
            p.copy_(initial[n])
    accumulated = torch.zeros(sum(p.numel() for p in initial.values()), dtype=torch.float64)
    for _ in range(steps):
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        with torch.no_grad():
            accumulated += torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).abs().double()
            for p in reference.parameters():
                p -= lr * p.grad
    expected = sorted(brute_top(accumulated.tolist(), keep))
    chosen = select_top_k(model, initial, x, y, steps, lr, keep, "abs_gradient")
    assert chosen.tolist() == expected


def test_lus_mask_against_a_per_client_autograd_reference(digits_job):
    """s_j = round((1 − c)·d_j) entries of each tensor with the largest |g ⊙ Δ|, g the mean-loss gradient
    over the client's own records at w0 + Δ (dropout off), computed client by client with autograd."""
    job = digits_job()
    sparsity = 0.55
    defense = DPFedAvgLUS(LUSParams(lus_sparsity=sparsity))
    ctx, updates = _round_context(job, defense)
    _, mask = defense.pre_clip(updates, ctx)
    layout = ctx.layout
    for row, records in enumerate(ctx.client_data):
        model = job.model_factory()
        final = ctx.global_vector + updates[row]
        with torch.no_grad():
            for (name, part), shape in zip(layout.slices().items(), layout.shapes):
                dict(model.named_parameters())[name].copy_(final[part].view(shape))
        model.eval()
        index = torch.as_tensor(records)
        model.zero_grad()
        F.cross_entropy(model(job.pool_x[index]), job.pool_y[index]).backward()
        gradient = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        scores = (gradient * updates[row]).abs()
        for part, size in zip(layout.slices().values(), layout.sizes):
            keep = int(((1 - Decimal("0.55")) * size).quantize(Decimal(1), rounding=ROUND_HALF_UP))
            expected = brute_top(scores[part].tolist(), max(1, keep))
            got = set(np.flatnonzero(mask[row, part].numpy()).tolist())
            if got != expected:  # float ties broken differently only where the scores are equal to the last bit
                differing = got ^ expected
                assert len(differing) <= 2 and np.ptp([float(scores[part][i]) for i in differing]) < 1e-7
        assert int(mask[row].sum()) == sum(kept_per_tensor(layout, 1 - exact_fraction(sparsity), "nearest"))


@pytest.mark.parametrize("stage,source", [("before_noise", "clean"), ("after_noise", "clean"), ("after_noise", "noisy")])
def test_dp_fedsam_topk_masks_against_sorting(digits_job, stage, source):
    """Per tensor, ⌈p·d_l⌉ entries of the largest magnitude: of the raw update (before_noise — then the
    noise is dense: every coordinate of the upload is noisy), of the clean clipped update, or of the
    noisy upload itself."""
    job = digits_job()
    defense = DPFedSAMTopK(DPFedSAMTopKParams(topk_fraction=0.3, mask_stage=stage, topk_source=source, clip=0.5))
    ctx, updates = _round_context(job, defense)
    uploads, _ = defense.privatize(updates, ctx)
    clipped, _, _ = defense.clip(updates)
    for row in range(len(updates)):
        for part, size in zip(ctx.layout.slices().values(), ctx.layout.sizes):
            keep = math.ceil(Decimal("0.3") * size)
            nonzero = set(np.flatnonzero(uploads[row, part].numpy() != 0).tolist())
            if stage == "before_noise":
                assert len(nonzero) == size  # dense noise
                continue
            assert len(nonzero) == keep
            if source == "clean":
                assert nonzero == brute_top(clipped[row, part].abs().tolist(), keep)
            else:  # the mask came from the noisy upload: what it kept are its largest entries
                values = uploads[row, part].abs().numpy()
                assert values[sorted(nonzero)].min() >= np.delete(values, sorted(nonzero)).max(initial=0)


def test_dp_fedsam_topk_sound_default_sparsifies_before_clipping(digits_job):
    """before_noise: the upload minus its (dense) noise is clip(M ⊙ Δ), M the per-tensor top-⌈p·d⌉ of |Δ|;
    with σ → 0 the upload is that vector itself."""
    job = digits_job()
    defense = DPFedSAMTopK(DPFedSAMTopKParams(topk_fraction=0.3, clip=0.5, noise_multiplier=1e-12))
    ctx, updates = _round_context(job, defense)
    uploads, _ = defense.privatize(updates, ctx)
    for row in range(len(updates)):
        sparse = torch.zeros_like(updates[row])
        for part, size in zip(ctx.layout.slices().values(), ctx.layout.sizes):
            chosen = sorted(brute_top(updates[row, part].abs().tolist(), math.ceil(Decimal("0.3") * size)))
            sparse[part][chosen] = updates[row, part][chosen]
        expected = sparse * min(1.0, 0.5 / float(sparse.double().norm()))
        assert torch.allclose(uploads[row], expected, atol=1e-6)
