"""The run store: round trip without unpickling, atomic writes, no half-written runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import audit.store as store_module
from audit import store_seal
from audit.store import RunStore


def _save(store: RunStore, run_id: str = "run-1"):
    params = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    store.save_run(run_id, {"run_id": run_id, "value": float("nan")}, params, np.array([3, 5, 8]),
                   [{"round": 1, "test_accuracy": 0.5}], {"round_0001/aggregate": torch.zeros(8)}, {})
    return params


def test_round_trip(tmp_path):
    store = RunStore(tmp_path)
    params = _save(store)
    assert store.is_complete("run-1")
    loaded = store.load_params("run-1")
    assert all(torch.equal(loaded[k], params[k]) for k in params)
    assert store.load_membership("run-1").tolist() == [3, 5, 8]
    assert store.load_metrics("run-1") == [{"round": 1, "test_accuracy": 0.5}]
    assert store.load_manifest("run-1")["value"] is None  # NaN is written as null: strict JSON
    assert list(store.load_tensors("run-1", "server_view")) == ["round_0001/aggregate"]
    assert store.load_tensors("run-1", "global_models") == {}


def test_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    store = RunStore(tmp_path)

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store_module.safetensors_torch, "save_file", explode)
    with pytest.raises(OSError):
        _save(store, "run-2")
    assert not store.is_complete("run-2")
    assert list(store.runs.iterdir()) == []


def test_membership_is_never_unpickled(tmp_path):
    store = RunStore(tmp_path)
    _save(store)
    np.save(store.path("run-1") / "membership.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    store_seal.write(store.path("run-1"), "run-1")  # sealed, as a bug of our own writer would seal it
    with pytest.raises(ValueError, match="allow_pickle"):
        store.load_membership("run-1")
