"""No figure depends on the company a run keeps, through the whole pipeline.

Planning binds one defense object per experiment, and calibration (``epsilons``) derives new ones
from a base; the membership runs, the canary runs of the dense client-canaries audit and the stage
cache all go through them. Two experiments of one defense whose runs train on different data
(every membership run has its own clients), planned together and trained with their runs joined,
must store exactly the runs each experiment stores when planned alone and trained one run at a
time: the same claim, the same model bytes — for NbAFL (whose noise depends on each run's smallest
client) and FL-TOP-DP (whose public batch, clip and mask are each run's own).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from audit.cli import main

BASE = """\
seed: 3
dataset: {name: digits, max_pool: 240, max_test: 120}
partition: {name: dirichlet, clients: 5, alpha: 0.5}
training: {rounds: 2, local_steps: 1, batch_size: 10, lr: 0.05}
membership: {runs: 3}
attacks:
  - name: client-canaries
    params: {canaries: 8}
"""

#: two experiments of each defense: two parameter settings (NbAFL), two calibrated ε from one base (FL-TOP-DP)
TOGETHER = {
    "nbafl": "defenses:\n  - {name: nbafl, label: a}\n  - {name: nbafl, label: b, params: {clip: 5.0, epsilon: 2.0}}\n",
    "fl-top-dp": "defenses:\n  - {name: fl-top-dp, epsilons: [2, 4]}\n",
}
ALONE = {
    "nbafl": ["defenses:\n  - {name: nbafl, label: a}\n",
              "defenses:\n  - {name: nbafl, label: b, params: {clip: 5.0, epsilon: 2.0}}\n"],
    "fl-top-dp": ["defenses:\n  - {name: fl-top-dp, epsilons: [2]}\n", "defenses:\n  - {name: fl-top-dp, epsilons: [4]}\n"],
}


def _train(folder: Path, defenses: str, batch_runs: int) -> dict[tuple, tuple]:
    """Train the config; every stored run by (experiment label, membership or canary run, index): its
    claim, model digest and client sizes."""
    config = folder.with_suffix(".yaml")
    config.write_text(BASE + defenses)
    assert main(["train", str(config), "--out", str(folder), "--batch-runs", str(batch_runs), "--quiet"]) == 0
    runs = {}
    for run in sorted((folder / "runs").iterdir()):
        manifest = json.loads((run / "manifest.json").read_text())
        model = hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()
        canary = manifest.get("canaries")
        key = (manifest["label"], "canary" if canary else "membership", canary["index"] if canary else manifest["run_index"])
        runs[key] = (json.dumps(manifest["claim"], sort_keys=True), model, tuple(manifest["client_sizes"]))
    return runs


@pytest.mark.parametrize("name", sorted(TOGETHER))
def test_two_experiments_of_one_defense_equal_each_alone(tmp_path, name):
    together = _train(tmp_path / "together", TOGETHER[name], batch_runs=3)
    alone: dict[tuple, tuple] = {}
    for k, defenses in enumerate(ALONE[name]):
        alone.update(_train(tmp_path / f"alone-{k}", defenses, batch_runs=1))
    assert sorted(together) == sorted(alone)
    assert {kind for _, kind, _ in together} == {"membership", "canary"}, "the dense canary audit's runs are compared too"
    for key in together:
        assert together[key] == alone[key], key
    if name == "nbafl":  # runs of different smallest clients: different claims, each its own
        claims = {json.loads(claim)["epsilon"] for claim, _, _ in together.values()}
        assert len(claims) > 2
    # the stage cache: a rerun into the same folder reuses every run, byte for byte
    again = _train(tmp_path / "together", TOGETHER[name], batch_runs=2)
    assert again == together
