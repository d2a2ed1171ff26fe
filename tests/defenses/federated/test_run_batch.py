"""Independent runs trained together (defenses/run_batch.py) give what each run gives alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from defenses.blocks.local_training import LocalSchedule
from defenses.blur_lus import BLURParams, DPFedAvgBLUR
from defenses.dp_fedsam import DPFedSAM, DPFedSAMParams
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg
from defenses.federated.training_job import RecordSpec
from defenses.run_batch import joinable, train_together
from defenses.udp_fl import UDPFL


def _runs(job, count: int = 3):
    """``count`` runs of ``job``'s shape: other seeds, and each run drops a different client's records."""
    runs = []
    for k in range(count):
        clients = [c if i != k else c[: len(c) // 2] for i, c in enumerate(job.clients)]
        runs.append(replace(job, seed=job.seed + 7 * k, clients=clients))
    return runs


def _assert_same(alone, together):
    for a, b in zip(alone, together):
        for name in a.final_params:
            assert torch.equal(a.final_params[name], b.final_params[name]), name
        assert [m.get("clip_fraction") for m in a.metrics] == [m.get("clip_fraction") for m in b.metrics]
        assert [m["participants"] for m in a.metrics] == [m["participants"] for m in b.metrics]
        assert [m.get("test_accuracy") for m in a.metrics] == [m.get("test_accuracy") for m in b.metrics]
        assert sorted(a.server_view) == sorted(b.server_view)
        for key in a.server_view:
            assert torch.equal(a.server_view[key], b.server_view[key]), key


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
