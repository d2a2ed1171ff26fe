"""``dpfl-audit check``: policies, rule outcomes, baselines, JUnit XML and exit codes.

The results documents are synthetic but shaped like a real ``results.json`` (the fields the
checker reads: experiments with key, label, defense, claim, utility, attacks with metrics and
intervals, soundness), so every test runs in milliseconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import yaml
from scipy.stats import norm

import audit
from audit.cli import main
from audit.core.errors import UserInputError
from audit.core.typed_json import from_json
from reports.document import Results, results_schema
from reports.gate import FAIL, PASS, SKIP, evaluate_policy, load_results, rule_warnings
from reports.junit import junit_xml
from reports.measures import cannot_fail
from reports.policy import load_policy, parse_policy

REPOSITORY = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- synthetic results


def estimate(value, ci_low=None, ci_high=None) -> dict:
    return {"value": value, "ci_low": ci_low, "ci_high": ci_high}


def membership_attack(name: str, auc: tuple, tpr: tuple = (0.02, 0.0, 0.08), epsilon_lb: float = 0.0) -> dict:
    return {"attack": name, "unit": "client", "kind": "membership", "notes": "",
            "metrics": {"auc": estimate(*auc), "tpr_at_fpr_1%": estimate(*tpr),
                        "balanced_accuracy": estimate(0.55), "epsilon_one_run": estimate(epsilon_lb, epsilon_lb, None)},
            "epsilon_kind": {"epsilon_one_run": "lower_bound"}, "verdicts": []}


def experiment(key: str, defense: str, *, label: str | None = None, epsilon: float | None = None,
               accuracy: tuple = (0.9, 0.88, 0.92), auc: tuple = (0.55, 0.52, 0.58), epsilon_lb: float = 0.0,
               soundness: str = "consistent", soundness_text: str = "", attacks: list | None = None) -> dict:
    """One experiment entry of results.json with a lira-online and a shokri attack."""
    return {
        "key": key, "label": label or key, "defense": defense, "target_epsilon": epsilon,
        "claim": {"epsilon": epsilon, "delta": 1e-5 if epsilon else 0.0, "unit": "client" if epsilon else "none",
                  "accountant": "rdp" if epsilon else "none"},
        "utility": {"test_accuracy": estimate(*accuracy), "test_loss": estimate(0.4, 0.35, 0.45)},
        "attacks": attacks if attacks is not None else [
            membership_attack("lira-online", auc, epsilon_lb=epsilon_lb),
            membership_attack("shokri", (0.52, 0.45, 0.59)),
        ],
        "soundness": soundness, "soundness_text": soundness_text, "skipped_attacks": [],
    }


def default_experiments() -> list[dict]:
    return [experiment("fedavg", "fedavg", accuracy=(0.94, 0.93, 0.95), auc=(0.59, 0.56, 0.62), soundness="no claim"),
            experiment("dp-fedavg-eps1", "dp-fedavg", label="dp-fedavg (ε=1)", epsilon=1.0, accuracy=(0.15, 0.1, 0.2),
                       auc=(0.504, 0.47, 0.54)),
            experiment("dp-fedavg-eps4", "dp-fedavg", label="dp-fedavg (ε=4)", epsilon=4.0, accuracy=(0.62, 0.58, 0.66),
                       auc=(0.507, 0.47, 0.54))]


def _stored(experiment: dict) -> dict:
    """``experiment`` with the members results.json always has that the checker does not read
    (claim per observer, ROC, figures, curves, diagnostics), as ``load_results`` demands them."""
    experiment = json.loads(json.dumps(experiment))
    claim = experiment["claim"]
    claim.setdefault("mechanism", "")
    claim.setdefault("notes", "")
    claim.setdefault("alternatives", {})
    claim.setdefault("relation", "add-remove" if claim["epsilon"] is not None else "none")
    claim.setdefault("adversary", "released")
    claim.setdefault("adversaries", [])
    for value in experiment["utility"].values():
        value.setdefault("runs", 8)
    for attack in experiment["attacks"]:
        if attack.get("kind") in ("membership", "canary"):
            attack["metrics"].setdefault("tpr_at_fpr_0.1%", estimate(0.0, 0.0, 0.05))
        attack.setdefault("roc", {"fpr": [], "tpr": []})
        attack.setdefault("figures", [])
    unmeasured = {**estimate(None), "runs": 8}
    diagnostics = {name: unmeasured for name in ("train_accuracy", "generalization_gap", "clip_fraction",
                                                 "update_norm_median_first_round", "update_norm_median_last_round")}
    for key, empty in (("reference", ""), ("params", {}), ("training", {}), ("server_view", ""), ("rounds", []),
                       ("diagnostics", diagnostics), ("runs", []), ("canary_runs", {}), ("status", "completed")):
        experiment.setdefault(key, empty)
    return experiment


def document_of(experiments: list[dict]) -> dict:
    """A minimal valid results.json document (schema_version 2.2) holding ``experiments``."""
    audit = {"name": "test", "seed": 0, "dataset": "digits", "dataset_source": "test", "kind": "image", "pool_size": 400,
             "test_size": 200, "clients": 5, "partition": "iid", "model": "mlp", "model_parameters": 1000,
             "membership_runs": 8, "membership_unit": "client", "accounting": {}, "metric_definitions": {}}
    return {"schema_version": "2.4", "tool": {"name": "dpfl-audit", "version": "0.1.0", "dp_accounting": None},
            "audit": audit, "config": {}, "versions": {}, "experiments": [_stored(e) for e in experiments], "rows": []}


def results_of(experiments: list[dict]) -> Results:
    document = document_of(experiments)
    assert results_schema_validator().is_valid(document), next(results_schema_validator().iter_errors(document)).message
    return from_json(Results, document)


def results_schema_validator():
    return jsonschema.Draft202012Validator(results_schema())


def write_results(folder: Path, experiments: list[dict]) -> Path:
    """A results directory holding a minimal valid results.json (schema_version 2.2)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(document_of(experiments), indent=2), encoding="utf-8")
    return folder


def write_policy(path: Path, rules: list[dict] | str) -> Path:
    path.write_text(rules if isinstance(rules, str) else yaml.safe_dump({"version": 1, "rules": rules}, allow_unicode=True),
                    encoding="utf-8")
    return path


def outcomes_of(rules: list[dict], experiments: list[dict], baseline: list[dict] | None = None):
    policy = parse_policy({"rules": rules})
    return evaluate_policy(policy, results_of(experiments), None if baseline is None else results_of(baseline))


HOLDING_RULES = [
    {"kind": "no-violation"},
    {"kind": "max", "name": "dp-fedavg resists LiRA at ε=1", "experiment": "dp-fedavg-eps1", "attack": "lira-online",
     "metric": "auc", "value": 0.6},
    {"kind": "min", "defense": "fedavg", "metric": "test_accuracy", "value": 0.9},
]


# --------------------------------------------------------------------------- exit codes and output


def test_policy_that_holds_exits_0(tmp_path, capsys):
    results = write_results(tmp_path / "out", default_experiments())
    policy = write_policy(tmp_path / "policy.yaml", HOLDING_RULES)
    assert main(["check", str(results), "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert "dp-fedavg resists LiRA at ε=1" in out and "FAIL" not in out
    assert out.strip().splitlines()[-1] == "check passed: all 5 checks hold"


def test_policy_that_fails_exits_1_and_names_the_rule(tmp_path, capsys):
    experiments = default_experiments()
    experiments[1]["attacks"][0]["metrics"]["auc"] = estimate(0.75, 0.71, 0.79)  # ε=1 suddenly leaks
    results = write_results(tmp_path / "out", experiments)
    policy = write_policy(tmp_path / "policy.yaml", HOLDING_RULES)
    assert main(["check", str(results / "results.json"), "--policy", str(policy)]) == 1
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("check FAILED: 1 of 5 checks fail") and "'dp-fedavg resists LiRA at ε=1'" in last
    assert "dp-fedavg-eps1/lira-online/auc" in out and "0.75, above the maximum 0.6" in out


def test_json_output_matches_the_exit_code(tmp_path, capsys):
    results = write_results(tmp_path / "out", default_experiments())
    policy = write_policy(tmp_path / "policy.yaml", HOLDING_RULES + [{"kind": "max", "metric": "auc", "value": 0.58}])
    assert main(["check", str(results), "--policy", str(policy), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and report["counts"] == {"pass": 10, "fail": 1, "skip": 0}
    assert report["failing_rules"] == ["auc ≤ 0.58"]
    failing = [o for o in report["outcomes"] if o["verdict"] == FAIL]
    assert [o["target"] for o in failing] == ["fedavg/lira-online/auc"] and failing[0]["value"] == 0.59


@pytest.mark.parametrize("policy_text, expected", [
    ("rules:\n  - kind: max\n    metric: [auc\n", "is not valid YAML"),
    ("rules:\n  - {kind: no-violation}\n  - {kind: no-violation}\n  - {kind: maxx, metric: auc, value: 0.6}\n",
     "rules[2].kind: 'maxx' is not allowed; allowed: max, min, no-violation, no-regression"),
    ("rules:\n  - {kind: max, attack: lira-online, metric: auc}\n", "rules[0].value: required field is missing"),
    ("rules:\n  - {kind: max, metric: auc, value: high}\n", "rules[0].value: must be a number, got 'high'"),
    ("rules:\n  - {kind: max, metric: auc, value: 0.6, use: median}\n",
     "rules[0].use: 'median' is not allowed; allowed: value, ci_low, ci_high"),
    ("rules:\n  - {kind: min, metirc: auc, metric: auc, value: 0.6}\n",
     "rules[0].metirc: unknown field; allowed: kind, name, defense, experiment, attack, exclude_attacks, metric, value, use"),
    ("rules:\n  - {kind: no-regression, require: 'yes'}\n", "rules[0].require: must be true or false"),
    ("rules:\n  - {kind: no-regression, tolerance: -1}\n", "rules[0].tolerance: must be >= 0"),
    ("rules:\n  - {kind: no-violation, warnings: loud}\n", "rules[0].warnings: 'loud' is not allowed; allowed: ignore, fail"),
    ("rules:\n  - {name: a, kind: no-violation}\n  - {name: a, kind: no-violation}\n", "rules[1].name: 'a' is already"),
    ('rules:\n  - {name: "a\\0b", kind: no-violation}\n', "rules[0].name: contains a NUL character"),
    ("rules:\n  - {name: " + "r" * 201 + ", kind: no-violation}\n", "rules[0].name: 201 characters; allowed: up to 200"),
    ("version: 2\nrules:\n  - {kind: no-violation}\n", "version: 2 is not allowed; allowed: 1"),
    ("rules: []\n", "rules: must list at least 1 value(s)"),
    ("rule:\n  - {kind: no-violation}\n", "rule: unknown field; allowed: version, rules"),
    ("rules:\n  - no-violation\n", "rules[0]: must be a mapping"),
    ("rules:\n  - {metric: auc, value: 0.6}\n",
     "rules[0].kind: required field is missing; allowed: max, min, no-violation, no-regression"),
    ("rules:\n  - {kind: no-violation, metric: auc}\n",
     "rules[0].metric: unknown field; allowed: kind, name, defense, experiment, warnings"),
    ("rules:\n  - {kind: no-regression, metric: auc, metrics: [auc]}\n",
     "rules[0].metrics: give either metric (one) or metrics (a list), not both"),
    ("rules:\n  - {kind: no-regression, metrics: [auc, auc]}\n", "rules[0].metrics: a metric is listed twice"),
    ("rules:\n  - {kind: no-regression, metrics: [auc, ' ']}\n", "rules[0].metrics[1]: must be a non-empty string"),
    ("rules:\n  - {kind: max, metric: auc, value: 0.6, defense: ''}\n", "rules[0].defense: must be a non-empty string"),
    ("rules:\n  - {kind: no-regression, attack: shokri, exclude_attacks: [lira-online]}\n",
     "rules[0].exclude_attacks: give either attack (one) or exclude_attacks (every other), not both"),
])
def test_malformed_policy_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, policy_text, expected):
    results = write_results(tmp_path / "out", default_experiments())
    policy = write_policy(tmp_path / "policy.yaml", policy_text)
    junit = tmp_path / "junit.xml"
    assert main(["check", str(results), "--policy", str(policy), "--junit", str(junit)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpfl-audit: error: ") and expected in lines[0], lines
    assert captured.out == "" and not junit.exists()


def test_missing_inputs_exit_2(tmp_path, capsys):
    results = write_results(tmp_path / "out", default_experiments())
    policy = write_policy(tmp_path / "policy.yaml", HOLDING_RULES)
    (tmp_path / "empty").mkdir()
    (tmp_path / "not-results.json").write_text('{"hello": 1}')
    for argv, expected in [
        (["check", str(results), "--policy", str(tmp_path / "nope.yaml")], "--policy: file"),
        (["check", str(tmp_path / "empty"), "--policy", str(policy)], "RESULTS: no results.json in directory"),
        (["check", str(tmp_path / "not-results.json"), "--policy", str(policy)], "has no 'experiments' list"),
        (["check", str(results), "--policy", str(policy), "--baseline", str(tmp_path / "old")], "--baseline: "),
        (["check", str(results), "--policy", str(policy), "--junit", str(tmp_path)], "--junit: "),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


# --------------------------------------------------------------------------- rules


def test_max_and_min_use_the_chosen_number_and_fail_without_it():
    experiments = default_experiments()
    experiments[1]["attacks"][0]["metrics"]["auc"] = estimate(0.55, None, None)
    outcomes = outcomes_of([
        {"kind": "max", "experiment": "dp-fedavg (ε=4)", "attack": "lira-online", "metric": "auc",
         "value": 0.53, "use": "ci_high"},
        {"kind": "max", "experiment": "dp-fedavg-eps1", "attack": "lira-online", "metric": "auc", "value": 0.6, "use": "ci_high"},
        {"kind": "min", "attack": "none", "metric": "test_accuracy", "value": 0.6, "defense": "dp-fedavg"},
    ], experiments)
    by_rule = [(o.target, o.verdict, o.value) for o in outcomes]
    assert by_rule == [("dp-fedavg-eps4/lira-online/auc", FAIL, 0.54),  # experiment matched by label
                       ("dp-fedavg-eps1/lira-online/auc", FAIL, None),  # no interval: cannot vouch for it
                       ("dp-fedavg-eps1/utility/test_accuracy", FAIL, 0.15),
                       ("dp-fedavg-eps4/utility/test_accuracy", PASS, 0.62)]
    assert "no ci_high (no interval)" in outcomes[1].sentence
    assert [o.rule for o in outcomes] == ["lira-online auc ci_high ≤ 0.53 on dp-fedavg (ε=4)",
                                          "lira-online auc ci_high ≤ 0.6 on dp-fedavg-eps1",
                                          "utility test_accuracy ≥ 0.6 on dp-fedavg", "utility test_accuracy ≥ 0.6 on dp-fedavg"]


def test_no_violation_fails_on_violations_and_on_warnings_only_when_asked():
    experiments = default_experiments()
    experiments[1]["soundness"], experiments[1]["soundness_text"] = "violation", "record-canaries: VIOLATION: ε_LB = 3 > 1"
    experiments[2]["soundness"] = "estimate above claim"
    default = outcomes_of([{"kind": "no-violation"}], experiments)
    assert [(o.target, o.verdict) for o in default] == [("fedavg", PASS), ("dp-fedavg-eps1", FAIL), ("dp-fedavg-eps4", PASS)]
    assert "ε_LB = 3 > 1" in default[1].sentence
    strict = outcomes_of([{"kind": "no-violation", "warnings": "fail", "defense": "dp-fedavg"}], experiments)
    assert [(o.target, o.verdict) for o in strict] == [("dp-fedavg-eps1", FAIL), ("dp-fedavg-eps4", FAIL)]


@pytest.mark.parametrize("rule, reason", [
    ({"kind": "max", "defense": "dp-fedavgg", "attack": "lira-online", "metric": "auc", "value": 0.6}, "matched no experiment"),
    ({"kind": "max", "experiment": "dp-fedavg-eps2", "metric": "auc", "value": 0.6}, "matched no experiment"),
    ({"kind": "max", "attack": "lira-onlin", "metric": "auc", "value": 0.6}, "matched no attack 'lira-onlin'"),
    ({"kind": "max", "attack": "lira-online", "metric": "acu", "value": 0.6}, "matched no metric acu"),
    ({"kind": "min", "metric": "test_acc", "value": 0.6}, "matched no metric test_acc"),
    ({"kind": "no-violation", "defense": "dpfedavg"}, "matched no experiment"),
    ({"kind": "no-regression", "metrics": ["aucc"]}, "matched no metric aucc"),
])
def test_a_rule_that_matches_nothing_fails(rule, reason):
    experiments = default_experiments()
    outcomes = outcomes_of([rule], experiments, baseline=experiments)
    assert len(outcomes) == 1 and outcomes[0].verdict == FAIL and reason in outcomes[0].sentence


# --------------------------------------------------------------------------- baseline


def regression_outcome(old_auc: tuple, new_auc: tuple, **rule):
    old = [experiment("dp-fedavg-eps1", "dp-fedavg", epsilon=1.0, auc=old_auc)]
    new = [experiment("dp-fedavg-eps1", "dp-fedavg", epsilon=1.0, auc=new_auc)]
    outcomes = outcomes_of([{"kind": "no-regression", "attack": "lira-online", "metric": "auc", **rule}], new, old)
    assert len(outcomes) == 1
    return outcomes[0]


def test_baseline_flags_a_regression_beyond_the_intervals():
    """SEs from the 95 % half-widths (0.03 and 0.04 → √(0.03² + 0.04²)/1.96 for the difference);
    one comparison is a family of one, so the level is 5 % and the threshold the baseline plus
    z₀.₉₅ standard errors."""
    outcome = regression_outcome((0.55, 0.52, 0.58), (0.75, 0.71, 0.79))
    se = math.hypot(0.03, 0.04) / norm.ppf(0.975)
    assert outcome.verdict == FAIL and outcome.value == 0.75 and outcome.level == 0.05
    assert outcome.se == pytest.approx(se) and outcome.p_value == pytest.approx(norm.sf(0.2 / se))
    assert outcome.threshold == pytest.approx(0.55 + norm.ppf(0.95) * se)
    assert "regression beyond statistical noise" in outcome.sentence


def test_the_regressions_of_one_check_are_one_family():
    """Twenty comparisons each worse by 2.5 standard errors (one-sided p = 0.0062): alone each is a
    regression at 5 %; as one family Holm compares the smallest with 0.05/20 = 0.0025 and none is."""
    half = 0.02 * norm.ppf(0.975) / math.sqrt(2)  # both intervals this wide: SE of the difference 0.02
    worse = 2.5 * 0.02
    alone = regression_outcome((0.5, 0.5 - half, 0.5 + half), (0.5 + worse, 0.5 + worse - half, 0.5 + worse + half))
    assert alone.p_value == pytest.approx(norm.sf(2.5)) and alone.verdict == FAIL
    attacks = [f"attack-{i}" for i in range(20)]
    old = [experiment("e", "dp-fedavg", epsilon=1.0,
                      attacks=[membership_attack(a, (0.5, 0.5 - half, 0.5 + half)) for a in attacks])]
    new = [experiment("e", "dp-fedavg", epsilon=1.0,
                      attacks=[membership_attack(a, (0.5 + worse, 0.5 + worse - half, 0.5 + worse + half)) for a in attacks])]
    rules = [{"kind": "no-regression", "attack": a, "metric": "auc"} for a in attacks]  # one family across rules
    outcomes = outcomes_of(rules, new, old)
    assert len(outcomes) == 20 and all(o.verdict == PASS for o in outcomes)
    assert sorted(o.level for o in outcomes)[0] == pytest.approx(0.05 / 20)
    # one of them far worse: Holm rejects it, then compares the next with 0.05/19 — still not rejected
    new[0]["attacks"][0]["metrics"]["auc"] = estimate(0.7, 0.7 - half, 0.7 + half)
    outcomes = outcomes_of(rules, new, old)
    assert [o.verdict for o in outcomes] == [FAIL] + [PASS] * 19


def test_baseline_ignores_a_difference_within_noise():
    outcome = regression_outcome((0.55, 0.50, 0.60), (0.57, 0.52, 0.62))
    assert outcome.verdict == PASS and "no regression beyond statistical noise" in outcome.sentence
    assert regression_outcome((0.75, 0.71, 0.79), (0.55, 0.52, 0.58)).verdict == PASS  # an improvement


def test_lower_is_worse_for_accuracy():
    old = [experiment("fedavg", "fedavg", accuracy=(0.94, 0.93, 0.95))]
    rule = {"kind": "no-regression", "attack": "none", "metric": "test_accuracy"}
    dropped = outcomes_of([rule], [experiment("fedavg", "fedavg", accuracy=(0.80, 0.78, 0.82))], old)[0]
    se = math.hypot(0.01, 0.02) / norm.ppf(0.975)
    assert dropped.verdict == FAIL and dropped.relation == "≥"
    assert dropped.threshold == pytest.approx(0.94 - norm.ppf(0.95) * se)
    risen = outcomes_of([rule], [experiment("fedavg", "fedavg", accuracy=(0.99, 0.98, 1.0))], old)[0]
    assert risen.verdict == PASS


def test_without_an_interval_the_tolerance_decides():
    old = [experiment("e", "dp-fedavg", epsilon=1.0, epsilon_lb=1.0)]
    rule = {"kind": "no-regression", "attack": "lira-online", "metric": "epsilon_one_run"}
    within = outcomes_of([rule], [experiment("e", "dp-fedavg", epsilon=1.0, epsilon_lb=1.015)], old)[0]
    beyond = outcomes_of([rule], [experiment("e", "dp-fedavg", epsilon=1.0, epsilon_lb=1.5)], old)[0]
    loose = outcomes_of([{**rule, "tolerance": 0.6}], [experiment("e", "dp-fedavg", epsilon=1.0, epsilon_lb=1.5)], old)[0]
    assert (within.verdict, beyond.verdict, loose.verdict) == (PASS, FAIL, PASS)
    assert "absolute tolerance 0.02 was used" in beyond.sentence and beyond.threshold == pytest.approx(1.02)


def test_missing_baseline_data_is_skipped_unless_required():
    old = [experiment("dp-fedavg-eps1", "dp-fedavg", epsilon=1.0, attacks=[membership_attack("lira-online", (0.54, 0.51, 0.57))])]
    new = [experiment("dp-fedavg-eps1", "dp-fedavg", epsilon=1.0), experiment("new-defense", "dp-fedsam", epsilon=1.0)]
    rule = {"kind": "no-regression", "metric": "auc"}
    skipped = outcomes_of([rule], new, old)
    assert [(o.target, o.verdict) for o in skipped] == [
        ("dp-fedavg-eps1/lira-online/auc", PASS), ("dp-fedavg-eps1/shokri/auc", SKIP),
        ("new-defense/lira-online/auc", SKIP), ("new-defense/shokri/auc", SKIP)]
    assert "not in baseline" in skipped[1].sentence and "not in baseline" in skipped[2].sentence
    required = outcomes_of([{**rule, "require": True}], new, old)
    assert [o.verdict for o in required] == [PASS, FAIL, FAIL, FAIL]
    no_baseline = outcomes_of([rule], new)  # no --baseline at all: one outcome for the rule
    assert [o.verdict for o in no_baseline] == [SKIP] and "no --baseline given: 4 comparisons not made" in no_baseline[0].sentence
    assert [o.verdict for o in outcomes_of([{**rule, "require": True}], new)] == [FAIL]


def test_cli_baseline_regression_exits_1(tmp_path, capsys):
    old = write_results(tmp_path / "old", default_experiments())
    experiments = default_experiments()
    experiments[1]["attacks"][0]["metrics"]["auc"] = estimate(0.75, 0.71, 0.79)
    new = write_results(tmp_path / "new", experiments)
    policy = write_policy(tmp_path / "policy.yaml", [{"kind": "no-regression", "name": "no leakage regression"}])
    assert main(["check", str(new), "--policy", str(policy), "--baseline", str(old)]) == 1
    out = capsys.readouterr().out
    assert "FAIL no leakage regression — dp-fedavg-eps1/lira-online/auc" in out
    assert main(["check", str(old), "--policy", str(policy), "--baseline", str(old)]) == 0


# --------------------------------------------------------------------------- JUnit and determinism


def test_junit_is_well_formed_with_one_testcase_per_outcome(tmp_path, capsys):
    experiments = default_experiments()
    results = write_results(tmp_path / "out", experiments)
    rules = HOLDING_RULES + [{"kind": "max", "metric": "auc", "value": 0.58},  # fails once (fedavg lira-online)
                             {"kind": "max", "attack": "lira-onlin", "metric": "auc", "value": 0.6},  # fails: typo
                             {"kind": "no-regression", "metric": "auc"}]  # one skipped outcome: no baseline
    policy = write_policy(tmp_path / "policy.yaml", rules)
    junit = tmp_path / "reports" / "junit.xml"
    junit.parent.mkdir()  # --junit creates no folders
    assert main(["check", str(results), "--policy", str(policy), "--junit", str(junit)]) == 1
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert suite.tag == "testsuite" and suite.get("name") == "dpfl-audit check"
    assert len(cases) == int(suite.get("tests")) == 5 + 6 + 1 + 1
    failures = [c for c in cases if c.find("failure") is not None]
    assert len(failures) == int(suite.get("failures")) == 2
    assert len([c for c in cases if c.find("skipped") is not None]) == int(suite.get("skipped")) == 1
    assert {c.get("classname") for c in failures} == {"auc ≤ 0.58", "lira-onlin auc ≤ 0.6"}
    assert "matched no attack" in failures[1].find("failure").get("message")
    capsys.readouterr()


def test_output_is_deterministic(tmp_path, capsys):
    results = write_results(tmp_path / "out", default_experiments())
    baseline = write_results(tmp_path / "old", default_experiments())
    policy = write_policy(tmp_path / "policy.yaml", HOLDING_RULES + [{"kind": "no-regression"}])
    runs = []
    for attempt in range(2):
        junit = tmp_path / f"junit{attempt}.xml"
        assert main(["check", str(results), "--policy", str(policy), "--baseline", str(baseline), "--junit", str(junit)]) == 0
        runs.append((capsys.readouterr().out, junit.read_bytes()))
    assert runs[0] == runs[1]
    policy_document = load_policy(policy)
    outcomes = evaluate_policy(policy_document, load_results(results), load_results(baseline))
    assert junit_xml(outcomes).encode("utf-8") == runs[0][1]


def test_cli_subprocess_exit_codes(tmp_path):
    results = write_results(tmp_path / "out", default_experiments())
    failing = write_policy(tmp_path / "failing.yaml", [{"kind": "min", "name": "dp utility", "defense": "dp-fedavg",
                                                        "metric": "test_accuracy", "value": 0.5}])
    result = subprocess.run([sys.executable, "-m", "audit", "check", str(results), "--policy", str(failing)],
                            capture_output=True, text=True, cwd=REPOSITORY, timeout=120)
    assert result.returncode == 1 and "'dp utility'" in result.stdout and result.stderr == ""


# --------------------------------------------------------------------------- shipped examples


def test_example_policy_is_valid():
    """(The CI templates that apply a policy like it: tests/test_ci_templates.py.)"""
    policy = load_policy(REPOSITORY / "examples" / "policy.yaml")
    kinds = {rule.kind for rule in policy.rules}
    assert kinds == {"max", "min", "no-violation", "no-regression"}
    outcomes = evaluate_policy(policy, results_of(default_experiments()))
    assert not [o for o in outcomes if "matched no" in o.sentence]  # every rule finds its target in the default audit


def test_parse_policy_rejects_a_non_mapping():
    with pytest.raises(UserInputError, match="expected a mapping"):
        parse_policy(["kind: max"])


# --------------------------------------------------------------------------- rules that cannot fail


@pytest.mark.parametrize("rule, reason", [
    ({"kind": "max", "attack": "lira-online", "metric": "auc", "value": 1.082}, "cannot fail, auc ≤ 1"),
    ({"kind": "max", "attack": "lira-online", "metric": "auc", "value": 1.0}, "cannot fail, auc ≤ 1"),  # the end itself
    ({"kind": "min", "attack": "lira-online", "metric": "auc", "value": 0.0}, "cannot fail, auc ≥ 0"),
    ({"kind": "max", "metric": "tpr_at_fpr_1%", "value": 1.5}, "cannot fail, tpr_at_fpr_1% ≤ 1"),
    ({"kind": "max", "attack": "lira-online", "metric": "auc", "value": 1.0, "use": "ci_high"},
     "cannot fail, auc ci_high ≤ 1"),  # AUC intervals are clipped to [0, 1]
    ({"kind": "min", "attack": "none", "metric": "test_accuracy", "value": -0.1}, "cannot fail, test_accuracy ≥ 0"),
    ({"kind": "min", "attack": "lira-online", "metric": "epsilon_one_run", "value": 0.0}, "cannot fail, epsilon_one_run ≥ 0"),
    ({"kind": "no-violation", "defense": "fedavg"},  # ε = ∞: no ε lower bound can exceed the claim
     "cannot fail: no ε figure meets a finite claim (fedavg: no claim)"),
])
def test_a_rule_that_cannot_fail_is_a_warning_and_fails_under_strict(rule, reason):
    policy = parse_policy({"rules": [HOLDING_RULES[1], rule]})
    results = results_of(default_experiments())
    outcomes = evaluate_policy(policy, results)
    warnings = rule_warnings(policy, outcomes)
    assert [w.line for w in warnings] == [f"warning: rules[1] ({policy.rules[1].name}): {reason}"]
    assert all(o.verdict == PASS for o in outcomes)  # a warning, not a failure
    strict = evaluate_policy(policy, results, strict=True)
    assert [o.verdict for o in strict if o.rule == policy.rules[1].name] == [FAIL] * len(warnings[0].targets)
    assert [o.verdict for o in strict if o.rule == policy.rules[0].name] == [PASS]  # the rule that can fail holds


@pytest.mark.parametrize("rule", [
    {"kind": "max", "attack": "lira-online", "metric": "auc", "value": 0.999},
    {"kind": "min", "attack": "lira-online", "metric": "auc", "value": 0.001},
    {"kind": "max", "metric": "epsilon_one_run", "value": 1e30},  # ε lower bounds have no upper end
    {"kind": "max", "attack": "none", "metric": "test_accuracy", "value": 1.0, "use": "ci_high"},  # a t interval passes 1
    {"kind": "min", "attack": "none", "metric": "test_accuracy", "value": 0.0, "use": "ci_low"},  # ... and 0
    {"kind": "max", "attack": "none", "metric": "test_loss", "value": 1e6},
    {"kind": "no-violation"},  # fedavg has no claim, the DP experiments do
])
def test_a_rule_that_can_fail_gets_no_warning(rule):
    policy = parse_policy({"rules": [rule]})
    outcomes = evaluate_policy(policy, results_of(default_experiments()))
    assert rule_warnings(policy, outcomes) == []
    assert evaluate_policy(policy, results_of(default_experiments()), strict=True) == outcomes


def test_exclude_attacks_leaves_an_attack_out():
    outcomes = outcomes_of([{"kind": "max", "metric": "auc", "value": 0.9, "exclude_attacks": ["shokri"]}],
                           default_experiments())
    assert [o.target for o in outcomes] == [f"{key}/lira-online/auc" for key in ("fedavg", "dp-fedavg-eps1", "dp-fedavg-eps4")]
    assert outcomes[0].rule == "auc ≤ 0.9 except shokri"


def test_the_range_of_a_dotted_metric_is_that_of_its_last_part():
    assert cannot_fail("black_box.advantage", "≤", 1.0) == "black_box.advantage ≤ 1"
    assert cannot_fail("black_box.advantage", "≥", -1.0) == "black_box.advantage ≥ -1"
    assert cannot_fail("black_box.advantage", "≥", 0.0) == ""
    assert cannot_fail("psnr", "≤", 1e30) == ""  # not bounded: never called toothless


def test_a_regression_threshold_beyond_the_range_cannot_fail():
    """A baseline this noisy (AUC 0.9 [0.7, 1]) puts the regression threshold above 1: no new AUC
    can be a regression. A comparison with a threshold inside the range can fail; a warning
    names the rule, how many of its checks cannot fail, and which."""
    old = [experiment("e", "dp-fedavg", epsilon=1.0, attacks=[
        membership_attack("lira-online", (0.9, 0.7, 1.0)), membership_attack("shokri", (0.55, 0.52, 0.58))])]
    new = [experiment("e", "dp-fedavg", epsilon=1.0, attacks=[
        membership_attack("lira-online", (0.92, 0.8, 1.0)), membership_attack("shokri", (0.56, 0.53, 0.59))])]
    policy = parse_policy({"rules": [{"kind": "no-regression", "metric": "auc"}]})
    outcomes = evaluate_policy(policy, results_of(new), results_of(old))
    assert [(o.target, o.verdict, o.cannot_fail) for o in outcomes] == [
        ("e/lira-online/auc", PASS, "auc ≤ 1"), ("e/shokri/auc", PASS, "")]
    assert outcomes[0].threshold > 1 > outcomes[1].threshold
    (warning,) = rule_warnings(policy, outcomes)
    assert warning.text == f"1 of 2 checks cannot fail: e/lira-online/auc ≤ {outcomes[0].threshold:.4g} (auc ≤ 1)"
    strict = evaluate_policy(policy, results_of(new), results_of(old), strict=True)
    assert [o.verdict for o in strict] == [FAIL, PASS] and "fails under --strict: it cannot fail (auc ≤ 1)" in strict[0].sentence


def test_a_rule_that_checked_nothing_cannot_fail():
    policy = parse_policy({"rules": [{"kind": "no-regression", "name": "leakage"}]})
    outcomes = evaluate_policy(policy, results_of(default_experiments()))  # no baseline: nothing compared
    (warning,) = rule_warnings(policy, outcomes)
    assert warning.line == ("warning: rules[0] (leakage): cannot fail: it checked nothing, every comparison was skipped "
                            "(no --baseline given)")
    assert [o.verdict for o in evaluate_policy(policy, results_of(default_experiments()), strict=True)] == [FAIL]


def test_check_prints_the_warning_carries_it_in_json_and_junit_and_strict_exits_1(tmp_path, capsys):
    results = write_results(tmp_path / "out", default_experiments())
    rules = HOLDING_RULES + [{"kind": "max", "name": "max-auc", "attack": "lira-online", "metric": "auc", "value": 1.082}]
    policy = write_policy(tmp_path / "policy.yaml", rules)
    junit = tmp_path / "junit.xml"
    assert main(["check", str(results), "--policy", str(policy), "--junit", str(junit)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == "warning: rules[3] (max-auc): cannot fail, auc ≤ 1"
    assert lines[-1] == "check passed: all 8 checks hold; 1 rule cannot fail (warnings above)"
    cases = [c for c in ET.parse(junit).getroot().findall("testcase") if c.get("classname") == "max-auc"]
    assert len(cases) == 3 and all(c.find("system-out").text == "warning: this check cannot fail: auc ≤ 1" for c in cases)
    assert main(["check", str(results), "--policy", str(policy), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["strict"] is False
    assert report["warnings"] == [{"index": 3, "rule": "max-auc", "text": "cannot fail, auc ≤ 1",
                                   "targets": ["fedavg/lira-online/auc", "dp-fedavg-eps1/lira-online/auc",
                                               "dp-fedavg-eps4/lira-online/auc"]}]
    assert {o["cannot_fail"] for o in report["outcomes"] if o["rule"] == "max-auc"} == {"auc ≤ 1"}
    assert main(["check", str(results), "--policy", str(policy), "--strict", "--junit", str(junit)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("check FAILED: 3 of 8 checks fail; failing rules: 'max-auc'")
    assert int(ET.parse(junit).getroot().get("failures")) == 3
    # the Python API alike
    assert not [o for o in audit.check(results, policy) if o.verdict == FAIL]
    assert [o.target for o in audit.check(results, policy, strict=True) if o.verdict == FAIL] == report["warnings"][0]["targets"]


def _smoke_policy(path: Path) -> Path:
    """The rules of examples/policy.yaml that apply to the smoke preset (it has fedavg and
    dp-fedavg at ε = 8, not the default audit's ε = 1 and 4), the regression rule on the attack
    the example leaves out, and a rule that can fail."""
    document = yaml.safe_load((REPOSITORY / "examples" / "policy.yaml").read_text(encoding="utf-8"))
    rules = [rule for rule in document["rules"] if "experiment" not in rule]
    rules += [{"kind": "no-regression", "name": "each-upload canaries", "attack": "dirac-canaries-each-upload"},
              {"kind": "max", "name": "lira-online near chance on dp-fedavg", "defense": "dp-fedavg",
               "attack": "lira-online", "metric": "auc", "value": 0.99}]
    return write_policy(path, rules)


def test_on_the_smoke_preset_a_rule_that_cannot_fail_is_reported_and_strict_exits_1(smoke_runs, tmp_path, capsys):
    """The smoke preset's real output, its first run as the baseline. A comparison whose threshold
    lies at or beyond the metric's range (AUC ≤ 1 or more, as a no-regression rule gives when the
    baseline's interval reaches 1: the smoke preset's 5 clients give intervals that wide) cannot
    fail: every such comparison is named in a warning, and only those; the rules that can fail get
    no warning; --strict exits 1 naming them."""
    _, (baseline, new) = smoke_runs
    policy = _smoke_policy(tmp_path / "policy.yaml")
    arguments = ["check", str(new), "--policy", str(policy), "--baseline", str(baseline)]
    assert main(arguments) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings and all("cannot fail" in w for w in warnings), warnings
    assert not [w for w in warnings if "near chance" in w or " still " in w or "soundness" in w]  # rules that can fail
    assert out.strip().splitlines()[-1].startswith("check passed: all ")
    assert main([*arguments, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    beyond = {(o["rule"], o["target"]) for o in report["outcomes"] if o["metric"] in ("auc", "tpr_at_fpr_1%")
              and o["verdict"] == PASS and o["threshold"] >= 1}
    assert beyond and beyond == {(w["rule"], t) for w in report["warnings"] for t in w["targets"]}
    assert main([*arguments, "--strict"]) == 1
    out = capsys.readouterr().out
    assert "fails under --strict: it cannot fail" in out
    assert out.strip().splitlines()[-1].startswith("check FAILED: ")


def test_the_summary_counts_decided_checks_alike_when_passing_and_failing():
    """A skipped check is neither held nor failed: "k of N checks fail" and "all N checks hold"
    count the same N, the decided checks, whatever the verdicts."""
    from reports.gate import summary_line
    from reports.outcomes import FAIL, PASS, SKIP, Outcome

    def outcome(verdict: str, rule: str = "r") -> Outcome:
        return Outcome(rule, "max", "t", verdict, 0.5, 0.6, "≤", "")

    assert summary_line([outcome(PASS)] * 3 + [outcome(SKIP)] * 2) == "check passed: all 3 checks hold (2 skipped)"
    failed = summary_line([outcome(PASS)] * 2 + [outcome(FAIL)] + [outcome(SKIP)] * 2)
    assert failed.startswith("check FAILED: 1 of 3 checks fail (2 skipped); failing rules: 'r'")


def test_junit_spells_out_characters_xml_cannot_hold():
    """A rule name, label or sentence holding NUL, ESC or U+0001 (which XML 1.0 cannot hold, not even
    as a character reference) still gives a document that parses, with the characters spelled out;
    tab and newline, which XML holds, stay as they are."""
    from reports.outcomes import Outcome

    hostile = Outcome(rule="max\x00auc", kind="max", target="exp\x1b[2K/attack\x01/auc", verdict="fail", value=0.9,
                      threshold=0.6, relation="≤", sentence="too\thigh\nby far \ufffe")
    suite = ET.fromstring(junit_xml([hostile]).split("\n", 1)[1])
    case = suite.find("testcase")
    assert case.get("classname") == "max\\x00auc" and case.get("name") == "exp\\x1b[2K/attack\\x01/auc"
    failure = case.find("failure")
    assert failure.get("message") == "too\thigh\nby far \\ufffe" and "\x1b" not in failure.text


def test_the_written_out_normal_quantile_is_scipys():
    from scipy.stats import norm

    from reports.regression import Z_95

    assert float(norm.ppf(0.975)) == Z_95
