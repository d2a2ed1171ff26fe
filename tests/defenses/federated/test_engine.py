"""The federated engine and DP-FedAvg: batched vs loop, sampling, clipping, noise, server view.

DP-FedAvg as McMahan et al. 2018, Alg. 1: clipping only rescales, each upload carries noise Sσ/√|P_t| on every
coordinate, no clipping and no noise is FedAvg, the claim matches the accountant, and Poisson sampling skips an
empty round but counts it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from audit.core.errors import UserInputError
from defenses.base import AccountingSettings
from defenses.blocks.clipping import clip_rows
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg
from defenses.federated.engine import sample_participants
from defenses.federated.training_job import RecordSpec, RoundContext, TrainingConfig


def _max_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ------------------------------------------------------------------ batched vs loop


@pytest.mark.parametrize("training", [
    dict(local_unit="epochs", local_steps=2, momentum=0.9, weight_decay=1e-3),
    dict(local_unit="iterations", local_steps=5, batch_size=16),
    dict(local_unit="epochs", local_steps=2, optimizer="adam", lr=0.01, weight_decay=1e-3),
])
def test_batched_and_loop_paths_agree(digits_job, training):
    """Same seed, same schedule: the vmapped path and the plain nn.Module+SGD loop give the same model."""
    job = digits_job(**training)
    sizes = [len(c) for c in job.clients]
    assert len(set(sizes)) > 1, "clients of different sizes exercise the padding"
    defense = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=0.3))
    batched = defense.train(job)
    looped = defense.train(replace(job, training=replace(job.training, engine="loop")))
    assert _max_difference(batched.final_params, looped.final_params) < 1e-4
    assert [m["clip_fraction"] for m in batched.metrics] == [m["clip_fraction"] for m in looped.metrics]


def test_chunking_does_not_change_the_result(digits_job):
    job = digits_job()
    whole = FedAvg().train(job)
    chunked = FedAvg().train(replace(job, training=replace(job.training, client_chunk=3)))
    assert _max_difference(whole.final_params, chunked.final_params) < 1e-6


def test_same_seed_is_bit_identical_and_seeds_differ(digits_job):
    job = digits_job()
    defense = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0))
    first, second = defense.train(job), defense.train(job)
    for name in first.final_params:
        assert torch.equal(first.final_params[name], second.final_params[name])
    other = defense.train(replace(job, seed=job.seed + 1))
    assert _max_difference(first.final_params, other.final_params) > 1e-3


def test_fedavg_learns(digits_job):
    outcome = FedAvg().train(digits_job(rounds=10))
    accuracies = [m["test_accuracy"] for m in outcome.metrics]
    assert accuracies[-1] > 0.8 > accuracies[0] - 0.5
    assert outcome.claim.epsilon == math.inf and outcome.claim.unit == "none"


def test_dp_fedavg_without_clipping_or_noise_is_fedavg(digits_job):
    """S = ∞, σ → 0, uniform weights: DP-FedAvg equals FedAvg."""
    job = digits_job()
    plain = FedAvg().train(job)
    dp = DPFedAvg(DPFedAvgParams(clip=1e6, noise_multiplier=1e-15)).train(job)  # noise std Sσ = 1e-9
    assert _max_difference(plain.final_params, dp.final_params) < 1e-5


# ------------------------------------------------------------------ sampling


def test_poisson_sampling_mean_size():
    """Poisson sampling: E|P_t| = qN; the sample mean over 4000 rounds lies within 4 standard errors."""
    training = TrainingConfig(client_rate=0.1)
    sizes = np.array([len(sample_participants(50, training, 0, t)) for t in range(4000)])
    standard_error = math.sqrt(50 * 0.1 * 0.9 / len(sizes))
    assert abs(sizes.mean() - 5.0) < 4 * standard_error
    assert (sizes == 0).any(), "empty rounds occur and must be handled"


def test_fixed_size_sampling_draws_distinct_clients():
    training = TrainingConfig(sampling="fixed", clients_per_round=7)
    for t in range(50):
        chosen = sample_participants(20, training, 0, t)
        assert len(chosen) == 7 and len(set(chosen.tolist())) == 7 and chosen.max() < 20


def test_empty_rounds_are_skipped_but_counted(digits_job):
    job = digits_job(rounds=12, client_rate=0.05)
    outcome = DPFedAvg().train(job)
    skipped = [m for m in outcome.metrics if m.get("skipped")]
    assert skipped, "with q=0.05 and 8 clients some rounds are empty"
    epsilons = [m["epsilon"] for m in outcome.metrics]
    assert all(b > a for a, b in zip(epsilons, epsilons[1:])), "ε grows in every round, empty or not"


# ------------------------------------------------------------------ clipping and noise


def test_clipping_bounds_norms_and_only_rescales():
    generator = torch.Generator().manual_seed(0)
    updates = torch.randn(64, 1000, generator=generator) * torch.logspace(-3, 1, 64)[:, None]
    clipped, norms, was_clipped = clip_rows(updates, 1.0)
    out_norms = torch.linalg.vector_norm(clipped.double(), dim=1)
    assert (out_norms <= 1.0 * (1 + 1e-6)).all()
    assert torch.equal(clipped[~was_clipped], updates[~was_clipped])
    cosine = torch.nn.functional.cosine_similarity(clipped.double(), updates.double(), dim=1)
    assert torch.allclose(cosine, torch.ones_like(cosine), atol=1e-6)
    assert was_clipped.any() and (~was_clipped).any()


def _context(participants: int, seed: int = 0) -> RoundContext:
    return RoundContext(0, np.arange(participants), np.full(participants, 10), participants, TrainingConfig(), seed, "cpu")


def _chi2_std_check(samples: torch.Tensor, std: float) -> None:
    """Two-sided χ² test (α = 1e-3) that the samples have standard deviation ``std``."""
    values = samples.double().flatten().numpy()
    statistic = float((values ** 2).sum() / std ** 2)
    dof = values.size
    assert stats.chi2.ppf(5e-4, dof) < statistic < stats.chi2.ppf(1 - 5e-4, dof)


def test_client_noise_std_is_s_sigma_over_sqrt_participants():
    """Each upload's noise has per-coordinate std Sσ/√|P_t|, on every coordinate."""
    clip, sigma, participants, dim = 0.3, 1.7, 8, 20000
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma))
    uploads, _ = defense.privatize(torch.zeros(participants, dim), _context(participants))
    _chi2_std_check(uploads, clip * sigma / math.sqrt(participants))
    # the averaged global step has per-coordinate std Sσ/|P_t|
    _chi2_std_check(defense.aggregate(uploads, _context(participants)), clip * sigma / participants)


def test_aggregate_noise_placement_std():
    clip, sigma, participants, dim = 0.5, 2.0, 10, 20000
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma, noise_placement="aggregate"))
    ctx = _context(participants)
    uploads, _ = defense.privatize(torch.zeros(participants, dim), ctx)
    assert torch.equal(uploads, torch.zeros_like(uploads)), "no client-side noise when the aggregator adds it"
    _chi2_std_check(defense.aggregate(uploads, ctx), clip * sigma / participants)


def test_noise_does_not_depend_on_other_participants():
    defense = DPFedAvg(DPFedAvgParams(clip=1.0, noise_multiplier=1.0))
    ctx_a = _context(4)
    ctx_b = RoundContext(0, np.array([0, 1, 2, 3]), np.full(4, 10), 9, TrainingConfig(), 0, "cpu")
    a, _ = defense.privatize(torch.zeros(4, 100), ctx_a)
    b, _ = defense.privatize(torch.zeros(4, 100), ctx_b)
    assert torch.equal(a, b)


def test_expected_denominator():
    defense = DPFedAvg(DPFedAvgParams(clip=10.0, noise_multiplier=1e-9, denominator="expected"))
    ctx = RoundContext(0, np.arange(3), np.full(3, 10), 10, TrainingConfig(client_rate=0.5), 0, "cpu")
    step = defense.aggregate(torch.ones(3, 4), ctx)
    assert torch.allclose(step, torch.full((4,), 3 / 5.0), atol=1e-6)


def test_weighted_aggregation_is_rejected_for_dp():
    with pytest.raises(UserInputError, match="training.aggregation"):
        DPFedAvg().validate(TrainingConfig(aggregation="weighted"), 10)


# ------------------------------------------------------------------ claim and calibration


def test_claim_matches_accountant_and_calibration(digits_job):
    job = digits_job(rounds=5)
    accounting = AccountingSettings()
    defense = DPFedAvg().calibrate(2.0, 1e-5, job.training, len(job.clients), accounting)
    claim = defense.privacy_claim(job.training, len(job.clients), 5, 1e-5, accounting)
    assert claim.unit == "client" and claim.epsilon <= 2.0 and claim.epsilon == pytest.approx(2.0, rel=1e-3)
    assert "rdp-improved" in claim.accountant and "dp-accounting" in claim.accountant
    outcome = defense.train(job)
    assert outcome.metrics[-1]["epsilon"] == pytest.approx(claim.epsilon, rel=1e-9)


# ------------------------------------------------------------------ server view


def test_server_view_records_uploads_or_only_the_aggregate(digits_job):
    record = RecordSpec(global_rounds="all", upload_rounds=(2,), upload_clients=(0, 1, 2))
    job = replace(digits_job(rounds=3), record=record)
    outcome = DPFedAvg().train(job)
    assert sorted(outcome.global_models) == ["round_0001", "round_0002", "round_0003"]
    uploads = [k for k in outcome.server_view if "/client_" in k]
    assert uploads and all(k.startswith("round_0002/") for k in uploads)
    assert {int(k.split("_")[-1]) for k in uploads} <= {0, 1, 2}
    secure = DPFedAvg(DPFedAvgParams(secure_aggregation=True)).train(job)
    assert list(secure.server_view) == ["round_0002/aggregate"]


def test_a_client_without_local_steps_is_not_computed_and_keeps_its_start():
    """Clients a membership run leaves out hold no records: zero local steps. Their update is
    exactly zero (w_i = w), and no chunk carries them through the steps of the others."""
    from defenses.federated.engine import train_in_chunks

    steps = [3, 0, 2, 0, 5, 1]
    start = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
    seen: list[int] = []

    def train(rows: list[int]) -> torch.Tensor:
        seen.extend(rows)
        return start[rows] + torch.tensor(steps, dtype=torch.float32)[rows, None]  # "training": start + steps

    for size in (1, 2, 6):
        seen.clear()
        out = train_in_chunks(steps, size, train, start)
        assert sorted(seen) == [0, 2, 4, 5]
        assert torch.equal(out - start, torch.tensor(steps, dtype=torch.float32)[:, None].expand(6, 4))
    assert torch.equal(train_in_chunks([0, 0], 4, train, start[:2]), start[:2])
