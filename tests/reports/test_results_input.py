"""Stored files that `check` and `report` read back are read strictly: a results.json of
an unknown schema_version or with a wrong-typed field, a broken manifest.json, a policy with
duplicate keys or in another encoding, a --junit file in a folder that does not exist — each ends
with exit 2, one line on stderr naming the file and the field, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.cli import main
from audit.core.errors import UserInputError
from reports.results import SCHEMA_VERSION, load_results
from tests.helpers import tiny_config

TINY = tiny_config(training={"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.05},
                   defenses=[{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}])

POLICY = "rules:\n  - kind: no-violation\n  - {kind: max, attack: loss-threshold, metric: auc, value: 1.0}\n"


@pytest.fixture(scope="module")
def audit_out(tmp_path_factory) -> Path:
    """A real (tiny) `dpfl-audit run`: results.json and manifest.json as the code writes them."""
    base = tmp_path_factory.mktemp("tiny-audit")
    (base / "tiny.yaml").write_text(TINY, encoding="utf-8")
    assert main(["run", str(base / "tiny.yaml"), "--out", str(base / "out"), "--quiet"]) == 0
    return base / "out"


@pytest.fixture
def results_copy(audit_out, tmp_path):
    """``make(mutate)``: a results folder whose results.json is the real one changed by ``mutate``."""

    def make(mutate=None, name: str = "copy") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        document = json.loads((audit_out / "results.json").read_text(encoding="utf-8"))
        if mutate is not None:
            mutate(document)
        (folder / "results.json").write_text(json.dumps(document), encoding="utf-8")
        (folder / "manifest.json").write_bytes((audit_out / "manifest.json").read_bytes())
        return folder

    return make


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpfl-audit: error: "), captured.err
    assert captured.out == "", captured.out
    return lines[0]


def files_under(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*"))


# --------------------------------------------------------------------------- what the code writes still loads


def test_results_written_by_the_code_load_check_and_report(audit_out, tmp_path, capsys):
    document, manifest, folder = load_results(audit_out)
    assert document.schema_version == SCHEMA_VERSION and folder == audit_out
    assert [e.key for e in document.experiments] == ["fedavg", "dp-fedavg-eps8"]
    assert isinstance(manifest.get("versions", {}), dict)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    (tmp_path / "ci").mkdir()
    junit = tmp_path / "ci" / "junit.xml"
    assert main(["check", str(audit_out), "--policy", str(policy), "--junit", str(junit)]) == 0
    assert junit.is_file() and "check passed" in capsys.readouterr().out
    assert main(["report", str(audit_out / "results.json"), "--out", str(tmp_path / "report.html")]) == 0
    assert (tmp_path / "report.html").read_bytes() == (audit_out / "report.html").read_bytes()


# --------------------------------------------------------------------------- results.json refused


def _set(*path_and_value):
    *path, key, value = path_and_value

    def mutate(document):
        target = document
        for part in path:
            target = target[part]
        target[key] = value

    return mutate


def _drop(key):
    return lambda document: document.pop(key)


BROKEN_RESULTS = [
    ("version-99", _set("schema_version", 99), "schema_version: 99 is not supported; allowed: '2.2', '2.3', '2.4'"),
    ("version-3", _set("schema_version", "3.0"), "schema_version: '3.0' is not supported; allowed: '2.2', '2.3', '2.4'"),
    ("version-1", _set("schema_version", "1.0"), "schema_version: '1.0' is not supported"),
    ("version-float", _set("schema_version", 2.1), "schema_version: 2.1 is not supported"),
    ("version-missing", _drop("schema_version"), "schema_version: missing; allowed: '2.2', '2.3', '2.4'"),
    ("auc-string", _set("experiments", 0, "attacks", 0, "metrics", "auc", "value", "0.9"),
     "experiments[0].attacks[0].metrics.auc.value: must be a number or null, got '0.9'"),
    ("tpr-string", _set("experiments", 1, "attacks", 0, "metrics", "tpr_at_fpr_1%", "ci_high", "1"),
     "experiments[1].attacks[0].metrics['tpr_at_fpr_1%'].ci_high: must be a number or null, got '1'"),
    ("accuracy-bool", _set("experiments", 1, "utility", "test_accuracy", "ci_low", True),
     "experiments[1].utility.test_accuracy.ci_low: must be a number or null, got true"),
    ("epsilon-string", _set("experiments", 1, "claim", "epsilon", "8"),
     "experiments[1].claim.epsilon: must be a number or null, got '8'"),
    ("delta-null", _set("experiments", 1, "claim", "delta", None), "experiments[1].claim.delta: must be a number, got null"),
    ("round-string", _set("experiments", 0, "rounds", 0, "test_accuracy", "0.5"),
     "experiments[0].rounds[0].test_accuracy: must be a number or null, got '0.5'"),
    ("diagnostic-string", _set("experiments", 0, "diagnostics", "clip_fraction", "value", "1"),
     "experiments[0].diagnostics.clip_fraction.value: must be a number or null, got '1'"),
    ("roc-string", _set("experiments", 0, "attacks", 0, "roc", "fpr", ["0"]),
     "experiments[0].attacks[0].roc.fpr[0]: must be a number, got '0'"),
    ("label-number", _set("experiments", 1, "label", 5), "experiments[1].label: must be a string, got 5"),
    ("attacks-object", _set("experiments", 1, "attacks", {}), "experiments[1].attacks: must be a list, got an object"),
    ("verdicts-string", _set("experiments", 1, "attacks", 0, "verdicts", "none"),
     "experiments[1].attacks[0].verdicts: must be a list, got 'none'"),
    ("soundness-unknown", _set("experiments", 0, "soundness", "fine"),
     "experiments[0].soundness: 'fine' is not allowed; allowed: violation"),
    ("utility-missing", lambda d: d["experiments"][0]["utility"].pop("test_accuracy"),
     "experiments[0].utility.test_accuracy: missing"),
    ("row-value-string", _set("rows", 0, "value", "0.9"), "rows[0].value: must be a number or null, got '0.9'"),
    ("auc-above-one", _set("experiments", 0, "attacks", 0, "metrics", "auc", "value", 7.5),
     "experiments[0].attacks[0].metrics.auc.value: must be <= 1, got 7.5"),
    ("label-100000", _set("experiments", 1, "label", "A" * 100_000),
     "experiments[1].label: 100000 characters; allowed: up to 1000 characters"),
    ("auc-interval-huge", _set("experiments", 1, "attacks", 0, "metrics", "auc", "ci_low", -1e308),
     "experiments[1].attacks[0].metrics.auc.ci_low: must be >= 0, got -1e+308"),
    ("tpr-below-zero", _set("experiments", 1, "attacks", 0, "metrics", "tpr_at_fpr_1%", "ci_low", -0.2),
     "experiments[1].attacks[0].metrics['tpr_at_fpr_1%'].ci_low: must be >= 0, got -0.2"),
    ("row-extra", _set("rows", 0, "surprise", 1), "rows[0].surprise: unknown field; allowed: run, dataset"),
]


@pytest.mark.parametrize("name, mutate, expected", BROKEN_RESULTS, ids=[case[0] for case in BROKEN_RESULTS])
def test_report_refuses_a_broken_results_json_with_one_line(results_copy, tmp_path, capsys, name, mutate, expected):
    folder = results_copy(mutate)
    before = files_under(tmp_path)
    assert main(["report", str(folder), "--out", str(tmp_path / "report.html")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"dpfl-audit: error: results: '{folder / 'results.json'}': {expected}"), line
    assert files_under(tmp_path) == before  # nothing written, not even the report


#: results.json files that are well-formed but hold figures the code never writes (a value outside
#: its interval, a null AUC beside a ROC, an accuracy above 1, ε = 0 on the log ε axis, intervals
#: and bounds at 1e308): the report is still drawn, without a warning — before, each was an
#: internal error in the figures (negative error bars, formatting None) or an overflow warning. An
#: attack's figure outside its range (an AUC of 7.5) is refused instead, above.
EDITED_RESULTS = [
    ("auc-above-interval", lambda d: d["experiments"][1]["attacks"][0]["metrics"]["auc"].update(value=0.99, ci_high=0.5)),
    ("auc-null", _set("experiments", 1, "attacks", 0, "metrics", "auc", "value", None)),
    ("auc-null-no-dp", _set("experiments", 0, "attacks", 0, "metrics", "auc", "value", None)),
    ("epsilon-interval-huge", _set("experiments", 1, "attacks", 0, "metrics", "epsilon_one_run", "ci_high", 1e308)),
    ("accuracy-above-one", _set("experiments", 1, "utility", "test_accuracy", "value", 2.0)),
    ("accuracy-interval-huge", _set("experiments", 1, "utility", "test_accuracy", "ci_high", 1e308)),
    ("epsilon-zero", _set("experiments", 1, "claim", "epsilon", 0.0)),
    ("verdict-huge", lambda d: [v.update(bound=1e308, measured=1e308) for v in d["experiments"][1]["attacks"][0]["verdicts"]]),
    # text no font draws: a NUL (shown as its escape) and a script DejaVu Sans lacks (boxes, no warning per glyph)
    ("label-nul", _set("experiments", 1, "label", "dp\u0000fedavg")),
    ("label-cjk", _set("experiments", 1, "label", "\u9690\u79c1\u5ba1\u8ba1")),
    # what the code writes for a canary audit whose canaries were all inserted, or none (a few
    # canaries, by chance): the ROC figures unknown
    ("no-roc", lambda d: [a["metrics"][m].update(value=None, ci_low=None, ci_high=None) for e in d["experiments"]
                          for a in e["attacks"] for m in ("auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%") if m in a["metrics"]]),
]


@pytest.mark.parametrize("name, mutate", EDITED_RESULTS, ids=[case[0] for case in EDITED_RESULTS])
def test_report_draws_edited_but_well_formed_results(results_copy, tmp_path, capsys, recwarn, name, mutate):
    import matplotlib.pyplot as plt

    folder = results_copy(mutate)
    assert main(["report", str(folder), "--out", str(tmp_path / "report.html")]) == 0
    assert capsys.readouterr().err == ""
    assert not [str(w.message) for w in recwarn if "More than 20 figures" not in str(w.message)]
    assert (tmp_path / "report.html").is_file()
    assert plt.get_fignums() == []  # every figure drawn was closed


@pytest.mark.parametrize("name, mutate, expected", BROKEN_RESULTS[:6], ids=[case[0] for case in BROKEN_RESULTS[:6]])
def test_check_refuses_a_broken_results_json_or_baseline(results_copy, tmp_path, capsys, name, mutate, expected):
    good, broken = results_copy(name="good"), results_copy(mutate, name="broken")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    junit = tmp_path / "junit.xml"
    for argv, option in ([str(broken)], "RESULTS"), ([str(good), "--baseline", str(broken)], "--baseline"):
        assert main(["check", *argv, "--policy", str(policy), "--junit", str(junit)]) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"dpfl-audit: error: {option}: '{broken / 'results.json'}': {expected}"), line
        assert not junit.exists()


def test_library_error_names_the_json_path(results_copy):
    folder = results_copy(_set("experiments", 0, "attacks", 0, "metrics", "auc", "value", "0.9"))
    with pytest.raises(UserInputError) as caught:
        load_results(folder / "results.json")
    assert str(caught.value) == (f"results: '{folder / 'results.json'}': experiments[0].attacks[0].metrics.auc.value: "
                                 "must be a number or null, got '0.9'")


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe{\x00}\x00", "is not UTF-8 text (byte 0 is 0xff)"),
    ('{"schema_version": "2.2", "label": "caf\u00e9"}'.encode("latin-1"), "is not UTF-8 text (byte 39 is 0xe9)"),
    (b"\x00\x01\x02garbage", "is not valid JSON"),
    (b'{"schema_version": "2.2", "experiments": [', "is not valid JSON: Expecting value at line 1, column 43"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"schema_version": "2.3", "experiments": [], "experiments": [{}]}', 'gives the key "experiments" twice'),
])
def test_unreadable_results_json_is_one_line(tmp_path, capsys, content, expected):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_bytes(content)
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report.html")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"dpfl-audit: error: results: '{tmp_path / 'out' / 'results.json'}'") and expected in line, line
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("content, expected", [
    (b'{"tool": {"name": "dpfl-audit"', "is not valid JSON: Expecting ',' delimiter at line 1, column 31"),
    (b"", "is not valid JSON: Expecting value at line 1, column 1"),
    ('{"machine": "caf\u00e9"}'.encode("latin-1"), "is not UTF-8 text (byte 16 is 0xe9)"),
    (b"[1, 2]", "must be an object, got a list"),
    (b'{"versions": "torch 2.4"}', "versions: must be an object, got 'torch 2.4'"),
])
def test_a_broken_manifest_next_to_results_is_one_line(results_copy, tmp_path, capsys, content, expected):
    folder = results_copy()
    (folder / "manifest.json").write_bytes(content)
    assert main(["report", str(folder), "--out", str(tmp_path / "report.html")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"dpfl-audit: error: results: '{folder / 'manifest.json'}'") and expected in line, line
    assert not (tmp_path / "report.html").exists()


# --------------------------------------------------------------------------- --junit creates no folders


def test_junit_in_a_missing_folder_is_refused_before_anything_runs(results_copy, tmp_path, capsys):
    folder = results_copy()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    missing = tmp_path / "nonexistent" / "dir"
    before = files_under(tmp_path)
    assert main(["check", str(folder), "--policy", str(policy), "--junit", str(missing / "j.xml")]) == 2
    assert one_error_line(capsys) == (f"dpfl-audit: error: --junit: folder '{missing}' does not exist; "
                                      "create it or give a file in an existing folder")
    assert files_under(tmp_path) == before and not (tmp_path / "nonexistent").exists()
    # checked before the policy is even read: a broken policy does not hide it
    policy.write_text("rules: [", encoding="utf-8")
    assert main(["check", str(folder), "--policy", str(policy), "--junit", str(missing / "j.xml")]) == 2
    assert "--junit: folder" in one_error_line(capsys)
    # a file where the folder should be
    assert main(["check", str(folder), "--policy", str(policy), "--junit", str(policy / "j.xml")]) == 2
    assert one_error_line(capsys).endswith(f"--junit: '{policy}' is not a folder; give a file in an existing folder")


# --------------------------------------------------------------------------- the policy file, strictly


@pytest.mark.parametrize("content, expected", [
    (b"rules:\n  - kind: max\n    metric: auc\n    value: 0.6\n    value: 0.9\n",
     "is not valid YAML: line 5: duplicate key 'value' (first given on line 4)"),
    (b"version: 1\nversion: 1\nrules:\n  - {kind: no-violation}\n",
     "is not valid YAML: line 2: duplicate key 'version' (first given on line 1)"),
    ("rules:\n  - {kind: no-violation, name: 'caf\u00e9'}\n".encode("latin-1"),
     "is not valid YAML: not UTF-8 text (byte 42 is 0xe9)"),
    ("rules:\n  - {kind: no-violation}\n".encode("utf-16"), "is not valid YAML: not a text file (it holds NUL bytes)"),
    (bytes(range(256)), "is not valid YAML: not a text file (it holds NUL bytes)"),
    (b'rules:\n  - {kind: no-violation, name: "\\ud800"}\n', "is not valid YAML: line 2: a string holds a lone surrogate"),
])
def test_policy_is_read_strictly(results_copy, tmp_path, capsys, content, expected):
    folder = results_copy()
    policy = tmp_path / "policy.yaml"
    policy.write_bytes(content)
    junit = tmp_path / "junit.xml"
    assert main(["check", str(folder), "--policy", str(policy), "--junit", str(junit)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"dpfl-audit: error: --policy: '{policy}' ") and expected in line, line
    assert not junit.exists()


def test_public_check_gives_the_outcomes_the_cli_prints(audit_out, tmp_path, capsys):
    """``audit.check`` (the public API) and ``dpfl-audit check --json`` agree outcome for outcome."""
    import audit

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    outcomes = audit.check(audit_out, policy)
    capsys.readouterr()
    main(["check", str(audit_out), "--policy", str(policy), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert [o.as_dict() for o in outcomes] == printed["outcomes"]
    assert outcomes and all(o.verdict in ("pass", "fail", "skip") for o in outcomes)
