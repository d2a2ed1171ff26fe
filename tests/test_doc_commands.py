"""Commands the documentation shows that are too expensive for its runnable blocks (the default
audit, the papers' reproductions, gradient inversion at full length, tracking): each is read from
its page as printed, parsed by the real command line, and run where a smaller form can run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from audit.cli import main
from audit.cli_parser import build_parser
from tests.helpers import DOCS, readme_commands
from tests.reports.test_check import default_experiments, write_results

ROOT = Path(__file__).resolve().parents[1]


def test_the_tutorials_default_audit_is_the_default_audit():
    (arguments,) = [a for a in readme_commands("dpfl-audit run", DOCS / "tutorial" / "first-audit.md")
                    if "--preset" not in a and "--set" not in a]
    args = build_parser().parse_args(["run", *arguments])
    assert args.config is None and args.preset is None and args.out == "dpfl-audit-out"


def test_the_ci_gate_pages_check_runs_on_results_shaped_like_the_default_audit(tmp_path, monkeypatch, capsys):
    """The page's `check` with the shipped policy and a baseline passes on results with the default
    audit's configurations (synthetic: the default audit itself is too slow for the suite), and
    writes its JUnit file; the page's `run` is the default audit."""
    page = DOCS / "how-to" / "ci-gate.md"
    (run,) = readme_commands("dpfl-audit run", page)
    parsed = build_parser().parse_args(["run", *run])
    assert parsed.config is None and parsed.preset is None and parsed.quiet
    (check,) = readme_commands("dpfl-audit check", page)
    args = build_parser().parse_args(["check", *check])
    write_results(tmp_path / args.results, default_experiments())
    write_results(tmp_path / args.baseline, default_experiments())
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    assert main(["check", *check]) == 0
    assert "check passed" in capsys.readouterr().out
    assert (tmp_path / args.junit).read_text(encoding="utf-8").startswith("<?xml")


def test_the_tracking_command_sends_a_smoke_audit_to_both_trackers():
    (arguments,) = readme_commands("dpfl-audit run", DOCS / "how-to" / "sweeps-and-tracking.md")
    args = build_parser().parse_args(["run", *arguments])
    assert args.preset == "smoke" and sorted(args.track) == ["mlflow", "tensorboard"]


def test_the_reproduce_commands_name_every_study_quickly():
    from audit.reproductions import STUDIES

    commands = readme_commands("dpfl-audit reproduce", DOCS / "how-to" / "reproduce-papers.md")
    parsed = [build_parser().parse_args(["reproduce", *c]) for c in commands]
    assert sorted(p.study for p in parsed) == sorted(STUDIES)
    assert all(p.quick and p.data_root == "DIR" for p in parsed)


@pytest.mark.parametrize("index", [0, 1])
def test_the_invert_commands_run_shrunk(tmp_path, monkeypatch, capsys, index):
    """The page's two `invert` commands (honest; clipped and noised), with one image and a few
    iterations: every setting the page names is taken, and the outputs it names are written."""
    arguments = readme_commands("dpfl-audit invert", DOCS / "explanation" / "attacks.md")[index]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    assert main(["invert", *arguments, "--images", "1", "--iterations", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / arguments[arguments.index("--out") + 1]
    assert (out / "grid.png").is_file() and (out / "results.json").is_file()
    assert 0.0 <= printed["label_accuracy"] <= 1.0
