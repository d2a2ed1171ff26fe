"""Canary audits: injection in the engine, null calibration, power on a leaky defense, and the
soundness of DP-FedAvg's claim under record, client and gradient canaries."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from attacks.base import ATTACKS
from attacks.canaries.canary_audit import CanaryRun, canary_result
from audit.cli import main
from audit.config import load_config
from audit.core.seeding import derive_seed
from audit.planning import canary_context, plan_audit
from audit.store import RunStore
from audit.training import train_runs
from defenses.base import DEFENSES, NO_STATE
from defenses.fedavg import DPFedAvg, DPFedAvgParams, FedAvg
from defenses.federated.engine import initial_vector

CANARY_AUDITS = ("record-canaries", "client-canaries", "gradient-canaries")
#: the results they give: update canaries read the final model and every round's
CANARY_RESULTS = {*CANARY_AUDITS, "client-canaries-all-iterates", "gradient-canaries-all-iterates"}


# ------------------------------------------------------------------ injection in the engine


def test_no_canary_is_bit_identical_to_no_injection(digits_job):
    job = digits_job(client_rate=0.5)
    defense = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0))
    plain = defense.train(job)
    dim = sum(v.numel() for v in plain.final_params.values())
    empty = defense.train(replace(job, update_canaries=torch.zeros(0, dim)))
    for name in plain.final_params:
        assert torch.equal(plain.final_params[name], empty.final_params[name])


def test_canary_clients_join_at_the_sampling_rate_with_the_clip_norm(digits_job):
    job = digits_job(rounds=4, client_rate=0.5)
    clip = 0.5
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=1e-9, noise_placement="aggregate"))
    base = defense.train(job)
    dim = sum(v.numel() for v in base.final_params.values())
    direction = torch.zeros(1, dim)
    direction[0, 0] = 1.0
    with_canary = defense.train(replace(job, update_canaries=direction))
    joined = [row["canary_participants"] for row in with_canary.metrics]
    assert set(joined) <= {0, 1}
    # Poisson at rate 0.5 over many canaries: the share that joins matches the rate (±4 standard errors)
    many = defense.train(replace(job, training=replace(job.training, rounds=1), update_canaries=torch.eye(dim)[:400]))
    share = many.metrics[0]["canary_participants"] / 400
    assert abs(share - 0.5) <= 4 * np.sqrt(0.25 / 400)
    # the canary's clipped update is privatised and averaged like any upload: with no noise, each round it
    # joins moves coordinate 0 of the global model (a first-layer weight) by clip/|P_t| more than without it
    assert defense.audit_hooks().canary_norm(torch.tensor([3.0, 0.1])) == clip
    assert FedAvg().audit_hooks().canary_norm(torch.tensor([3.0, 1.0, 2.0])) == 2.0  # no clip: the median honest norm
    first = next(iter(base.final_params))
    shift = float(with_canary.final_params[first].flatten()[0] - base.final_params[first].flatten()[0])
    assert shift > 0 if sum(joined) else shift == 0


# ------------------------------------------------------------------ null and leaky audits through the pipeline


def _config(tmp_path, defense: str, epsilons: str = "", seed: int = 0, attacks=CANARY_AUDITS, extra: str = "",
            training: str = "rounds: 3, local_steps: 2"):
    path = tmp_path / f"{defense}-{seed}.yaml"
    path.write_text(
        f"seed: {seed}\ndataset: {{name: digits, max_pool: 200, max_test: 100}}\npartition: {{clients: 4}}\n"
        f"training: {{{training}, batch_size: 10, lr: 0.1}}\nmembership: {{runs: 2}}\n"
        "diagnostics: {enabled: false}\n"
        "attacks:\n" + "".join(f"  - name: {a}\n" for a in attacks)
        + f"defenses:\n  - name: {defense}\n" + (f"    epsilons: [{epsilons}]\n" if epsilons else "") + extra)
    return path


def test_canary_audits_are_null_on_runs_that_never_saw_the_canaries(tmp_path):
    """The canaries are scored on runs trained without them (the membership runs): every ε figure
    must be 0 within its interval, whatever the inserted flags say — from the final model and from
    every round's (the runs keep all their global models, as canary runs do)."""
    config = load_config(_config(tmp_path, "fedavg", extra="record: {global_rounds: all}\n"))
    plan = plan_audit(config)
    store = RunStore(tmp_path / "out")
    trained = train_runs(plan, store, quiet=True)
    experiment = plan.experiments[0]
    model = plan.task.model_factory()
    context = canary_context(plan, experiment)
    for audit in plan.canary_audits:
        runs = []
        for i, rid in enumerate(trained.run_ids[experiment.key]):
            params = store.load_params(rid)
            _, layout, initial = initial_vector(plan.task.model_factory, derive_seed(config.seed, "run", i))
            models = store.load_tensors(rid, "global_models")
            iterates = torch.stack([models[f"round_{t:04d}"] for t in range(1, experiment.training.rounds + 1)])
            runs.append(CanaryRun(audit.injection(context, i), layout.flatten(params), initial, params, iterates))
        results = audit.evaluate(context, runs, model)
        assert [r.observation for r in results] == ([None] if audit.name == "record-canaries"
                                                    else ["final model", "all iterates"])
        for result in results:
            m = result.metrics
            assert 0.4 <= m["auc"].value <= 0.6, (result.name, m["auc"])
            assert m["epsilon_one_run"].value == 0.0 or m["epsilon_one_run"].value < 0.2, (result.name, m["epsilon_one_run"])
            assert m["epsilon_gaussian_fit"].low == 0.0, (result.name, m["epsilon_gaussian_fit"])


def test_canary_result_null_and_leaky_statistics():
    rng = np.random.default_rng(0)
    inserted = rng.random((1, 1000)) < 0.5
    null = canary_result("x", "record", rng.normal(size=(1, 1000)), inserted, 1e-5, 0, "")
    assert null.metrics["epsilon_one_run"].value < 0.2
    assert "epsilon_lower_bound" not in null.metrics  # no Clopper–Pearson on canaries that share a run
    assert null.metrics["epsilon_gaussian_fit"].low == 0.0
    # a Gaussian mechanism with μ = 4 (ε ≈ 12 at δ = 1e-5): every figure far above 0, none above the truth
    leaky = canary_result("x", "record", rng.normal(size=(1, 1000)) + 4.0 * inserted, inserted, 1e-5, 0, "")
    from audit.core.empirical_epsilon import gaussian_pair_epsilon

    truth = gaussian_pair_epsilon(1e-5, 4.0, 1.0, 0.0, 1.0)
    assert 2.0 < leaky.metrics["epsilon_one_run"].value < truth
    assert leaky.metrics["epsilon_gaussian_fit"].low < truth < leaky.metrics["epsilon_gaussian_fit"].high


def test_nonprivate_fedavg_leaks_to_every_canary_audit(tmp_path):
    out = tmp_path / "out"
    # long enough local training for the model to memorise mislabelled records
    path = _config(tmp_path, "fedavg", training="rounds: 5, local_steps: 10")
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    document = json.loads((out / "results.json").read_text())
    attacks = {a["attack"]: a for a in document["experiments"][0]["attacks"]}
    assert set(attacks) == CANARY_RESULTS
    assert {a: attacks[a].get("observation") for a in attacks if "canaries" in a and a != "record-canaries"} == {
        "client-canaries": "final model", "client-canaries-all-iterates": "all iterates",
        "gradient-canaries": "final model", "gradient-canaries-all-iterates": "all iterates"}
    for name, attack in attacks.items():
        assert attack["metrics"]["auc"]["value"] > 0.7, name
        # record canaries must be memorised through SGD, update canaries are the update itself
        assert attack["metrics"]["epsilon_one_run"]["value"] > (0.3 if name == "record-canaries" else 2.0), name
        assert {v["status"] for v in attack["verdicts"]} == {"no claim"}
    # FedAvg clips nothing: its canary clients carry the median honest norm, and the results say so
    for name in ("client-canaries", "client-canaries-all-iterates"):
        assert "scaled to each round's median honest update norm" in attacks[name]["notes"], name


# ------------------------------------------------------------------ soundness


@pytest.mark.parametrize("epsilon", [1, 4])
def test_dp_fedavg_claims_hold_under_every_canary_audit(tmp_path, epsilon):
    """DP-FedAvg is sound: no violation under record, client and gradient canaries over three seeds."""
    for seed in range(3):
        out = tmp_path / f"out-{epsilon}-{seed}"
        assert main(["run", str(_config(tmp_path, "dp-fedavg", str(epsilon), seed)), "--out", str(out), "--quiet"]) == 0
        experiment = json.loads((out / "results.json").read_text())["experiments"][0]
        assert experiment["claim"]["epsilon"] <= epsilon and experiment["claim"]["unit"] == "client"
        assert {a["attack"] for a in experiment["attacks"]} == CANARY_RESULTS
        assert not any("median honest update norm" in a["notes"] for a in experiment["attacks"])  # they carry the clip
        assert experiment["soundness"] in ("consistent", "inconclusive"), experiment["soundness"]
        for attack in experiment["attacks"]:
            for verdict in attack["verdicts"]:
                assert verdict["status"] in ("consistent", "inconclusive"), (seed, attack["attack"], verdict["text"])
                # record canaries are held to group privacy (2ε); client-level canaries to ε
                assert verdict["bound"] == pytest.approx((2 if attack["unit"] == "record" else 1) *
                                                         experiment["claim"]["epsilon"])


@dataclass(frozen=True)
class _OverclaimingParams(DPFedAvgParams):
    claimed_noise_multiplier: float = 20.0


@DEFENSES.register
class _OverclaimingDPFedAvg(DPFedAvg):
    """DP-FedAvg whose claim is computed for far more noise than it adds: an unsound claim."""

    name = "test-overclaiming-dp-fedavg"
    Params = _OverclaimingParams

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE):
        honest = DPFedAvg(DPFedAvgParams(clip=self.params.clip, noise_multiplier=self.params.claimed_noise_multiplier))
        return honest.privacy_claim(training, num_clients, rounds, delta, accounting, state)


def test_an_unsound_claim_is_reported_as_a_violation(tmp_path):
    extra = "    params: {noise_multiplier: 0.3, claimed_noise_multiplier: 20.0}\n"
    out = tmp_path / "out"
    path = _config(tmp_path, "test-overclaiming-dp-fedavg", attacks=("gradient-canaries", "client-canaries"), extra=extra)
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    experiment = json.loads((out / "results.json").read_text())["experiments"][0]
    assert experiment["claim"]["epsilon"] < 0.5
    assert experiment["soundness"] == "violation"
    texts = [v["text"] for a in experiment["attacks"] for v in a["verdicts"] if v["status"] == "violation"]
    assert texts and all(t.startswith("VIOLATION: ε_LB = ") and "Holm level" in t for t in texts)
    html = (out / "report.html").read_text()
    assert "VIOLATION" in html


def test_audits_that_cannot_run_are_listed_as_skipped(tmp_path):
    out = tmp_path / "out"
    path = _config(tmp_path, "dp-fedavg-lus", "4", attacks=("client-canaries", "record-canaries"))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    experiment = json.loads((out / "results.json").read_text())["experiments"][0]
    assert [s["attack"] for s in experiment["skipped_attacks"]] == ["client-canaries"]
    assert [a["attack"] for a in experiment["attacks"]] == ["record-canaries"]
    assert ATTACKS.get("client-canaries")().not_applicable(DEFENSES.get("dp-fedavg-lus")()) is not None


@pytest.mark.parametrize("inserted", [1, 0])
def test_a_canary_audit_with_every_canary_inserted_or_none_reports_an_unknown_roc(inserted):
    # a few canaries can all land on one side by chance: the ROC figures are reported as unknown
    # (the results schema requires them of every canary audit), never left out, never a number
    from attacks.canaries.canary_audit import canary_result

    statistics = np.random.default_rng(0).normal(size=(2, 6))
    result = canary_result("record-canaries", "record", statistics, np.full((2, 6), inserted), 1e-5, 0, "notes")
    assert set(result.metrics) == {"auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%"}
    assert all(np.isnan(e.value) for e in result.metrics.values())
