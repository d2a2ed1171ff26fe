"""The plan is a value and each stage returns a record of its own: the plan cannot be assigned to,
the training record lists exactly the runs the store holds, and the attack record and the audit's
outcome carry what results.json shows."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from audit.attacking import AttackResults, attack_runs
from audit.config import load_config
from audit.pipeline import AuditOutcome, run_audit, train
from audit.planning import plan_audit
from audit.training import TrainedRuns


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    # dirac-canaries audits a claim: on FedAvg, which makes none, training skips it and says why
    path.write_text("seed: 3\ndataset: {name: digits, max_pool: 200, max_test: 100}\npartition: {clients: 4}\n"
                    "training: {rounds: 2, local_steps: 2, batch_size: 10, lr: 0.1}\nmembership: {runs: 2}\n"
                    "diagnostics: {enabled: false}\n"
                    "attacks:\n  - name: loss-threshold\n  - name: record-canaries\n  - name: dirac-canaries\n"
                    "defenses:\n  - name: fedavg\n")
    return load_config(path)


def test_the_plan_and_its_experiments_cannot_be_assigned_to(config):
    plan = plan_audit(config)
    with pytest.raises(FrozenInstanceError):
        plan.experiments = []  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        plan.experiments[0].key = "other"  # type: ignore[misc]
    assert not any(hasattr(plan, name) for name in ("run_ids", "canary_ids", "skipped", "diverged"))


def test_the_plan_is_immutable_all_the_way_down(config):
    """Its experiments' defenses, its attacks, its task and its membership design: nothing a stage holds
    can be changed under another stage (or another run)."""
    plan = plan_audit(config)
    assert isinstance(plan.experiments, tuple) and isinstance(plan.attacks, tuple)
    with pytest.raises(AttributeError, match="immutable value"):
        plan.experiments[0].defense.layout = None
    with pytest.raises(AttributeError, match="immutable value"):
        plan.attacks[0].label = "other"
    with pytest.raises(FrozenInstanceError):
        plan.task.pool = plan.task.test  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        plan.task.pool.labels = plan.task.test.labels  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        plan.membership.keep = plan.membership.keep  # type: ignore[misc]
    membership = plan.membership
    arrays = [membership.keep, membership.owners, *membership.parts, *(c for run in membership.clients for c in run)]
    assert all(not a.flags.writeable for a in arrays)
    with pytest.raises(ValueError, match="read-only"):
        membership.keep[0, 0] = not membership.keep[0, 0]
    assert isinstance(membership.clients, tuple) and all(isinstance(run, tuple) for run in membership.clients)


def test_the_training_record_lists_exactly_the_runs_in_the_store(config, tmp_path):
    plan = plan_audit(config)
    trained = train(plan, tmp_path)
    assert isinstance(trained, TrainedRuns)
    key = plan.experiments[0].key
    assert len(trained.run_ids[key]) == 2 and trained.diverged == {}
    assert list(trained.canary_ids[key]) == ["record-canaries"]
    listed = {*trained.run_ids[key], *trained.canary_ids[key]["record-canaries"]}
    assert listed == {p.name for p in (tmp_path / "runs").iterdir()}
    assert all(trained.store.is_complete(rid) for rid in listed)
    assert [s.attack for s in trained.skipped[key]] == ["dirac-canaries"]
    with pytest.raises(FrozenInstanceError):
        trained.run_ids = {}  # type: ignore[misc]
    # a rerun trains nothing and returns the same record (up to timings)
    again = train(plan, tmp_path)
    assert (again.run_ids, again.canary_ids, again.skipped) == (trained.run_ids, trained.canary_ids, trained.skipped)
    assert {p.name for p in (tmp_path / "runs").iterdir()} == listed

    attacked = attack_runs(plan, trained, tmp_path, quiet=True)
    assert isinstance(attacked, AttackResults) and list(attacked.results) == [key]
    assert {r.name for r in attacked.results[key]} >= {"loss-threshold", "record-canaries"}
    assert attacked.skipped[key] == ()
    with pytest.raises(FrozenInstanceError):
        attacked.results = {}  # type: ignore[misc]


def test_the_audit_outcome_carries_what_results_json_shows(config, tmp_path):
    outcome = run_audit(config, tmp_path / "out", quiet=True)
    assert isinstance(outcome, AuditOutcome) and outcome.results is not None and outcome.attacked is not None
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert outcome.paths["results_json"] == str(tmp_path / "out" / "results.json")
    (experiment,) = document["experiments"]
    key = experiment["key"]
    assert experiment["runs"] == list(outcome.trained.run_ids[key]) == outcome.results.experiments[0].runs
    assert experiment["canary_runs"] == {label: list(ids) for label, ids in outcome.trained.canary_ids[key].items()}
    assert [s["attack"] for s in experiment["skipped_attacks"]] == ["dirac-canaries"]
    stored = json.loads((tmp_path / "out" / "manifest.json").read_text())["experiments"]
    assert stored == {key: experiment["runs"]}
