"""Local mini-batch schedules."""

from __future__ import annotations

import numpy as np

from defenses.blocks.local_training import LocalSchedule, client_batches


def test_epochs_visit_every_record_once_per_epoch():
    batches = client_batches(23, "epochs", 3, 5, np.random.default_rng(0))
    assert len(batches) == 3 * 5 and [len(b) for b in batches[:5]] == [5, 5, 5, 5, 3]
    for epoch in range(3):
        assert sorted(np.concatenate(batches[epoch * 5:(epoch + 1) * 5]).tolist()) == list(range(23))


def test_iterations_use_min_of_batch_and_client_size():
    assert [len(b) for b in client_batches(4, "iterations", 6, 10, np.random.default_rng(0))] == [4] * 6
    batches = client_batches(50, "iterations", 7, 16, np.random.default_rng(0))
    assert [len(b) for b in batches] == [16] * 7
    assert len(np.unique(np.concatenate(batches[:3]))) == 48  # no repeats before a pass is complete


def test_schedule_padding_and_masks():
    batches = [client_batches(7, "epochs", 1, 3, np.random.default_rng(1)),
               client_batches(3, "epochs", 1, 3, np.random.default_rng(2))]
    members = [np.arange(100, 107), np.arange(200, 203)]
    schedule = LocalSchedule.build(batches, members)
    assert schedule.indices.shape == (2, 3, 3) and schedule.steps == [3, 1]
    assert schedule.active.tolist() == [[True, True, True], [True, False, False]]
    assert schedule.mask[0].sum() == 7 and schedule.mask[1].sum() == 3
    real = schedule.indices[0][schedule.mask[0] > 0]
    assert sorted(real.tolist()) == list(range(100, 107))
    sub = schedule.select([1])
    assert sub.indices.shape == (1, 1, 3)
