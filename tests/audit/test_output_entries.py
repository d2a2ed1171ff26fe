"""Entries of the output folder a command cannot use safely — hard links to a file written in place,
FIFOs, sockets, folders where a file goes, files where a folder goes — are refused before any work
(one line, exit 2, nothing written anywhere); a full disk is one line naming the file and its errno,
with no temporary file left; a hard link to a file replaced by a rename keeps its bytes."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from audit.core import output_folder
from audit.core.errors import UserInputError
from audit.logs import RunLogHandler
from tests.audit.test_hostile_input import run_cli, score_file, snapshot, tiny
from tests.helpers import place_entry


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# (entry inside --out, what is put there, words of the refusal)
CASES = [(".dpfl-audit.lock", "hardlink", "is a hard link"), (".dpfl-audit.lock", "fifo", "is a FIFO"),
         ("run.log", "hardlink", "is a hard link"), ("run.log", "fifo", "is a FIFO"),
         ("run.log", "folder", "folder where the command writes a file"), ("run.log", "socket", "is a socket"),
         ("report.html", "fifo", "is a FIFO"), ("results.csv", "fifo", "is a FIFO"),
         ("results.json", "folder", "folder where the command writes a file"),
         ("figures", "file", "file where the command writes a folder"),
         ("cache", "file", "file where the command writes a folder"),
         ("runs", "file", "file where the command writes a folder"),
         ("cache/attacks/loss-threshold/entry.json", "folder", "folder where the command writes a file"),
         ("cache/attacks/loss-threshold/entry.json", "fifo", "is a FIFO"),
         ("runs/r0/model.safetensors", "folder", "folder where the command writes a file")]


@pytest.mark.parametrize("command", ["scores", "run"])
@pytest.mark.parametrize("name, kind, words", CASES, ids=[f"{n}-{k}" for n, k, _ in CASES])
def test_entries_of_the_wrong_kind_are_refused_before_any_work(tmp_path, capsys, command, name, kind, words):
    victim = tmp_path / "victim"
    victim.write_text("the victim's bytes\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    place_entry(out, name, kind, victim)
    if command == "run":
        config = tmp_path / "c.yaml"
        config.write_text(tiny(), encoding="utf-8")
        args = ["run", str(config), "--out", str(out), "--quiet"]
    else:
        args = ["scores", str(score_file(tmp_path)), "--out", str(out)]
    before, victim_before = snapshot(tmp_path), sha(victim)
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1, err
    assert f"'{out / name}'" in err[0] and words in err[0] and "allowed:" in err[0], err[0]
    assert snapshot(tmp_path) == before and sha(victim) == victim_before


def test_a_hard_link_to_a_file_replaced_by_a_rename_keeps_its_bytes(tmp_path, capsys):
    """Every file but the lock and run.log is written to a new file renamed into place: a second
    name of results.json (from an earlier run) still holds the old bytes after a rerun."""
    out = tmp_path / "out"
    scores = score_file(tmp_path)
    assert run_cli(capsys, "scores", str(scores), "--out", str(out))[0] == 0
    keep = tmp_path / "kept.json"
    os.link(out / "results.json", keep)
    keep_before = sha(keep)
    other = tmp_path / "other.csv"
    other.write_text(scores.read_text().replace(",0.", ",1."), encoding="utf-8")  # other scores
    assert run_cli(capsys, "scores", str(other), "--out", str(out))[0] == 0
    assert sha(keep) == keep_before and sha(out / "results.json") != keep_before
    assert os.stat(out / "results.json").st_nlink == 1


def test_the_lock_and_the_log_are_checked_on_what_is_opened(tmp_path):
    """Entries placed after the folder was checked: claim() refuses a FIFO lock without hanging, and
    run.log's handler writes nothing through a hard link (it warns once, the command goes on)."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / output_folder.LOCK_NAME)
    with pytest.raises(UserInputError, match="is a FIFO"):
        output_folder.claim(out)
    os.unlink(out / output_folder.LOCK_NAME)
    victim = tmp_path / "victim"
    victim.write_text("v\n", encoding="utf-8")
    os.link(victim, out / "run.log")
    handler = RunLogHandler(out)
    with pytest.raises(OSError):
        handler.open()
    assert victim.read_text() == "v\n"


def test_a_full_disk_is_one_line_naming_the_file_and_no_temporary_is_left(tmp_path):
    """The file-size limit (RLIMIT_FSIZE, as a full disk: EFBIG on write) set in a child process."""
    out = tmp_path / "out"
    scores = score_file(tmp_path)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    done = subprocess.run([sys.executable, "-m", "audit", "scores", str(scores), "--out", str(out)],
                          preexec_fn=limit, capture_output=True, text=True, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("dpfl-audit: error: cannot write '") and "(EFBIG)" in err[0], err[0]
    leftovers = [p for p in out.rglob("*") if output_folder.STALE_TEMPORARY.fullmatch(p.name)]
    assert leftovers == []
    for path in out.glob("*.json"):  # what was written is whole
        assert path.read_text(encoding="utf-8").endswith("}\n")
