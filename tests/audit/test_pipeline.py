"""End to end through the CLI entry point: outputs, determinism, resume, escaping, user components."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np

from audit.cli import main
from defenses.base import Defense
from tests.helpers import HOSTILE

REPO = Path(__file__).resolve().parents[2]


def test_outputs_exist_and_rows_are_tidy(smoke_runs):
    _, (out, _) = smoke_runs
    for name in ("report.html", "results.csv", "results.json", "manifest.json", "config.yaml", "run.log"):
        assert (out / name).is_file(), name
    # the smoke preset's gradient inversion: its reconstruction grids are figure files too
    grids = sorted(p.name for p in (out / "figures").glob("reconstruction-*"))
    assert grids and {g.rsplit(".", 1)[1] for g in grids} == {"png", "pdf"}
    assert all((out / "figures" / g).stat().st_size > 1000 for g in grids)
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["run", "dataset", "defense", "label", "epsilon", "delta", "unit", "accountant",
                             "seed", "attack", "metric", "value", "ci_low", "ci_high"]
    keys = {(r["run"], r["attack"], r["metric"]) for r in rows}
    for run in ("fedavg", "dp-fedavg-eps8"):
        assert (run, "none", "test_accuracy") in keys
        for attack in ("lira-online", "lira-offline"):
            for metric in ("auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%", "epsilon_one_run"):
                assert (run, attack, metric) in keys
    dp = [r for r in rows if r["run"] == "dp-fedavg-eps8"][0]
    assert float(dp["epsilon"]) <= 8.0 and dp["unit"] == "client" and "rdp-improved" in dp["accountant"]
    document = json.loads((out / "results.json").read_text())
    assert document["schema_version"] and len(document["experiments"]) == 2
    # 8 membership runs each, one run per canary audit, one side run on diabetes for attribute inference,
    # and the private configuration's 2 Dirac canary runs (fedavg makes no claim to audit)
    assert len(list((out / "runs").iterdir())) == 16 + 2 * 2 + 2 + 2
    for experiment in document["experiments"]:  # the default report: LiRA, Shokri, a threshold and two canary audits
        names = {a["attack"] for a in experiment["attacks"]}
        assert {"lira-online", "lira-offline", "rmia-online", "rmia-offline", "shokri", "loss-threshold", "record-canaries",
                "client-canaries"} <= names
        assert all(a["verdicts"] for a in experiment["attacks"] if a["kind"] != "run")
        # the reconstruction and inference rows: a reconstruction grid and attribute inference (digits has no
        # attribute: the defense is retrained on diabetes, whose sensitive attribute is sex)
        inversion = next(a for a in experiment["attacks"] if a["attack"] == "gradient-inversion")
        assert inversion["figures"] and -1.0 <= inversion["metrics"]["ssim"]["value"] <= 1.0  # SSIM lies in [−1, 1]
        attribute = next(a for a in experiment["attacks"] if a["attack"] == "attribute-inference-sex")
        advantage = attribute["metrics"]["white_box.advantage"]
        assert advantage["ci_low"] <= advantage["value"] <= advantage["ci_high"] and "diabetes" in attribute["notes"]
    assert document["experiments"][0]["soundness"] == "no claim"
    # 8 runs of 4 clients cannot certify a violation of ε = 8: no violation, and the verdict says it had no power
    assert document["experiments"][1]["soundness"] == "inconclusive"
    for attack in document["experiments"][1]["attacks"]:
        for verdict in attack["verdicts"]:
            if verdict["kind"] == "lower_bound" and verdict["status"] not in ("vacuous", "no measurement"):
                assert verdict["family"] >= 2 and verdict["power"]["detection"] < 0.8, verdict
    assert document["audit"]["membership_unit"] == "client"  # dp-fedavg claims client-level DP


def test_fedavg_leaks_in_the_smoke_audit(smoke_runs):
    _, (out, _) = smoke_runs
    document = json.loads((out / "results.json").read_text())
    fedavg = document["experiments"][0]
    online = next(a for a in fedavg["attacks"] if a["attack"] == "lira-online")
    assert online["metrics"]["auc"]["value"] > 0.55
    assert fedavg["utility"]["test_accuracy"]["value"] > 0.8


def test_same_seed_gives_byte_identical_results(smoke_runs):
    _, (first, second) = smoke_runs
    assert (first / "results.csv").read_bytes() == (second / "results.csv").read_bytes()
    assert (first / "results.json").read_bytes() == (second / "results.json").read_bytes()


def test_rerun_resumes_without_training(smoke_runs, monkeypatch, tmp_path):
    config, (first, _) = smoke_runs
    resumed = tmp_path / "resumed"
    shutil.copytree(first, resumed)
    before = (resumed / "results.csv").read_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(Defense, "train", refuse)
    assert main(["run", str(config), "--out", str(resumed), "--quiet"]) == 0
    assert (resumed / "results.csv").read_bytes() == before


def test_report_escapes_config_text(smoke_runs):
    _, (out, _) = smoke_runs
    html = (out / "report.html").read_text()
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for section in ('id="summary"', 'id="results"', 'id="plots"', 'id="provenance"'):
        assert section in html
    assert html.count("data:image/png;base64,") >= 3  # accuracy vs ε and two ROC plots
    assert "http://" not in html and "https://" not in html.replace("https://archive", "")


def test_user_dataset_model_and_defense(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    out = tmp_path / "custom"
    assert main(["run", "examples/custom.yaml", "--out", str(out), "--quiet"]) == 0
    document = json.loads((out / "results.json").read_text())
    labels = [e["label"] for e in document["experiments"]]
    assert labels == ["FedProx (mu=0.1)", "dp-fedavg (ε=4)"]
    assert document["experiments"][0]["params"] == {"mu": 0.1}
    assert document["audit"]["dataset_source"] == "sklearn.datasets.load_breast_cancer"


ALL_DEFENSES = ["fedavg", "dp-fedavg", "dp-fedavg-blur", "dp-fedavg-lus", "dp-fedavg-blur-lus", "ddgauss", "ae-dpfl",
                "fedsam", "dp-fedsam", "dp-fedsam-topk", "fed-smp-randk", "fed-smp-topk", "udp-fl", "udp-fl", "udp-fl", "nbafl",
                "fl-top", "fl-top-dp", "fl-basic", "fl-basic-dp", "fl-std", "fl-std-dp", "fl-cs", "fl-cs-dp", "ldp-fl"]
EXTRA_PARAMS = {"ae-dpfl": ["{queries: 40, local_epochs: 2, server_epochs: 2}"],
                "udp-fl": ["{sample_rate: 0.2, mechanism: gaussian}", "{sample_rate: 0.2, mechanism: laplace}",
                           "{sample_rate: 0.2, mechanism: staircase, clip_norm: l1}"],
                "fl-basic-dp": ["{calibration_subsets: 3}"]}


def test_every_defense_runs_end_to_end(tmp_path):
    """Each registered defense trains through `dpfl-audit run` and gets attacked and reported."""
    from defenses.catalog import DEFENSES

    assert set(ALL_DEFENSES) <= set(DEFENSES.names())
    private = {"fedavg": False, "fedsam": False, "fl-top": False, "fl-basic": False, "fl-std": False, "fl-cs": False}
    seen: dict[str, int] = {}
    lines = []
    for name in ALL_DEFENSES:
        index = seen[name] = seen.get(name, -1) + 1
        lines.append(f"  - name: {name}" + ("" if not private.get(name, True) else "\n    epsilons: [6]")
                     + (f"\n    params: {EXTRA_PARAMS[name][index]}" if name in EXTRA_PARAMS else ""))
    entries = "\n".join(lines)
    config = tmp_path / "all.yaml"
    config.write_text(
        "dataset: {name: digits, max_pool: 160, max_test: 100}\npartition: {clients: 4}\n"
        "training: {rounds: 2, local_steps: 1, batch_size: 10, lr: 0.1}\nmembership: {runs: 4}\n"
        "diagnostics: {sharpness_directions: 1, perturbation_repeats: 1, max_records: 50}\n"
        "attacks: [{name: lira}, {name: shokri}, {name: loss-threshold}, {name: record-canaries}, {name: client-canaries},\n"
        "          {name: gradient-inversion, params: {iterations: 20, batch_size: 1}}, {name: attribute-inference}]\n"
        f"defenses:\n{entries}\n")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [e["defense"] for e in document["experiments"]] == ALL_DEFENSES
    for experiment in document["experiments"]:
        assert experiment["utility"]["test_accuracy"]["value"] is not None
        assert experiment["diagnostics"]["sharpness"]["mean_rise"]
        if experiment["defense"] not in private:
            claim = experiment["claim"]
            if experiment["defense"] == "nbafl":  # 'epsilons' set the paper's ε; the claim is the sound one of that noise
                assert claim["alternatives"]["paper_record_level"] == 6.0 and claim["relation"] == "replace-one"
            else:
                assert claim["epsilon"] <= 6.0
            unit = {"udp-fl": "record", "ldp-fl": "weight"}.get(experiment["defense"], "client")
            assert claim["unit"] == unit
            assert {a["adversary"] for a in claim["adversaries"]} == {"released", "server", "local"}
    mechanisms = [e["claim"]["mechanism"].split(" noise")[0] for e in document["experiments"] if e["defense"] == "udp-fl"]
    assert [m.split("with ")[1].split("(")[0] for m in mechanisms] == ["GaussianNoise", "LaplaceNoise", "StaircaseNoise"]
    default = {"lira-online", "lira-offline", "shokri", "loss-threshold", "record-canaries", "client-canaries",
               "client-canaries-all-iterates", "gradient-inversion", "attribute-inference-sex"}
    no_update_canaries = {"dp-fedavg-lus", "dp-fedavg-blur-lus", "ae-dpfl"}  # their uploads are not a clipped sum
    replayed_uploads = {"fedavg", "fedsam", "dp-fedavg"}  # attacks.server_view
    for experiment in document["experiments"]:
        skipped = {entry["attack"] for entry in experiment["skipped_attacks"]}
        expected = ({"client-canaries"} if experiment["defense"] in no_update_canaries else set()) | \
            (set() if experiment["defense"] in replayed_uploads else {"gradient-inversion"})
        assert skipped == expected, experiment["label"]
        results_of_skipped = skipped | ({"client-canaries-all-iterates"} if "client-canaries" in skipped else set())
        assert {a["attack"] for a in experiment["attacks"]} == default - results_of_skipped
        assert experiment["soundness"] in {"consistent", "inconclusive", "no claim", "not covered", "vacuous"}, \
            (experiment["label"], experiment["soundness_text"])
    # a membership run of FL-TOP (side runs of the run attacks store no layout); sorted: the file
    # system's listing order is arbitrary
    manifests = [json.loads(path.read_text()) for path in sorted((tmp_path / "out" / "runs").glob("fl-top-*/manifest.json"))]
    shapes = next(m for m in manifests if "layout" in m)["layout"]["shapes"]
    dim = sum(int(np.prod(shape)) for shape in shapes)
    kept = int(0.05 * dim)  # the default keep_fraction r = 5 %: K = ⌊r·n⌋ floats of 32 bits
    bandwidth = {e["defense"]: (e["diagnostics"]["bits_up_per_client_round"]["value"],
                                e["diagnostics"]["bits_down_per_client_round"]["value"])
                 for e in document["experiments"] if e["defense"].startswith("fl-")}
    assert bandwidth["fl-top"] == bandwidth["fl-top-dp"] == (32 * kept, 32 * kept)
    assert bandwidth["fl-basic"] == bandwidth["fl-cs-dp"] == (32 * kept, 32 * dim)
    assert bandwidth["fl-std"] == (32 * dim, 32 * dim)
    assert "bits_up_per_client_round" not in document["experiments"][0]["diagnostics"]
    assert "KB per client per round" in (tmp_path / "out" / "report.html").read_text()
