"""Independent runs trained together (defenses/run_batch.py) give what each run gives alone."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from defenses.blocks.clipping import clip_rows, joined_rows
from defenses.blocks.dirac_rows import DiracRows
from defenses.blocks.local_training import LocalSchedule
from defenses.blocks.noise import gaussian_rows
from defenses.blur_lus import BLURParams, DPFedAvgBLUR
from defenses.dp_fedsam import DPFedSAM, DPFedSAMParams
from defenses.fed_smp import FedSMPParams, FedSMPTopK
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg
from defenses.federated.evaluation import evaluate, evaluate_many
from defenses.federated.round_metrics import norm_summaries
from defenses.federated.training_job import RecordSpec, TrainingDiverged
from defenses.nbafl import NbAFL
from defenses.run_batch import joinable, train_together
from defenses.udp_fl import UDPFL


def _runs(job, count: int = 3):
    """``count`` runs of ``job``'s shape: other seeds, and each run drops a different client's records."""
    runs = []
    for k in range(count):
        clients = [c if i != k else c[: len(c) // 2] for i, c in enumerate(job.clients)]
        runs.append(replace(job, seed=job.seed + 7 * k, clients=clients))
    return runs


def _same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _assert_same_metrics(a, b):
    """Every metric of every round, keys in the same order (metrics.jsonl), NaN equal to NaN."""
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b):
        assert list(row_a) == list(row_b)
        for key in row_a:
            assert _same_value(row_a[key], row_b[key]), (row_a["round"], key, row_a[key], row_b[key])


def _assert_same(alone, together):
    for a, b in zip(alone, together):
        assert type(a) is type(b)
        if isinstance(a, TrainingDiverged):
            assert (a.round, a.what) == (b.round, b.what)
            _assert_same_metrics(a.metrics, b.metrics)
            continue
        _assert_same_metrics(a.metrics, b.metrics)
        for name in a.final_params:
            assert torch.equal(a.final_params[name], b.final_params[name]), name
        assert [m.get("clip_fraction") for m in a.metrics] == [m.get("clip_fraction") for m in b.metrics]
        assert [m["participants"] for m in a.metrics] == [m["participants"] for m in b.metrics]
        assert [m.get("test_accuracy") for m in a.metrics] == [m.get("test_accuracy") for m in b.metrics]
        assert sorted(a.server_view) == sorted(b.server_view)
        for key in a.server_view:
            # bit for bit; NaN marks the rounds a Dirac canary did not take part in
            torch.testing.assert_close(a.server_view[key], b.server_view[key], rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize("defense, training", [
    (FedAvg(), dict(momentum=0.9, weight_decay=1e-3)),
    (DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0)), dict(client_rate=0.6)),  # Poisson: rounds differ per run
    (DPFedAvgBLUR(BLURParams(clip=0.05, noise_multiplier=1.0, blur_lambda=1.0)), {}),  # small clip: the penalty acts
    (DPFedSAM(DPFedSAMParams(clip=0.5, noise_multiplier=1.0, rho=0.1)), dict(local_unit="iterations", local_steps=4)),
])
def test_runs_trained_together_equal_runs_trained_alone(digits_job, defense, training):
    """Bit for bit: every row of the shared computation is its own client's computation."""
    job = replace(digits_job(**training), record=RecordSpec(global_rounds="all", upload_rounds="all"))
    runs = _runs(job)
    assert joinable(defense, runs)
    _assert_same([defense.train(run) for run in runs], train_together(defense, runs))


def _alone(defense, run):
    try:
        return defense.train(run)
    except TrainingDiverged as diverged:
        return diverged


@pytest.mark.parametrize("defense", [
    DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0)),
    DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0, clip_mode="per_tensor", noise_placement="aggregate")),
    FedSMPTopK(FedSMPParams(clip=0.5, noise_multiplier=1.0, keep_fraction=0.3)),  # its own pre-clip sparsification
    NbAFL(),  # privatises with its own privatize: the default, one run after another
])
def test_joined_round_finishing_equals_runs_alone(digits_job, defense):
    """The joined finishing (privatisation, metrics, evaluation, divergence check) gives each run
    what it gets alone: runs of different sizes and participants (Poisson), evaluation every other
    round and at the end, a run that diverges at its first round while the others train on."""
    job = replace(digits_job(client_rate=0.6, rounds=5, eval_every=2),
                  record=RecordSpec(global_rounds="all", upload_rounds="all"))
    pool_x = job.pool_x.clone()
    poisoned = int(job.clients[0][0])
    pool_x[poisoned] = 1e38  # a record that overflows the forward pass of the run that holds it
    clean = [np.array([i for i in c if i != poisoned]) for c in job.clients]
    runs = _runs(replace(job, pool_x=pool_x, clients=clean), 4)
    runs[2] = replace(runs[2], clients=[np.concatenate([[poisoned], c]) for c in runs[2].clients])
    alone = [_alone(defense, run) for run in runs]
    assert [isinstance(a, TrainingDiverged) for a in alone] == [False, False, True, False]
    _assert_same(alone, train_together(defense, runs))


def test_joined_round_finishing_with_canary_clients(digits_job):
    """Update canaries and Dirac canary clients join each run's rows before the joined privatisation."""
    job = replace(digits_job(client_rate=0.7, rounds=3), record=RecordSpec(upload_rounds="all"))
    defense = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0))
    dim = _alone(defense, job).layout.dim
    directions = torch.nn.functional.normalize(torch.randn(6, dim, generator=torch.Generator().manual_seed(0)), dim=1)
    dirac = DiracRows(torch.tensor([3, 50, 700, 900]), torch.tensor([1.0, -1.0, 0.0, 1.0]), dim)
    runs = _runs(job, 3)
    runs = [replace(runs[0], update_canaries=directions), replace(runs[1], dirac_canaries=dirac), runs[2]]
    alone = [_alone(defense, run) for run in runs]
    assert any(row.get("canary_participants") for row in alone[0].metrics)
    _assert_same(alone, train_together(defense, runs))


def test_a_rows_numbers_do_not_depend_on_the_batch():
    """What the joined finishing relies on: a row's norm, clipped values and scaled noise, a run's
    norm summary and a model's loss are the same computed alone or beside other rows and runs."""
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(300, 1000, generator=generator) * torch.rand(300, 1, generator=generator)
    clipped, norms, was_clipped = clip_rows(rows, 0.4)
    for a, b in [(0, 1), (7, 27), (100, 300)]:
        alone = clip_rows(rows[a:b].clone(), 0.4)
        assert all(torch.equal(x, y) for x, y in zip(alone, (clipped[a:b], norms[a:b], was_clipped[a:b])))
    parts = list(rows.split([5, 1, 294]))
    joined = joined_rows(parts)
    assert joined.data_ptr() == rows.data_ptr() and torch.equal(joined, rows)  # a view, no copy
    assert torch.equal(joined_rows([parts[2], parts[0]]), torch.cat([parts[2], parts[0]]))
    seeds = [torch.Generator().manual_seed(s) for s in range(4)] + [torch.Generator().manual_seed(s) for s in range(4)]
    noise = gaussian_rows(8, 500, [0.3] * 4 + [0.07] * 4, seeds)
    assert torch.equal(noise[:4], gaussian_rows(4, 500, 0.3, [torch.Generator().manual_seed(s) for s in range(4)]))
    assert torch.equal(noise[4:], gaussian_rows(4, 500, 0.07, [torch.Generator().manual_seed(s) for s in range(4)]))
    norm_sets = [torch.rand(n, generator=generator, dtype=torch.float64) for n in (1, 2, 5, 20, 20, 33, 5)]
    for values, (summary, listed) in zip(norm_sets, norm_summaries(norm_sets)):
        array = values.numpy()
        q = np.quantile(array, [0.0, 0.25, 0.5, 0.75, 1.0])
        assert list(summary.values()) == [float(v) for v in q] + [float(array.mean())]
        assert listed == [float(f"{v:.6g}") for v in array.tolist()]
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    params = [{n: p.detach() * (1 + k) for n, p in model.named_parameters()} for k in range(3)]
    sets = [(torch.randn(n, 10, generator=generator), torch.randint(0, 3, (n,), generator=generator)) for n in (40, 0, 7)]
    together = evaluate_many([(model, p, x, y) for p, (x, y) in zip(params, sets)])
    for p, (x, y), figures in zip(params, sets, together):
        assert _same_value(list(evaluate(model, p, x, y)), list(figures))
    assert all(math.isnan(v) for v in together[1])


def test_runs_of_per_run_objectives_train_one_after_another(digits_job):
    """DP-SGD's noise streams belong to one run: such defenses fall back to training each run alone
    (the same results); so do runs on the per-client reference loop."""
    job = digits_job()
    defense = UDPFL()
    runs = _runs(job, 2)
    _assert_same([defense.train(run) for run in runs], train_together(defense, runs))
    loop = [replace(run, training=replace(run.training, engine="loop")) for run in runs]
    assert not joinable(FedAvg(), loop)


def test_concatenated_schedule_pads_rows_to_a_common_shape():
    short = LocalSchedule.build([[np.array([0, 1])]], [np.array([5, 6])])
    long = LocalSchedule.build([[np.array([0, 1, 2]), np.array([1])]], [np.array([7, 8, 9])])
    both = LocalSchedule.concat([short, long])
    assert both.indices.shape == (2, 2, 3) and both.steps == [1, 2]
    assert both.indices[0].tolist() == [[5, 6, 0], [0, 0, 0]]
    assert both.mask[0].tolist() == [[1, 1, 0], [0, 0, 0]]
    assert both.active.tolist() == [[True, False], [True, True]]
    assert both.indices[1].tolist() == long.indices[0].tolist()
