"""Logging through the standard module — -v/-vv, --log-file, run.log in every
output directory, nothing printed by library code."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

from audit.cli import main
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, capsys, *flags: str) -> tuple[int, str, Path]:
    tmp_path.mkdir(exist_ok=True)
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config())
    out = tmp_path / "out"
    code = main(["run", str(config), "--out", str(out), "--quiet", *flags])
    return code, capsys.readouterr().err, out


def test_every_run_writes_run_log_and_the_console_shows_info_only_with_v(tmp_path, capsys):
    code, err, out = _run(tmp_path, capsys)
    assert code == 0 and "plan:" not in err  # the console: warnings only by default
    log = (out / "run.log").read_text()
    # the pipeline's steps, in order, with DEBUG records too
    steps = [log.index(text) for text in ("INFO    audit.pipeline: plan: 1 experiment(s)", "training fedavg: 2 membership runs",
                                          "DEBUG   audit.training: fedavg: runs 0, 1 train together",
                                          "audit.attacking: loss-threshold on fedavg: AUC", "wrote ")]
    assert steps == sorted(steps)

    code, err, _ = _run(tmp_path / "v", capsys, "-v")
    assert code == 0 and "dpfl-audit: plan: 1 experiment(s)" in err and "train together" not in err
    code, err, _ = _run(tmp_path / "vv", capsys, "-vv")
    assert code == 0 and "dpfl-audit: fedavg: runs 0, 1 train together" in err


def test_log_file_gets_the_log_and_a_rerun_appends_to_run_log(tmp_path, capsys):
    log_file = tmp_path / "audit.log"
    code, _, out = _run(tmp_path, capsys, "--log-file", str(log_file))
    assert code == 0 and "training fedavg: 2 membership runs (0 stored already)" in log_file.read_text()
    code, _, out = _run(tmp_path, capsys)  # the same directory: resumed, and its log says so
    assert code == 0 and "training fedavg: 2 membership runs (2 stored already)" in (out / "run.log").read_text()


def test_refused_input_leaves_no_directory_and_no_run_log(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--preset", "smoke", "--set", "training.rouns=2", "--out", str(out)]) == 2
    assert not out.exists()
    assert main(["run", "--preset", "smoke", "--log-file", str(tmp_path / "missing" / "x.log"), "--out", str(out)]) == 2
    assert "--log-file: " in capsys.readouterr().err and not out.exists()


def test_warnings_reach_the_console_with_quiet_and_the_log(tmp_path, capsys):
    # a defense whose training diverges: the pipeline warns and goes on
    config = tmp_path / "d.yaml"
    config.write_text(tiny_config(defenses=[{"name": "fedavg", "label": "blows-up", "training": {"lr": 1.0e30}}]))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "dpfl-audit: warning: 'blows-up' run 0 diverged" in err
    assert "WARNING audit.training: 'blows-up' run 0 diverged" in (out / "run.log").read_text()


def test_the_cli_leaves_logging_as_it_found_it(tmp_path, capsys):
    before = [(logging.getLogger(n).handlers, logging.getLogger(n).propagate) for n in ("audit", "defenses")]
    _run(tmp_path, capsys)
    assert [(logging.getLogger(n).handlers, logging.getLogger(n).propagate) for n in ("audit", "defenses")] == before


def test_library_code_prints_nothing():
    """Only the command line's own modules (and a module's `__main__` block) print; the library logs."""
    allowed = {ROOT / "audit" / "cli.py", ROOT / "reports" / "gate.py"} | set((ROOT / "audit" / "commands").glob("*.py"))
    offenders = []
    for package in ("audit", "defenses", "attacks", "reports"):
        for path in (ROOT / package).rglob("*.py"):
            if path in allowed:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            main_blocks = {id(n) for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                           for n in ast.walk(node)}
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
                          if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
                          and id(node) not in main_blocks]
    assert offenders == [], offenders


# --------------------------------------------------------------------------- progress bars only on a terminal


def test_progress_bars_are_drawn_on_a_terminal_only_and_never_with_quiet():
    """:func:`audit.logs.bars_on` is asked by every progress bar: a pseudo-terminal gets bars
    (unless --quiet), a pipe or a file does not."""
    import io
    import os

    from audit.logs import bars_on, progress_bar

    controller, terminal = os.openpty()
    try:
        with os.fdopen(terminal, "w", closefd=False) as stream:
            assert bars_on(False, stream) and not bars_on(True, stream)
        read, write = os.pipe()
        with os.fdopen(write, "w") as pipe:
            assert not bars_on(False, pipe)
        os.close(read)
    finally:
        os.close(controller)
        os.close(terminal)
    assert not bars_on(False, io.StringIO())
    closed = io.StringIO()
    closed.close()
    assert not bars_on(False, closed)
    assert not bars_on(False, object())  # type: ignore[arg-type]  # no isatty at all
    # pytest captures stderr: not a terminal, so the bar is disabled even without --quiet
    assert progress_bar(3, "x", quiet=False).disable


def test_a_run_without_a_terminal_writes_no_carriage_returns(tmp_path):
    """A command whose stderr is a pipe (a CI log, `2> file`) and that is not --quiet: its bars are
    off, so the log holds whole lines, no `\\r` redraws."""
    import os
    import subprocess
    import sys

    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config())
    result = subprocess.run([sys.executable, "-m", "audit", "run", str(config), "--out", str(tmp_path / "out"), "-v"],
                            capture_output=True, cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr.decode()
    assert b"dpfl-audit: plan:" in result.stderr  # -v: the log records do reach the pipe
    assert b"\r" not in result.stderr and b"\r" not in result.stdout
