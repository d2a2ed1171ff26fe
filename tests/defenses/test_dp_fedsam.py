"""DP-FedSAM, DP-FedSAM-top_k (Shi et al. 2023) and Fed-SMP (Hu et al. 2022): reductions, the SAM step,
clipping, noise, top-k masks, sampling and accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from audit.core.errors import UserInputError
from defenses.base import AccountingSettings
from defenses.blocks.flat import ParamLayout, parameters_of
from defenses.blocks.local_training import LocalObjective
from defenses.blocks.sparsify import kept_per_tensor
from defenses.dp_fedsam import (
    DPFedSAM,
    DPFedSAMParams,
    DPFedSAMTopK,
    DPFedSAMTopKParams,
    FedSAM,
    FedSAMParams,
    SAMObjective,
    sam_perturbation,
)
from defenses.fed_smp import FedSMPParams, FedSMPRandK, FedSMPTopK
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg, NoiseSupport
from defenses.federated.training_job import TrainingConfig
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon
from tests.defenses.test_blur_lus import _round_context, _same


def test_reductions_bit_for_bit(digits_job):
    """ρ = 0 gives DP-FedAvg; p = 1 gives DP-FedSAM; same seed, same bits."""
    job = digits_job(rounds=3, momentum=0.5, weight_decay=5e-4)
    dp_fedavg = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=0.9)).train(job)
    rho_zero = DPFedSAM(DPFedSAMParams(clip=0.5, noise_multiplier=0.9, rho=0.0)).train(job)
    assert _same(dp_fedavg, rho_zero)
    dp_fedsam = DPFedSAM(DPFedSAMParams(clip=0.5, noise_multiplier=0.9, rho=0.05)).train(job)
    p_one = DPFedSAMTopK(DPFedSAMTopKParams(clip=0.5, noise_multiplier=0.9, rho=0.05, topk_fraction=1.0)).train(job)
    assert _same(dp_fedsam, p_one) and not _same(dp_fedsam, dp_fedavg)


def test_no_noise_no_clip_gives_fedsam_and_fedavg(digits_job):
    job = digits_job(rounds=2)
    fedsam = FedSAM(FedSAMParams(rho=0.05)).train(job)
    dp = DPFedSAM(DPFedSAMParams(clip=1e6, noise_multiplier=1e-15, rho=0.05)).train(job)
    assert max(float((fedsam.final_params[k] - dp.final_params[k]).abs().max()) for k in dp.final_params) < 1e-5
    assert _same(FedSAM(FedSAMParams(rho=0.0)).train(job), FedAvg().train(job))


@pytest.mark.parametrize("variant", ["sam", "asam"])
def test_sam_perturbation_radius(variant):
    generator = torch.Generator().manual_seed(1)
    params = {"a": torch.randn(3, 4, 5, generator=generator), "b": torch.randn(3, 7, generator=generator)}
    grads = {"a": torch.randn(3, 4, 5, generator=generator), "b": torch.randn(3, 7, generator=generator)}
    e = sam_perturbation(params, grads, 0.25, variant)
    if variant == "sam":  # ‖e‖₂ = ρ per client, over all tensors
        measured = torch.sqrt((e["a"] ** 2).sum((1, 2)) + (e["b"] ** 2).sum(1))
    else:  # ASAM: ‖T_w⁻¹ e‖₂ = ρ with T_w = |w|
        measured = torch.sqrt(((e["a"] / params["a"].abs()) ** 2).sum((1, 2)) + ((e["b"] / params["b"].abs()) ** 2).sum(1))
    assert torch.allclose(measured, torch.full((3,), 0.25), rtol=1e-5)


def test_sam_loop_restores_weights_and_matches_batched(digits_job):
    job = digits_job()
    model = job.model_factory()
    anchor = parameters_of(model)
    x, y = job.pool_x[:10], job.pool_y[:10]
    objective = SAMObjective(0.1, "sam")
    batched = objective.batched_gradient(model, {n: p[None] for n, p in anchor.items()}, anchor, x[None], y[None],
                                         torch.ones(1, 10))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    objective.module_backward(model, anchor, x, y)
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), before[n], atol=1e-7), "weights restored before the base step"
        assert torch.allclose(p.grad, batched[n][0], atol=1e-5)
    plain = LocalObjective().batched_gradient(model, {n: p[None] for n, p in anchor.items()}, anchor, x[None], y[None],
                                              torch.ones(1, 10))
    assert any(not torch.allclose(plain[n], batched[n]) for n in plain), "the SAM gradient is taken at w + e"


def test_topk_support_counts_order_and_noise(digits_job):
    """Shi et al. 2023, Eq. 12 (mask_stage after_noise): nnz = Σ_l ⌈p·d_l⌉; kept |·| ≥ dropped in
    each layer; no noise on dropped coordinates — so a clean-update mask releases its support (no finite
    claim) and a noisy one is post-processing of one upload. The sound default keeps every coordinate noisy."""
    job = digits_job()
    for source in ("clean", "noisy"):
        defense = DPFedSAMTopK(DPFedSAMTopKParams(topk_fraction=0.3, topk_source=source, noise_multiplier=1.0, clip=0.5,
                                                  mask_stage="after_noise"))
        ctx, updates = _round_context(job, defense)
        uploads, _ = defense.privatize(updates, ctx)
        keep = kept_per_tensor(ctx.layout, 0.3, "ceil")
        assert keep == [math.ceil(0.3 * d) for d in ctx.layout.sizes]
        clipped, _, _ = defense.clip(updates)
        for part, count in zip(ctx.layout.slices().values(), keep):
            support = uploads[:, part] != 0
            assert (support.sum(1) == count).all()
            if source == "clean":  # the kept coordinates are the largest of the clean clipped update
                for row in range(len(updates)):
                    kept = clipped[row, part][support[row]].abs()
                    dropped = clipped[row, part][~support[row]].abs()
                    if len(dropped):
                        assert float(kept.min()) >= float(dropped.max())
        assert (defense.noise_support().leak is not None) == (source == "clean")
    sound = DPFedSAMTopK(DPFedSAMTopKParams(topk_fraction=0.3, noise_multiplier=1.0, clip=0.5))
    ctx, updates = _round_context(job, sound)
    uploads, _ = sound.privatize(updates, ctx)
    assert bool((uploads != 0).all()) and sound.noise_support() == NoiseSupport()


@pytest.mark.parametrize("cls", [FedSMPRandK, FedSMPTopK])
def test_fed_smp_noise_support(digits_job, cls):
    """The paper's variant (noise_support kept) noises only the k = ⌈p·d⌉ kept coordinates, top_k's being the
    largest; the sound default noises every coordinate."""
    job = digits_job()
    k = math.ceil(0.25 * ParamLayout.of(job.model_factory()).dim)
    for support_mode in ("kept", "dense"):
        defense = cls(FedSMPParams(keep_fraction=0.25, noise_multiplier=1.0, clip=0.5, noise_support=support_mode))
        ctx, updates = _round_context(job, defense)
        uploads, _ = defense.privatize(updates, ctx)
        nonzero = (uploads != 0).sum(1)
        if support_mode == "dense":
            assert (nonzero == updates.shape[1]).all()
            continue
        assert (nonzero == k).all(), "noise only on the k kept coordinates"
        if cls is FedSMPTopK:
            support = uploads != 0
            for row in range(len(updates)):
                assert float(updates[row][support[row]].abs().min()) >= float(updates[row][~support[row]].abs().max())


def test_random_k_masks_differ_between_clients_and_rounds(digits_job):
    job = digits_job()
    defense = FedSMPRandK(FedSMPParams(keep_fraction=0.1))
    ctx, updates = _round_context(job, defense)
    first, _ = defense.pre_clip(updates, ctx)
    later, _ = defense.pre_clip(updates, _round_context(job, defense, round_index=1)[0])
    assert not torch.equal(first[0] != 0, first[1] != 0) and not torch.equal(first[0] != 0, later[0] != 0)


def test_noise_std_of_the_family(digits_job):
    """Per-client std σC/√m on every noised coordinate (the mean's sensitivity is C/m: Shi et al. 2023, Lemma 1)."""
    job = digits_job()
    clip, sigma = 0.4, 1.3
    defense = DPFedSAM(DPFedSAMParams(clip=clip, noise_multiplier=sigma))
    ctx, _ = _round_context(job, defense)
    uploads, _ = defense.privatize(torch.zeros(len(ctx.participants), 20000), ctx)
    values = uploads.double().flatten().numpy()
    std = clip * sigma / math.sqrt(len(ctx.participants))
    statistic = float((values ** 2).sum() / std ** 2)
    assert stats.chi2.ppf(5e-4, values.size) < statistic < stats.chi2.ppf(1 - 5e-4, values.size)


def test_per_tensor_clipping_is_accounted_with_sigma_over_sqrt_l(digits_job):
    job = digits_job()
    layout = ParamLayout.of(job.model_factory())
    defense = DPFedSAM(DPFedSAMParams(clip_mode="per_tensor", clip=0.3, noise_multiplier=2.0), layout)
    tensors = len(layout.names)
    training = TrainingConfig(rounds=50, client_rate=0.5)
    claim = defense.privacy_claim(training, 8, 50, 1e-5, AccountingSettings())
    assert claim.epsilon == pytest.approx(compute_epsilon(GaussianSchedule(2.0 / math.sqrt(tensors), 0.5, 50), 1e-5).epsilon)
    assert "per-tensor" in claim.notes
    ctx, updates = _round_context(job, defense)
    clipped, _, _ = defense.clip(updates * 100)
    for part in layout.slices().values():
        assert (torch.linalg.vector_norm(clipped[:, part].double(), dim=1) <= 0.3 * (1 + 1e-6)).all()
    calibrated = defense.calibrate(4.0, 1e-5, training, 8, AccountingSettings())
    assert calibrated.privacy_claim(training, 8, 50, 1e-5, AccountingSettings()).epsilon == pytest.approx(4.0, rel=1e-3)
    with pytest.raises(UserInputError, match="layout"):
        DPFedSAM(DPFedSAMParams(clip_mode="per_tensor")).privacy_claim(training, 8, 50, 1e-5, AccountingSettings())


def test_masking_defenses_need_client_noise():
    """The paper variants mask each client's noise, which needs client-side noise; the sound defaults do not."""
    for defense in (DPFedSAMTopK(DPFedSAMTopKParams(noise_placement="aggregate", mask_stage="after_noise")),
                    FedSMPRandK(FedSMPParams(noise_placement="aggregate", noise_support="kept"))):
        with pytest.raises(UserInputError, match="noise_placement"):
            defense.validate(TrainingConfig(), 10)
    for defense in (DPFedSAMTopK(DPFedSAMTopKParams(noise_placement="aggregate")),
                    FedSMPRandK(FedSMPParams(noise_placement="aggregate"))):
        defense.validate(TrainingConfig(), 10)


@pytest.mark.parametrize("delta,row", [(5e-3, [3.64, 5.24, 7.77, 9.93]), (2e-3, [4.11, 5.82, 8.51, 10.80])])
def test_dp_fedsam_epsilon_table_improved(delta, row):
    """DP-FedSAM's accounting (Shi et al. 2023, Thm 2) at σ = 0.95, q = 0.1 with the official code's Balle et al.
    2020 conversion: within 1 % of the values that code computes."""
    for steps, expected in zip([50, 100, 200, 300], row):
        assert compute_epsilon(GaussianSchedule(0.95, 0.1, steps), delta).epsilon == pytest.approx(expected, rel=0.01)


def test_fixed_sampling_draws_exactly_m(digits_job):
    outcome = DPFedSAM(DPFedSAMParams(rho=0.05)).train(digits_job(rounds=4, sampling="fixed", clients_per_round=3))
    assert [m["participants"] for m in outcome.metrics] == [3, 3, 3, 3]
    assert np.isfinite([m["test_loss"] for m in outcome.metrics]).all()
