"""The process executor trains the same runs to the same bytes as the local one."""

from __future__ import annotations

from audit.cli import main

CONFIG = """dataset: {name: digits, max_pool: 300, max_test: 100}
partition: {clients: 5}
training: {rounds: 3, local_steps: 2, batch_size: 10, lr: 0.1, momentum: 0.9}
membership: {runs: 4}
diagnostics: {enabled: false}
attacks: [{name: lira}, {name: client-canaries}]
defenses: [{name: fedavg}, {name: dp-fedavg, epsilons: [4]}]
"""


def test_process_pool_gives_identical_results(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    local, pooled = tmp_path / "local", tmp_path / "pooled"
    assert main(["run", str(config), "--out", str(local), "--quiet"]) == 0
    assert main(["run", str(config), "--out", str(pooled), "--quiet", "--executor", "process", "--workers", "2"]) == 0
    for name in ("results.csv", "results.json"):
        assert (local / name).read_bytes() == (pooled / name).read_bytes(), name
    assert sorted(p.name for p in (local / "runs").iterdir()) == sorted(p.name for p in (pooled / "runs").iterdir())


def test_unknown_executor_is_bad_input(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--executor", "cluster"]) == 2
    assert "--executor: unknown executor 'cluster'; allowed: local, process" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--executor", "process", "--workers", "0"]) == 2
