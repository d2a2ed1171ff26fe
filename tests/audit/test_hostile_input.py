"""Hostile and broken input: nothing escapes --out, one line and exit 2, code only when allowed."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.cli import main
from audit.core.extensions import NO_PLUGINS_ENV
from audit.core.safe_names import MAX_LENGTH, inside, is_safe, slug
from tests.helpers import tiny_config


def tiny(training: dict | None = None, runs: int = 4, **sections) -> str:
    return tiny_config(dataset={"name": "digits", "max_pool": 160, "max_test": 100}, partition={"clients": 4},
                       training=training or {"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.1},
                       membership={"runs": runs}, diagnostics={"enabled": False}, **sections)


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    return code, capsys.readouterr().err.splitlines()


# --------------------------------------------------------------------------- safe names


@given(st.text(max_size=200))
@settings(max_examples=300)
def test_slug_is_one_safe_component(text):
    name = slug(text)
    assert is_safe(name) and len(name) <= MAX_LENGTH
    assert "/" not in name and "\\" not in name and not name.startswith(".") and name not in ("", ".", "..")


@given(st.text(max_size=60), st.text(max_size=60))
@settings(max_examples=300)
def test_distinct_texts_get_distinct_slugs(first, second):
    if first != second:
        assert slug(first) != slug(second)


def test_safe_names_are_kept_and_lookalikes_are_told_apart():
    assert slug("lira-online") == "lira-online" and slug("dp-fedavg-eps1") == "dp-fedavg-eps1"
    assert len({slug("a/b"), slug("a-b"), slug("a b"), slug("a\\b"), slug("a:b")}) == 5
    assert slug("..") != ".." and slug("") and slug("x" * 500) != slug("x" * 501)


def test_inside_refuses_paths_that_leave_the_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert inside(out, out / "attacks" / "x.npz") == out / "attacks" / "x.npz"
    with pytest.raises(ValueError, match="outside the output folder"):
        inside(out, out / ".." / "escaped.npz")
    (out / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside the output folder"):
        inside(out, out / "link" / "escaped.npz")


# --------------------------------------------------------------------------- labels never leave --out


def test_attack_labels_with_traversal_and_slashes_stay_inside_out(tmp_path, capsys):
    target = tmp_path / "x"
    traversal = "/.." * 12 + f"{target}/TRAVERSED"
    config = tmp_path / "labels.yaml"
    config.write_text(tiny(attacks=[{"name": "loss-threshold", "label": traversal},
                                    {"name": "loss-threshold", "label": "a/b"},
                                    {"name": "record-canaries", "label": traversal + "-canary", "params": {"canaries": 8}}]),
                      encoding="utf-8")
    out = tmp_path / "out"
    code, err = run_cli(capsys, "run", str(config), "--out", str(out), "--quiet")
    assert code == 0, err
    assert not target.exists()  # the traversal label wrote nothing outside --out
    written = files_under(tmp_path) - {config}
    assert written and all(out in p.parents or p == out for p in written)
    scores = sorted(p.name for p in (out / "attacks" / "fedavg").iterdir())
    assert len(scores) == 3 and all(is_safe(name.removesuffix(".npz")) for name in scores)
    labels = {a["attack"] for e in json.loads((out / "results.json").read_text())["experiments"] for a in e["attacks"]}
    assert {traversal, "a/b"} <= labels  # the report shows the text the user wrote


# --------------------------------------------------------------------------- code named by a config


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_no_plugins_refuses_code_loading_names_before_running_them(tmp_path, capsys, monkeypatch, how):
    marker = tmp_path / "MARKER"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef build(*args, **kwargs):\n    raise SystemExit(3)\n")
    config = tmp_path / "plugin.yaml"
    config.write_text(tiny(model={"name": f"{plugin}:build"}), encoding="utf-8")
    out = tmp_path / "out"
    args = ["run", str(config), "--out", str(out), "--quiet"]
    if how == "flag":
        args.append("--no-plugins")
        monkeypatch.setenv(NO_PLUGINS_ENV, "")  # "" = plugins on; restored to unset after the test
    else:
        monkeypatch.setenv(NO_PLUGINS_ENV, "1")
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1 and "model.name" in err[0] and "plugins are off" in err[0]
    assert not marker.exists() and not out.exists()
    # never imported (audit.core.extensions names a file's module dpfl_audit_user_<hash>_<stem>)
    assert not any(name.startswith("dpfl_audit_user_") and name.endswith("_plugin") for name in sys.modules)


def test_plugins_run_when_allowed(tmp_path, capsys, monkeypatch):
    """The same config with plugins on does run the file (so the refusal above is the flag's doing)."""
    monkeypatch.delenv(NO_PLUGINS_ENV, raising=False)
    marker = tmp_path / "MARKER"
    plugin = tmp_path / "plugin_on.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef build(*args, **kwargs):\n"
                      "    raise ValueError('no model here')\n")
    config = tmp_path / "plugin.yaml"
    config.write_text(tiny(model={"name": f"{plugin}:build"}), encoding="utf-8")
    code, err = run_cli(capsys, "run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert marker.exists() and code == 2 and len(err) == 1


@pytest.mark.parametrize("section", ["attacks", "defenses"])
@pytest.mark.parametrize("code", ["class Thing:\n    kind = 'membership'\n", "def Thing(*args, **kwargs):\n    return 1\n"])
def test_a_plugin_that_is_not_an_attack_or_a_defense_is_one_line(tmp_path, capsys, monkeypatch, section, code):
    """A ``file.py:Name`` that resolves to a class of the wrong kind, or a function, is refused where
    it is named, before training, as the same class is for a defense."""
    monkeypatch.delenv(NO_PLUGINS_ENV, raising=False)
    plugin = tmp_path / "wrong_kind.py"
    plugin.write_text(code, encoding="utf-8")
    config = tmp_path / "plugin.yaml"
    config.write_text(tiny(**{section: [{"name": f"{plugin}:Thing"}]}), encoding="utf-8")
    code_, err = run_cli(capsys, "run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    base = "attacks.base.Attack" if section == "attacks" else "defenses.base.Defense"
    assert code_ == 2 and len(err) == 1 and f"{section}[0].name:" in err[0] and f"not a subclass of {base}" in err[0]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- strict files, bounds, budget


@pytest.mark.parametrize("content, field", [
    (b"seed: 1\nseed: 2\n", "duplicate key 'seed'"),
    (b"name: caf\xe9\n", "not UTF-8"),
    ("name: x\n".encode("utf-16"), "not a text file"),
    (bytes(range(256)), "not a text file"),
    (b'name: "a\\ud800b"\n', "lone surrogate"),
    (b"training: {rounds: 1000000000000000000000000000000}\n", "training.rounds"),
    (b"training: {local_steps: 1000000000000000000000000000000}\n", "training.local_steps"),
    (b"membership: {runs: 100000000}\n", "membership.runs"),
    (b"attacks: [{name: loss-threshold, label: " + b"A" * 100_000 + b"}]\n", "attacks[0].label: 100000 characters"),
    (b'defenses: [{name: fedavg, label: "a\\0b"}]\n', "defenses[0].label: contains a NUL"),
    (b"dataset: {name: " + b"d" * 5000 + b"}\n", "dataset.name: 5000 characters; allowed: up to 4096"),
    (b"membership: {runs: 1e30}\n", "membership.runs"),
    (b"training: {lr: .inf}\n", "training.lr"),
    (b"training: {server_lr: .inf}\n", "training.server_lr"),
    (b"training: {weight_decay: .inf}\n", "training.weight_decay"),
    (b"defenses: [{name: dp-fedavg, epsilons: []}]\n", "defenses[0].epsilons"),
    (b"defenses: [{name: dp-fedavg, epsilons: [1e308]}]\n", "defenses[0].epsilons[0]"),
])
def test_broken_configs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, content, field):
    config = tmp_path / "broken.yaml"
    config.write_bytes(content)
    out = tmp_path / "out"
    code, err = run_cli(capsys, "run", str(config), "--out", str(out), "--quiet")
    assert code == 2 and len(err) == 1 and field in err[0], err
    assert files_under(tmp_path) == {config}


def test_plan_beyond_the_budget_is_refused_before_anything_is_written(tmp_path, capsys):
    config = tmp_path / "big.yaml"
    config.write_text(tiny({"rounds": 100000, "local_steps": 1000}, 4096), encoding="utf-8")
    code, err = run_cli(capsys, "run", str(config), "--out", str(tmp_path / "out"))
    assert code == 2 and len(err) == 1 and "--max-hours" in err[0] and "hours of training" in err[0]
    assert files_under(tmp_path) == {config}


def test_budget_counts_the_work_of_the_plan(tmp_path):
    """Training FLOPs are linear in rounds and in runs (every run trains every round)."""
    from audit.budget import estimate
    from audit.config import load_config
    from audit.planning import plan_audit

    def flops(rounds: int, runs: int) -> float:
        config = tmp_path / f"c{rounds}-{runs}.yaml"
        config.write_text(tiny({"rounds": rounds, "eval_every": 1000}, runs), encoding="utf-8")
        return estimate(plan_audit(load_config(config))).flops

    base = flops(10, 4)
    assert flops(20, 4) == pytest.approx(2 * base, rel=0.02)
    assert flops(10, 8) == pytest.approx(2 * base, rel=0.02)


@pytest.mark.parametrize("args, field", [
    (["epsilon", "--noise", "1e-9", "--rate", "1", "--steps", "100", "--delta", "1e-5", "--accountant", "pld"], "noise"),
    (["invert", "--attack", "dlg", "--seed", "-1"], "--seed"),
    (["audit-mechanism", "--mechanism", "gaussian", "--noise", "1", "--trials", "1e30"], "--trials"),
    (["conformance", "dp-fedavg", "--trials", "100000000"], "--trials"),
    (["epsilon", "--noise", "nan", "--rate", "1", "--steps", "10", "--delta", "1e-5"], "--noise"),
    (["run", "--max-hours", "inf"], "--max-hours"),
    (["epsilon", "--noise", "1", "--rate", "0.1", "--steps", "1000000000", "--delta", "1e-5", "--accountant", "pld"], "steps"),
    (["epsilon", "--target-epsilon", "10000", "--rate", "0.1", "--steps", "10", "--delta", "1e-5", "--accountant", "pld"],
     "target-epsilon"),
    (["audit-mechanism", "--mechanism", "ldp-two-point", "--epsilon", "1e-320", "--trials", "200"], "--epsilon"),
    (["config", "--set", "seed=" + "9" * 5000], "--set seed"),
    (["config", "--set", "name=!!binary aGVsbG8="], "--set name"),
    (["config", "--set", "name=!!timestamp 2001-12-14"], "--set name"),
    (["sweep", "--over", "seed=!!set {a}", "--max-hours", "1e-12"], "--over"),
])
def test_bad_command_line_values_exit_2_with_one_line(tmp_path, capsys, args, field, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1 and field in err[0], err
    assert not any(tmp_path.iterdir())


def test_a_date_like_value_is_text_and_a_sweep_over_it_is_planned(tmp_path, capsys, monkeypatch):
    # found by the long fuzz run: YAML 1.1 reads 2001-12-14 as a date, which no field takes and
    # which a sweep could not write into its point labels (an internal error)
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "sweep", "--over", "name=2001-12-14,x", "--max-hours", "1e-12", "--out", "o")
    assert code == 2 and len(err) == 1 and "--max-hours" in err[0], err  # refused for its budget only
    assert not any(tmp_path.iterdir())
    assert run_cli(capsys, "config", "--set", "name=2001-12-14")[0] == 0


def test_unexpected_errors_are_one_line_with_a_hint_and_verbose_shows_the_traceback(capsys, monkeypatch):
    import audit.cli as cli

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "list", broken)
    code, err = run_cli(capsys, "list")
    assert code == 1 and len(err) == 1 and "RuntimeError: boom second line" in err[0] and "-v" in err[0]
    with pytest.raises(RuntimeError):
        main(["list", "-v"])


def test_environment_flag_is_not_left_on_by_these_tests():
    assert os.environ.get(NO_PLUGINS_ENV) is None


# --------------------------------------------------------------------------- links out of the output folder


def snapshot(folder: Path) -> dict[str, tuple[bool, int]]:
    """Every path under ``folder`` (links listed, not followed): is it a link, and its size."""
    found = {}
    for directory, folders, files in os.walk(folder, followlinks=False):
        for name in folders + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, folder)] = (os.path.islink(path), os.lstat(path).st_size)
    return found


def score_file(tmp_path: Path) -> Path:
    """A small membership score file (2 runs × 40 units) for ``dpfl-audit scores``."""
    import numpy as np

    rng = np.random.default_rng(0)
    member = rng.integers(0, 2, size=(2, 40))
    rows = ["run,unit,score,member"] + [f"{r},{u},{rng.normal() + 0.5 * member[r, u]:.6f},{member[r, u]}"
                                        for r in range(2) for u in range(40)]
    path = tmp_path / "scores.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


# (command, the entry of the output folder that is a link to a folder or file outside it)
LINK_CASES = [("run", "runs"), ("run", "figures"), ("run", "run.log"), ("run", "attacks"), ("run", "diagnostics"),
              ("train", "runs"), ("scores", "figures"), ("scores", "run.log"), ("report", "figures")]


@pytest.mark.parametrize("command, entry", LINK_CASES, ids=[f"{c}-{e}" for c, e in LINK_CASES])
def test_links_leading_out_of_the_output_folder_are_refused_before_any_work(tmp_path, capsys, command, entry):
    """docs/explanation/security.md: every path written is checked to resolve inside --out, symbolic links included — a
    link placed in the folder (``out/runs -> ../elsewhere``) is one line and exit 2, before training,
    and nothing lands outside (or inside) the folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    if command == "report":  # a results folder, as `scores --out` writes it (no training)
        assert main(["scores", str(score_file(tmp_path)), "--out", str(out)]) == 0
        capsys.readouterr()
        shutil.rmtree(out / "figures")  # replaced by the link below
    else:
        out.mkdir()
    target = elsewhere / "run.log" if entry == "run.log" else elsewhere
    os.symlink(target, out / entry)
    if command in ("run", "train"):
        config = tmp_path / "c.yaml"
        config.write_text(tiny(), encoding="utf-8")
        args = [command, str(config), "--out", str(out), "--quiet"]
    elif command == "scores":
        args = ["scores", str(score_file(tmp_path)), "--out", str(out)]
    else:
        args = ["report", str(out), "--figures"]
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1, err
    assert f"'{out / entry}' is a symbolic link" in err[0] and "outside the output folder" in err[0] and "allowed:" in err[0]
    assert snapshot(tmp_path) == before  # nothing written anywhere: not through the link, not in --out
    assert not any(elsewhere.iterdir())


# --------------------------------------------------------------------------- what a label can do to a spreadsheet


@pytest.mark.parametrize("name", ["\r=1+1", "=HYPERLINK(\"http://x\")", "+1", "-1+1", "@SUM(A1)", "\t=1", "a\x1b[2Kb"])
def test_results_csv_cells_are_neither_split_nor_formulas(name, tmp_path):
    """A system name that reaches results.csv: every row keeps the header's column count (a raw
    carriage return would split it) and no text cell begins with =, +, - or @ (a spreadsheet would
    evaluate it): such a cell starts with an apostrophe, a control character is spelled out.
    Number cells are numbers; results.json keeps the name as written."""
    import csv

    rng = np.random.default_rng(0)
    scores = tmp_path / "s.csv"
    scores.write_text("canary,score,inserted\n" + "".join(f"{i},{rng.normal(i % 2)},{i % 2}\n" for i in range(200)),
                      encoding="utf-8")
    out = tmp_path / "out"
    assert main(["scores", str(scores), f"--name={name}", "--out", str(out)]) == 0
    with (out / "results.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert all(len(row) == len(rows[0]) for row in rows) and len(rows) > 1
    for row in rows[1:]:
        for cell in row:
            try:
                math.isnan(float(cell))  # a number (or inf/nan) is a number
            except ValueError:
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, cell)
                assert "\x1b" not in cell and "\r" not in cell
    def texts(node):
        if isinstance(node, dict):
            return [t for value in node.values() for t in texts(value)]
        return [t for value in node for t in texts(value)] if isinstance(node, list) else [node]

    assert name in texts(json.loads((out / "results.json").read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- what a label can do to a terminal

#: clear the line, set the window title (OSC 0 … BEL), an OSC 8 hyperlink, a carriage return, a
#: right-to-left override (Boucher & Anderson 2023), a C1 control
ESCAPES = "\x1b[2K\x1b]0;title\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\rback\u202eevil\x9b"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def test_labels_cannot_drive_a_terminal_a_log_or_a_page(tmp_path, capsys):
    """A name with escape sequences reaches stdout, run.log and report.html spelled out (``\\x1b``),
    results.json keeps it as written; `check` prints a rule's hostile name spelled out too."""
    rng = np.random.default_rng(0)
    scores = tmp_path / "s.csv"
    scores.write_text("canary,score,inserted\n" + "".join(f"{i},{rng.normal(i % 2)},{i % 2}\n" for i in range(200)),
                      encoding="utf-8")
    out = tmp_path / f"out{ESCAPES[:4]}"  # the path is printed too
    assert main(["scores", str(scores), f"--name={ESCAPES}", "--out", str(out), "-v"]) == 0
    captured = capsys.readouterr()
    shown = {"stdout": captured.out, "stderr": captured.err, "run.log": (out / "run.log").read_text(encoding="utf-8"),
             "report.html": (out / "report.html").read_text(encoding="utf-8")}
    assert "\\x1b[2K" in shown["stdout"] and "\\u202e" in shown["report.html"]
    for where, text in shown.items():
        assert not any(raw in text for raw in RAW), where
    document = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [e["label"] for e in document["experiments"]] == [ESCAPES]  # kept as written
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"rules": [{"name": f"rule {ESCAPES}", "kind": "no-violation"}]}), encoding="utf-8")
    code = main(["check", str(out / "results.json"), "--policy", str(policy)])
    captured = capsys.readouterr()
    assert code in (0, 1) and "rule \\x1b[2K" in captured.out
    assert not any(raw in captured.out + captured.err for raw in RAW)
