"""Dirac canary rows: their noise has the law of K independent dense noise rows, and the defense's
own clipping acts on them (the values expected here follow from the definitions, not the code)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from defenses.blocks.dirac_rows import DiracRows
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import RoundContext, TrainingConfig


def _rows(count: int, dim: int, seed: int = 0) -> DiracRows:
    rng = np.random.default_rng(seed)
    coords = torch.as_tensor(rng.permutation(dim)[:count], dtype=torch.long)
    return DiracRows(coords, torch.as_tensor(rng.choice([-5.0, 5.0], size=count), dtype=torch.float32), dim)


def _variance_interval(values: np.ndarray, confidence: float = 0.999) -> tuple[float, float]:
    """χ² interval of the variance of zero-mean normal values."""
    n, total = len(values), float(np.sum(values.astype(np.float64) ** 2))
    return total / stats.chi2.ppf(1 - (1 - confidence) / 2, n), total / stats.chi2.ppf((1 - confidence) / 2, n)


def test_the_noise_of_k_rows_sums_to_k_times_the_variance_on_every_coordinate():
    """K rows of N(0, s²·I) each sum to N(0, K·s²) on every coordinate — owned or not — and each
    row's own value is N(0, s²): what K dense noise rows give."""
    count, dim, std = 400, 20_000, 0.5
    rows = _rows(count, dim).with_gaussian_noise(std, torch.Generator().manual_seed(3))
    total = rows.noise_total.double().numpy()
    low, high = _variance_interval(total)
    assert low <= count * std**2 <= high
    low, high = _variance_interval(rows.own_noise.double().numpy())
    assert low <= std**2 <= high
    # on an owned coordinate the sum holds the owner's value plus the other K − 1 rows' noise
    rest = total[rows.coords.numpy()] - rows.own_noise.double().numpy()
    low, high = _variance_interval(rest)
    assert low <= (count - 1) * std**2 <= high


def test_the_sum_of_the_rows_puts_each_value_on_its_coordinate():
    rows = _rows(50, 300)
    total = rows.total().numpy()
    expected = np.zeros(300, dtype=np.float32)
    expected[rows.coords.numpy()] = rows.values.numpy()
    assert np.array_equal(total, expected)


@pytest.mark.parametrize("clip_mode", ["flat", "per_tensor"])
def test_dp_fedavg_clips_a_dirac_row_to_the_clip(clip_mode):
    """A raw update of ±5 on one coordinate has ℓ2 norm 5 (in its tensor too): clipped to S = 1."""
    from defenses.blocks.flat import ParamLayout

    layout = ParamLayout.of(torch.nn.Linear(4, 3))
    defense = DPFedAvg(DPFedAvgParams(clip=1.0, noise_multiplier=2.0, clip_mode=clip_mode), layout)
    rows = _rows(10, layout.dim)
    clipped, norms, was_clipped = defense.clip(rows)
    assert torch.allclose(clipped.values.abs(), torch.ones(10))
    assert torch.equal(torch.sign(clipped.values), torch.sign(rows.values))
    assert torch.allclose(norms, torch.full((10,), 5.0, dtype=torch.float64)) and bool(was_clipped.all())


def test_dp_fedavg_gives_each_dirac_upload_its_share_of_the_noise():
    """Client placement: |P_t| = 20 real + K canaries, each upload N(0, S²σ²/|P_t|), the sum N(0, S²σ²)."""
    count, dim, clip, sigma = 2000, 4000, 1.0, 3.0
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma))
    rows = _rows(count, dim)
    ctx = RoundContext(0, np.arange(20), np.ones(20, dtype=int), 20, TrainingConfig(), seed=7, device="cpu", canaries=rows)
    uploads, _ = defense.privatize(rows, ctx)
    share = clip * sigma / math.sqrt(20 + count)
    low, high = _variance_interval((uploads.own_uploads() - uploads.values).double().numpy())
    assert low <= share**2 <= high
    low, high = _variance_interval(uploads.noise_total.double().numpy())
    assert low <= count * share**2 <= high
    assert torch.allclose(uploads.values.abs(), torch.full((count,), clip))
