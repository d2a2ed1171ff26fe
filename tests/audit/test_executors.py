"""Every executor trains the same runs to the same bytes as the local one."""

from __future__ import annotations

import sys

import pytest

from audit.cli import main

CONFIG = """dataset: {name: digits, max_pool: 300, max_test: 100}
partition: {clients: 5}
training: {rounds: 3, local_steps: 2, batch_size: 10, lr: 0.1, momentum: 0.9}
membership: {runs: 4}
diagnostics: {enabled: false}
attacks: [{name: lira}, {name: client-canaries}]
defenses: [{name: fedavg}, {name: dp-fedavg, epsilons: [4]}]
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def local(config, tmp_path_factory):
    """The results of the local executor, trained once for every comparison."""
    out = tmp_path_factory.mktemp("local") / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    return out


def assert_same_results(local, other):
    for name in ("results.csv", "results.json"):
        assert (local / name).read_bytes() == (other / name).read_bytes(), name
    assert sorted(p.name for p in (local / "runs").iterdir()) == sorted(p.name for p in (other / "runs").iterdir())


def test_process_pool_gives_identical_results(config, local, tmp_path):
    pooled = tmp_path / "pooled"
    assert main(["run", str(config), "--out", str(pooled), "--quiet", "--executor", "process", "--workers", "2"]) == 0
    assert_same_results(local, pooled)


def test_runs_trained_one_after_another_give_identical_results(config, local, tmp_path):
    """Locally the 4 runs of an experiment train together by default; the process pool above
    trains them in 2 groups of 2; here each alone — the same bytes every time."""
    alone = tmp_path / "alone"
    assert main(["run", str(config), "--out", str(alone), "--quiet", "--batch-runs", "1"]) == 0
    assert_same_results(local, alone)


def test_ray_gives_identical_results(config, local, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray>=2.9')")
    distributed = tmp_path / "ray"
    assert main(["run", str(config), "--out", str(distributed), "--quiet", "--executor", "ray", "--workers", "2"]) == 0
    assert_same_results(local, distributed)
    for run in (distributed / "runs").iterdir():  # the runs the tasks returned are stored whole
        assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in (local / "runs" / run.name).iterdir())


def test_unknown_executor_is_bad_input(config, tmp_path, capsys):
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--executor", "cluster"]) == 2
    assert "--executor: unknown executor 'cluster'; allowed: local, process, ray" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--executor", "process", "--workers", "0"]) == 2
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--batch-runs", "0"]) == 2
    assert "--batch-runs: must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ray_address_needs_the_ray_executor(config, tmp_path, capsys):
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--ray-address", "auto"]) == 2
    err = capsys.readouterr().err
    assert err == "dpfl-audit: error: --ray-address: only with --executor ray, not --executor local\n"
    assert not (tmp_path / "out").exists()


def test_ray_executor_without_ray_is_bad_input(config, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for command in ("run", "train"):
        assert main([command, str(config), "--out", str(tmp_path / "out"), "--executor", "ray"]) == 2
        err = capsys.readouterr().err
        assert err == ("dpfl-audit: error: --executor ray needs Ray, which is not installed; "
                       "install it with: pip install 'ray>=2.9'\n")
        assert not (tmp_path / "out").exists()


def test_returned_runs_are_stored_whole_and_only_inside_runs(tmp_path):
    import numpy as np
    import torch

    from audit.executors import store_runs
    from audit.store import RunStore

    source, target = RunStore(tmp_path / "remote"), RunStore(tmp_path / "here")
    source.save_run("r0", {"run_id": "r0"}, {"w": torch.ones(2)}, np.arange(3), [{"round": 1}])
    assert store_runs(target, {"r0": source.run_files("r0")}) == ["r0"]
    assert target.is_complete("r0") and not list(target.runs.glob(".staging-*"))
    assert {p.name: p.read_bytes() for p in target.path("r0").iterdir()} == \
        {p.name: p.read_bytes() for p in source.path("r0").iterdir()}
    for bad in ({"..": {"manifest.json": b"{}"}}, {".staging-r1": {"manifest.json": b"{}"}},
                {"r1": {"../x": b"{}", "manifest.json": b"{}"}}, {"r1": {"/etc/x": b"{}", "manifest.json": b"{}"}}):
        with pytest.raises(ValueError):
            store_runs(target, bad)
    assert not target.path("r1").exists()
    with pytest.raises(ValueError):  # a run without its manifest would never count as finished
        store_runs(target, {"r1": {"model.safetensors": b""}})
