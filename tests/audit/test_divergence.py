"""Numerical failure is a result, not a crash: a run whose training turns
non-finite stops at that round, its experiment is recorded as diverged and its attacks are
skipped with the reason, and the rest of the audit completes — the same way on every rerun."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from importlib import resources

import jsonschema
import pytest

from audit.cli import main
from defenses.ae_dpfl import AEDPFL, AEDPFLParams
from defenses.fedavg import FedAvg
from defenses.federated.engine import FederatedEngine
from defenses.federated.training_job import TrainingDiverged
from defenses.run_batch import joinable, train_together

CONFIG = """\
name: divergence
dataset: {name: digits, max_pool: 120, max_test: 60}
partition: {clients: 3}
training: {rounds: 3, local_steps: 1, batch_size: 10, lr: 0.1}
membership: {runs: 2}
diagnostics: {sharpness_directions: 1, perturbation_repeats: 1, max_records: 30}
defenses:
  - name: fedavg
  - name: fedavg
    label: blows-up
    training: {lr: 1.0e30}
attacks: [{name: loss-threshold}, {name: record-canaries, params: {runs: 1}}]
"""
OUTPUTS = ("results.json", "results.csv", "report.html")


def _schema() -> dict:
    return json.loads(resources.files("reports").joinpath("schema/results.schema.json").read_text(encoding="utf-8"))


def test_a_diverged_experiment_is_a_result_and_the_audit_completes(tmp_path, capsys):
    config, out = tmp_path / "divergence.yaml", tmp_path / "out"
    config.write_text(CONFIG)
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "diverged" in line]
    assert warnings == ["dpfl-audit: warning: 'blows-up' run 0 diverged at round 1 (non-finite parameters); "
                        "its attacks are skipped"]
    assert "blows-up" in captured.out and "diverged" in captured.out  # the summary line of the CLI

    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, _schema(), cls=jsonschema.Draft202012Validator)
    healthy, diverged = document["experiments"]
    assert healthy["status"] == "completed" and "diverged" not in healthy
    assert {a["attack"] for a in healthy["attacks"]} == {"loss-threshold", "record-canaries"}
    assert healthy["utility"]["test_accuracy"]["value"] is not None and not healthy["skipped_attacks"]

    assert diverged["status"] == "diverged" and diverged["label"] == "blows-up"
    assert diverged["diverged"]["run"] == 0 and diverged["diverged"]["round"] == 1
    assert diverged["diverged"]["what"] == "non-finite parameters"
    assert diverged["attacks"] == [] and diverged["utility"]["test_accuracy"]["value"] is None
    skipped = {entry["attack"]: entry["reason"] for entry in diverged["skipped_attacks"]}
    assert set(skipped) == {"loss-threshold", "record-canaries"}
    assert all(reason == "training diverged: run 0 at round 1 (non-finite parameters)" for reason in skipped.values())

    # nothing of the diverged run in the store (a rerun must not take it for finished), no diagnostics of it
    assert not (out / "runs" / diverged["diverged"]["run_id"]).exists()
    assert not any(path.name.startswith(diverged["key"] + "-") for path in (out / "runs").iterdir())
    assert (out / "diagnostics" / f"{healthy['key']}.json").is_file()
    assert not (out / "diagnostics" / f"{diverged['key']}.json").exists()

    with open(out / "results.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["run"] == diverged["key"]]
    assert {(r["attack"], r["metric"], r["value"]) for r in rows if r["attack"] == "training"} == {
        ("training", "diverged_run", "0.0"), ("training", "diverged_at_round", "1.0")}
    html = (out / "report.html").read_text()
    assert "Training diverged" in html and "stopped at round 1 (non-finite parameters)" in html

    first = {name: (out / name).read_bytes() for name in OUTPUTS}
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0  # the same command again
    assert {name: (out / name).read_bytes() for name in OUTPUTS} == first


def _force_divergence(monkeypatch, what_diverges):
    """Make a run diverge where ``what_diverges(job, t)`` names what (after its round t finished as
    usual): at the round finishing that runs alone and runs trained together share."""
    import defenses.run_batch
    from defenses.federated import engine

    finish = engine.finish_rounds

    def failing(engines, states, t, contexts, updates, rows):
        out = finish(engines, states, t, contexts, updates, rows)
        forced = [what_diverges(e.job, t) for e in engines]
        return [d if d is not None or what is None else TrainingDiverged(t + 1, what, state.metrics)
                for d, what, state in zip(out, forced, states)]

    monkeypatch.setattr(engine, "finish_rounds", failing)
    monkeypatch.setattr(defenses.run_batch, "finish_rounds", failing)


def test_a_later_run_diverging_keeps_the_runs_before_it_and_reruns_alike(tmp_path, monkeypatch, capsys):
    """Run 1 of 4 diverges at round 2 (forced): runs 0 (and those trained beside it) are stored, the
    experiment records run 1, and a rerun — which trains run 1 again — writes the same bytes."""
    from audit.core.seeding import derive_seed

    target_seed = derive_seed(0, "run", 1)
    _force_divergence(monkeypatch, lambda job, t: "non-finite test loss"
                      if job.seed == target_seed and job.training.lr > 1 and t + 1 == 2 else None)
    config, out = tmp_path / "later.yaml", tmp_path / "out"
    config.write_text(CONFIG.replace("runs: 2}", "runs: 4}").replace("lr: 1.0e30", "lr: 1.5") + "seed: 0\n")
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    assert "'blows-up' run 1 diverged at round 2 (non-finite test loss)" in capsys.readouterr().err
    document = json.loads((out / "results.json").read_text())
    diverged = document["experiments"][1]
    assert diverged["diverged"] == {"run": 1, "run_id": diverged["diverged"]["run_id"], "round": 2,
                                    "what": "non-finite test loss"}
    assert len(diverged["runs"]) == 1 and (out / "runs" / diverged["runs"][0] / "manifest.json").is_file()
    assert not (out / "runs" / diverged["diverged"]["run_id"]).exists()
    first = {name: (out / name).read_bytes() for name in OUTPUTS}
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    assert {name: (out / name).read_bytes() for name in OUTPUTS} == first


def test_a_diverged_canary_or_side_run_skips_only_its_audit(tmp_path, monkeypatch, capsys):
    """A canary audit's own run, or the side run an attack retrains on another dataset, diverges
    (forced): that audit is skipped with the reason; the experiment and its other attacks stand."""
    from audit.core.seeding import derive_seed

    failing_seeds = {derive_seed(0, "canary-run", "record-canaries", 0),
                     derive_seed(0, "side-run", "fedavg", "diabetes")}
    _force_divergence(monkeypatch, lambda job, t: "non-finite parameters" if job.seed in failing_seeds else None)
    config, out = tmp_path / "side.yaml", tmp_path / "out"
    config.write_text(CONFIG.split("defenses:")[0] + "defenses: [{name: fedavg}]\nattacks: [{name: loss-threshold}, "
                      "{name: record-canaries, params: {runs: 1}}, {name: attribute-inference, params: {max_targets: 10}}]\n")
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr()
    err = printed.err
    # the console summary says which audit did not run and why, as the report does
    assert ("  not run on fedavg: record-canaries: training diverged: canary run 0 at round 1 (non-finite parameters)"
            in printed.out.splitlines())
    assert "'fedavg' record-canaries canary run 0 diverged at round 1 (non-finite parameters); this audit is skipped" in err
    assert "'fedavg' attribute-inference: side run diverged at round 1 (non-finite parameters)" in err
    (experiment,) = json.loads((out / "results.json").read_text())["experiments"]
    assert experiment["status"] == "completed" and [a["attack"] for a in experiment["attacks"]] == ["loss-threshold"]
    assert experiment["skipped_attacks"] == [
        {"attack": "record-canaries", "reason": "training diverged: canary run 0 at round 1 (non-finite parameters)"},
        {"attack": "attribute-inference", "reason": "training diverged: its side run at round 1 (non-finite parameters)"}]
    assert experiment["canary_runs"] == {}


def test_the_engine_stops_a_diverging_run_at_its_first_round(digits_job):
    job = digits_job(rounds=5, lr=float("inf"))
    seen = []
    with pytest.raises(TrainingDiverged) as caught:
        FederatedEngine(FedAvg(), job).run(lambda done, total, row: seen.append(done))
    assert caught.value.round == 1 and caught.value.what == "non-finite parameters"
    assert "round 1" in str(caught.value) and seen == []  # not after all 5 rounds
    assert [row["round"] for row in caught.value.metrics] == [1]
    assert caught.value.metrics[0]["diverged"] == "non-finite parameters"


def test_a_finite_model_with_a_non_finite_loss_diverges(digits_job):
    """A huge server step leaves finite parameters whose logits overflow: the training loss says so."""
    with pytest.raises(TrainingDiverged) as caught:
        FedAvg().train(digits_job(rounds=5, server_lr=1e30))
    assert caught.value.round == 1 and caught.value.what == "non-finite training loss"


def test_runs_trained_together_report_divergence_per_run(digits_job):
    """The joint path gives each diverged run its TrainingDiverged in place of an outcome; finite
    runs of the same call train to the end."""
    bad = digits_job(rounds=4, lr=float("inf"))
    runs = [replace(bad, seed=bad.seed + k) for k in range(3)]
    assert joinable(FedAvg(), runs)
    rounds = []
    results = train_together(FedAvg(), runs, lambda done, total: rounds.append(done))
    assert all(isinstance(r, TrainingDiverged) and r.round == 1 for r in results)
    assert rounds == [1]  # nothing left to train after round 1
    good = digits_job(rounds=2)
    outcomes = train_together(FedAvg(), [good, replace(good, seed=good.seed + 1)])
    assert all(not isinstance(o, TrainingDiverged) and len(o.metrics) == 2 for o in outcomes)


def test_ae_dpfl_reports_divergence(digits_job):
    defense = AEDPFL(AEDPFLParams(queries=20, local_epochs=1, server_epochs=1))
    with pytest.raises(TrainingDiverged) as caught:
        defense.train(digits_job(lr=float("inf")))
    assert caught.value.round == 1 and "non-finite" in caught.value.what
