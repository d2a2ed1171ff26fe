"""Output paths, data roots, the output folder's lock and temporary files: refused input is one line
and exit code 2 before any work, and leaves nothing behind — not in --out, not elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit.cli import main
from tests.audit.test_hostile_input import score_file, snapshot, tiny

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    return code, capsys.readouterr().err.splitlines()


def refused(capsys, tmp_path: Path, *args: str, expect: str) -> list[str]:
    """Run the command; it must exit 2 with one stderr line containing ``expect`` and change nothing
    under ``tmp_path``."""
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1 and expect in err[0], err
    assert err[0].startswith("dpfl-audit: error: ") and "internal error" not in err[0]
    assert snapshot(tmp_path) == before
    return err


# --------------------------------------------------------------------------- --out that cannot be a folder


def _bad_out(tmp_path: Path, case: str) -> str:
    (tmp_path / "a-file").write_text("x")
    if case == "existing file":
        return str(tmp_path / "a-file")
    if case == "/dev/null":
        return os.devnull
    if case == "dangling link":
        os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
        return str(tmp_path / "dangling")
    if case == "link loop":
        os.symlink(tmp_path / "loop", tmp_path / "loop")
        return str(tmp_path / "loop")
    if case == "300-character name":
        return str(tmp_path / ("n" * 300))
    if case == "under a file":
        return str(tmp_path / "a-file" / "out")
    if case == "under a dangling link":
        os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
        return str(tmp_path / "dangling" / "out")
    assert case == "empty"
    return ""


OUT_CASES = ["existing file", "/dev/null", "dangling link", "link loop", "300-character name", "under a file",
             "under a dangling link", "empty"]


@pytest.mark.parametrize("command", ["run", "scores", "invert"])
@pytest.mark.parametrize("case", OUT_CASES)
def test_out_that_cannot_be_a_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch, case, command):
    monkeypatch.chdir(tmp_path)  # `--out ''` would have written into the current directory
    out = _bad_out(tmp_path, case)
    if command == "run":
        config = tmp_path / "c.yaml"
        config.write_text(tiny(), encoding="utf-8")
        args = ["run", str(config), "--quiet"]
    elif command == "scores":
        args = ["scores", str(score_file(tmp_path))]
    else:
        args = ["invert", "--attack", "dlg", "--dataset", "digits", "--iterations", "1"]
    refused(capsys, tmp_path, *args, "--out", out, expect="--out: ")


def test_report_out_must_be_a_file_not_a_folder(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["scores", str(score_file(tmp_path)), "--out", str(results)]) == 0
    capsys.readouterr()
    (tmp_path / "folder").mkdir()
    err = refused(capsys, tmp_path, "report", str(results), "--out", str(tmp_path / "folder"), expect="--out: ")
    assert "is a folder" in err[0]
    refused(capsys, tmp_path, "report", str(results), "--out", "", expect="--out: the path is empty")


# --------------------------------------------------------------------------- data roots and log files


@pytest.fixture
def offline(monkeypatch):
    """torchvision's MNIST download fails at once, as it does offline (nothing listens on port 9)."""
    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])


def test_refused_data_root_leaves_no_folders(tmp_path, capsys, offline):
    """A failed download removes every folder it made, up to the first that did not exist."""
    root = tmp_path / "missing" / "x"
    out = tmp_path / "out"
    err = refused(capsys, tmp_path, "invert", "--attack", "dlg", "--dataset", "mnist", "--data-root", str(root),
                  "--out", str(out), expect="dataset 'mnist'")
    assert "download failed" in err[0]
    assert not (tmp_path / "missing").exists() and not out.exists()


def test_failed_download_into_an_existing_root_leaves_it_as_it_was(tmp_path, capsys, offline):
    root = tmp_path / "data"
    root.mkdir()
    (root / "keep.txt").write_text("mine")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{name: mnist, root: {root}, options: {{download: true}}}}\n", encoding="utf-8")
    refused(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--quiet", expect="download failed")
    assert sorted(p.name for p in root.iterdir()) == ["keep.txt"]  # no MNIST/raw left behind


@pytest.mark.parametrize("value", ['"no"', '"false"', "0", "[]"])
def test_dataset_flags_must_be_real_booleans(tmp_path, capsys, value):
    root = tmp_path / "data"
    root.mkdir()
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{name: mnist, root: {root}, options: {{download: {value}}}}}\n", encoding="utf-8")
    err = refused(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--quiet",
                  expect="dataset.options.download: must be true or false")
    assert "allowed: true, false" in err[0]


def test_log_file_is_not_created_for_refused_input(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(tiny(training={"rounds": -1}), encoding="utf-8")
    log = tmp_path / "audit.log"
    refused(capsys, tmp_path, "run", str(config), "--out", str(tmp_path / "out"), "--log-file", str(log),
            expect="training.rounds")
    assert not log.exists()


def test_log_file_is_written_once_the_input_is_accepted(tmp_path, capsys):
    log = tmp_path / "audit.log"
    assert main(["scores", str(score_file(tmp_path)), "--out", str(tmp_path / "out"), "--log-file", str(log), "-v"]) == 0
    assert "wrote" in log.read_text(encoding="utf-8")
    log2 = tmp_path / "epsilon.log"  # a command with no output folder: written when it ends
    assert main(["epsilon", "--noise", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5",
                 "--log-file", str(log2)]) == 0
    assert log2.exists()


# --------------------------------------------------------------------------- the lock and temporary files


def _hold(folder: Path) -> subprocess.Popen:
    """Another process that claims ``folder`` (as a running command does) until it is killed."""
    code = ("import sys, time\nfrom audit.core.output_folder import claim\n"
            f"claim({str(folder)!r})\nprint('held', flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_process_on_the_same_out_is_refused_and_a_killed_one_blocks_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    scores = score_file(tmp_path)
    holder = _hold(out)
    try:
        err = refused(capsys, tmp_path, "scores", str(scores), "--out", str(out),
                      expect=f"is in use by another dpfl-audit process (pid {holder.pid})")
        assert "wait for it or choose another --out" in err[0]
        config = tmp_path / "c.yaml"
        config.write_text(tiny(), encoding="utf-8")
        refused(capsys, tmp_path, "run", str(config), "--out", str(out), "--quiet", expect="is in use")
    finally:
        holder.kill()  # as a crash or `kill -9` would: the kernel releases the lock
        holder.wait()
    code, err = run_cli(capsys, "scores", str(scores), "--out", str(out))
    assert code == 0, err
    assert (out / "results.json").is_file()


def test_temporary_files_of_a_killed_command_are_removed_when_it_resumes(tmp_path, capsys):
    out = tmp_path / "out"
    scores = score_file(tmp_path)
    assert main(["scores", str(scores), "--out", str(out)]) == 0
    # what a process killed while writing leaves: atomic writes' and score files' temporaries
    stale = [out / ".results.json.12345-abcdefgh.tmp", out / "figures" / ".roc-x.png.12345-1a2b3c4d.tmp",
             out / ".loss-threshold.12345-0a1b2c3d.tmp.npz"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half")
    own = out / ".notes.tmp"  # a file of the user's with a similar name is not ours to remove
    own.write_text("mine")
    time.sleep(0.01)
    code, err = run_cli(capsys, "scores", str(scores), "--out", str(out))
    assert code == 0, err
    assert not any(path.exists() for path in stale)
    assert [p.name for p in out.rglob("*.tmp*")] == [own.name]
