"""FL-TOP family (Kerkouche et al. 2021): frozen coordinates, exchanged lengths, the table arithmetic, clip and noise."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from defenses.base import AccountingSettings
from defenses.blocks.flat import ParamLayout, parameters_of
from defenses.blocks.partial_dct import PartialDCT
from defenses.federated.training_job import RecordSpec, TrainingConfig
from defenses.fl_basic import FLBasic, FLBasicDP, FLBasicDPParams
from defenses.fl_cs import FLCS, FLCSParams
from defenses.fl_std import FLStd, FLStdDP, FLStdDPParams, FLStdParams
from defenses.fl_top import FLTop, FLTopDP, FLTopDPParams, FLTopParams
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon
from defenses.subset_training import SubsetDPParams, SubsetParams, kept_count, table_kilobytes
from tests.defenses.test_blur_lus import _round_context

PAPER_N = 1_663_370


@pytest.mark.parametrize("fraction,rounds,expected", [
    (1.0, 200, 22178.27), (1.0, 60, 6653.48), (0.005, 200, 110.88), (0.005, 193, 107.00),
    (0.05, 200, 1108.91), (0.05, 152, 842.77), (0.10, 199, 2206.74),
])
def test_table1_bandwidth_cells_exactly(fraction, rounds, expected):
    """The cost cells of Kerkouche et al. 2021, Tables 1–2: KB = ⌊r·n⌋·32·Round·C/8000 with n = 1,663,370 and
    C = 1/60."""
    assert round(table_kilobytes(kept_count(fraction, PAPER_N), rounds, 1 / 60), 2) == expected


def test_fl_top_dp_accounting_reproduces_the_calibration():
    """Kerkouche et al. 2021, §3.2.2 (Thm 1), at the σ that gives Table 1's ε: ε(200) = 1.000 ± 0.005 at σ = 1.5406,
    C = 1/60, δ = 1e-5 (classic conversion)."""
    layout = ParamLayout(("w",), ((1000,),))
    defense = FLTopDP(FLTopDPParams(noise_multiplier=1.5406), layout)
    claim = defense.privacy_claim(TrainingConfig(rounds=200, client_rate=1 / 60), 6000, 200, 1e-5,
                                  AccountingSettings(conversion="classic"))
    assert claim.epsilon == pytest.approx(1.000, abs=0.005) and claim.unit == "client"
    assert "secure aggregation" in claim.notes


def _initial_model(job):
    """The engine's initial global model for this job (same seed, same draw)."""
    from audit.core.seeding import seed_torch

    seed_torch(job.seed, "torch")
    return job.model_factory()


def test_frozen_coordinates_stay_bit_exact(digits_job):
    """FL-TOP trains only 𝕋 (Kerkouche et al. 2021, Alg. 1): outside 𝕋 every global model keeps w0's bits (momentum
    on, noise on)."""
    job = replace(digits_job(rounds=4, momentum=0.9), record=RecordSpec(global_rounds="all", upload_rounds="all"))
    defense = FLTopDP(FLTopDPParams(keep_fraction=0.1, noise_multiplier=1.0))
    outcome = defense.train(job)
    model = _initial_model(job)
    layout = ParamLayout.of(model)
    start = layout.flatten(parameters_of(model))
    bound = defense.bind(layout)
    mask = bound.prepare(job, model, layout.unflatten(start)).mask
    assert int(mask.sum()) == kept_count(0.1, layout.dim)
    for key, global_model in outcome.global_models.items():
        assert torch.equal(global_model[~mask], start[~mask]), key
        assert not torch.equal(global_model[mask], start[mask])
    assert all("/aggregate" in k for k in outcome.server_view), "with secure aggregation only the sum is seen"


def test_client_updates_are_zero_outside_the_subset(digits_job):
    job = digits_job()
    for bound in (FLTop(FLTopParams(keep_fraction=0.05)), FLBasic(SubsetParams(keep_fraction=0.05))):
        ctx, updates = _round_context(job, bound)
        mask = bound.trainable(ctx)
        assert int(mask.sum()) == kept_count(0.05, ctx.layout.dim)
        assert torch.equal(updates[:, ~mask], torch.zeros_like(updates[:, ~mask]))
        uploads, diagnostics = bound.privatize(updates, ctx)
        assert diagnostics["bits_up_per_client"] == 32 * kept_count(0.05, ctx.layout.dim)
        expected_down = ctx.layout.dim if isinstance(bound, FLBasic) else kept_count(0.05, ctx.layout.dim)
        assert diagnostics["bits_down_per_client"] == 32 * expected_down


def test_basic_subset_is_fresh_each_round_and_shared_by_clients(digits_job):
    job = digits_job()
    defense = FLBasic(SubsetParams(keep_fraction=0.1))
    first, _ = _round_context(job, defense, 0)
    second, _ = _round_context(job, defense, 1)
    assert torch.equal(defense.trainable(first), defense.trainable(first))
    assert not torch.equal(defense.trainable(first), defense.trainable(second))


def test_lengths_of_std_and_cs(digits_job):
    job = digits_job()
    dim = ParamLayout.of(job.model_factory()).dim
    assert FLStd(FLStdParams()).upload_floats(dim) == FLStd(FLStdParams()).download_floats(dim) == dim
    cs = FLCS(FLCSParams(keep_fraction=0.1, chunk=1000))
    assert cs.download_floats(dim) == dim
    assert cs.upload_floats(dim) == sum(int(math.floor(0.1 * min(1000, dim - s))) for s in range(0, dim, 1000))


def test_partial_dct_is_an_orthonormal_sketch():
    generator = torch.Generator().manual_seed(0)
    sketch = PartialDCT(2500, 1000, 0.3, generator)
    assert sketch.measurements == 300 + 300 + 150
    y = np.random.default_rng(0).normal(size=sketch.measurements)
    assert np.allclose(sketch.compress(sketch.adjoint(y)[None, :])[0], y)  # A Aᵀ = I
    sparse = np.zeros(2500)
    sparse[[3, 700, 1500, 2400]] = [1.0, -2.0, 0.5, 1.5]
    recovered = sketch.reconstruct(sketch.compress(sparse[None, :])[0], 300, 0.01)
    assert np.linalg.norm(recovered - sparse) < 0.2 * np.linalg.norm(sparse)  # ℓ1 recovery of a sparse update


@pytest.mark.parametrize("cls,params", [(FLTopDP, FLTopDPParams(keep_fraction=0.2, noise_multiplier=1.3)),
                                        (FLBasicDP,
                                         FLBasicDPParams(keep_fraction=0.2, noise_multiplier=1.3, calibration_subsets=5)),
                                        (FLStdDP, FLStdDPParams(noise_multiplier=1.3))])
def test_clip_calibration_clipping_and_noise(digits_job, cls, params):
    """The DP variants (Kerkouche et al. 2021, Alg. 3): ‖clip(Δ)‖ ≤ S; per-client noise Sσ/√|𝕂| on the exchanged
    coordinates (χ²)."""
    job = digits_job()
    bound = cls(params)
    ctx, updates = _round_context(job, bound)
    clip = ctx.state.clip
    assert clip > 0, "S calibrated on the public batch"
    mask = bound.trainable(ctx)
    uploads, diagnostics = bound.privatize(torch.zeros_like(updates), ctx)
    noise = uploads if mask is None else uploads[:, mask]
    std = clip * 1.3 / math.sqrt(len(ctx.participants))
    values = noise.double().flatten().numpy()
    statistic = float((values ** 2).sum() / std ** 2)
    assert stats.chi2.ppf(5e-4, values.size) < statistic < stats.chi2.ppf(1 - 5e-4, values.size)
    if mask is not None:
        assert torch.equal(uploads[:, ~mask], torch.zeros_like(uploads[:, ~mask]))
    big, _ = bound.privatize(updates * 1000, ctx)
    clipped = big - uploads  # same noise generators: the difference is the clipped update
    assert (torch.linalg.vector_norm(clipped.double(), dim=1) <= clip * (1 + 1e-5)).all()


def test_private_topk_costs_one_more_round(digits_job):
    job = digits_job(rounds=3)
    layout = ParamLayout.of(job.model_factory())
    private = FLTopDP(FLTopDPParams(keep_fraction=0.1, topk_selection="private"), layout)
    public = FLTopDP(FLTopDPParams(keep_fraction=0.1), layout)
    settings = AccountingSettings()
    assert private.privacy_claim(job.training, 8, 3, 1e-5, settings).epsilon == pytest.approx(
        compute_epsilon(GaussianSchedule(public.params.noise_multiplier, 1.0, 4), 1e-5).epsilon)
    outcome = private.train(job)
    assert np.isfinite([m["test_loss"] for m in outcome.metrics]).all()
    assert outcome.metrics[-1]["epsilon"] == pytest.approx(outcome.claim.epsilon)


def test_weight_decay_is_rejected():
    from audit.core.errors import UserInputError

    with pytest.raises(UserInputError, match="weight_decay"):
        FLTop(FLTopParams()).validate(TrainingConfig(weight_decay=1e-4), 10)
    SubsetDPParams()  # defaults construct


def test_the_public_batch_never_scores_the_model(digits_job):
    """FL-TOP's public batch comes from the held-out split: those records leave the split accuracy is measured on."""
    job = digits_job()
    defense = FLTopDP(FLTopDPParams(public_size=10))
    ctx, _ = _round_context(job, defense)
    test_x, _ = defense.test_split(job, ctx.state)
    public_x = ctx.state.public_x
    assert len(test_x) == len(job.test_x) - 10 and len(public_x) == 10

    def rows(x):
        return sorted(tuple(row.tolist()) for row in x.reshape(len(x), -1))

    assert rows(torch.cat([test_x, public_x])) == rows(job.test_x)  # a partition of the held-out split


def test_dirac_canaries_are_coins_only_on_the_coordinates_the_run_trains(digits_job):
    """A Dirac canary on a coordinate outside 𝕋 takes no part in any round: no reading, not a
    coin (the run's ``dirac/exercised``); every canary inside 𝕋 that joined a round is one, and its
    readings carry the round's noise (FL-TOP-DP: 𝕋 fixed for the run, chosen on public data)."""
    from defenses.blocks.dirac_rows import DiracRows

    probe = digits_job()
    model = _initial_model(probe)
    layout = ParamLayout.of(model)
    dim = layout.dim
    signs = torch.where(torch.arange(dim) % 3 == 0, -1.0, 1.0)
    job = replace(probe, dirac_canaries=DiracRows(torch.arange(dim), 100.0 * signs, dim))
    defense = FLTopDP(FLTopDPParams(keep_fraction=0.1, noise_multiplier=1.0, clip=0.5))
    outcome = defense.train(job)
    mask = defense.bind(layout).prepare(job, model, layout.unflatten(layout.flatten(parameters_of(model)))).mask
    exercised = outcome.server_view["dirac/exercised"].bool()
    assert torch.equal(exercised, mask.cpu())  # q = 1: every canary joins every round
    readings = outcome.server_view["dirac/uploads"]
    assert bool(readings[:, ~mask.cpu()].isnan().all()) and not bool(readings[:, mask.cpu()].isnan().any())
