"""Seals under a key kept outside the output folder: what someone who can write in ``--out`` but not
read the key can and cannot make the product reuse (RFC 2104's HMAC-SHA256)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat

import numpy as np
import pytest
import torch

from audit import store_seal
from audit.core import seal
from audit.core.errors import UserInputError
from audit.store import RunStore


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    path = tmp_path / "keys" / "seal.key"
    monkeypatch.setenv(seal.KEY_ENV, str(path))
    seal.key.cache_clear()
    yield path
    seal.key.cache_clear()


def _save(store: RunStore, run: str = "exp-r000-0123456789ab") -> str:
    store.save_run(run, {"run_id": run}, {"w": torch.arange(6.0)}, np.arange(10), [{"round": 1}])
    return run


def test_the_key_is_created_once_private_and_the_seal_is_its_hmac(key_file):
    tag = seal.seal(b"some bytes")
    key = key_file.read_bytes()
    assert len(key) == seal.KEY_BYTES and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert tag == hmac.new(key, b"some bytes", hashlib.sha256).hexdigest()  # RFC 2104, independently
    seal.key.cache_clear()
    assert seal.seal(b"some bytes") == tag  # read back, not made again
    assert seal.holds(b"some bytes", tag) and not seal.holds(b"other bytes", tag) and not seal.holds(b"x", None)
    assert not seal.holds(b"some bytes", hashlib.sha256(b"some bytes").hexdigest())  # a digest anyone can compute


def test_a_key_file_of_the_wrong_size_is_not_used_and_nothing_is_trusted_later(key_file, caplog):
    key_file.parent.mkdir()
    key_file.write_bytes(b"short")
    first = seal.seal(b"data")
    assert "cannot keep the sealing key" in caplog.text and key_file.read_bytes() == b"short"
    seal.key.cache_clear()
    assert seal.seal(b"data") != first  # a key of one process only


def test_a_run_is_reused_only_while_its_seal_holds(key_file, tmp_path):
    store = RunStore(tmp_path / "out")
    run = _save(store)
    folder = store.path(run)
    assert store.is_complete(run) and json.loads((folder / "seal.json").read_text())["run"] == run
    np.save(folder / "membership.npy", np.arange(1, 11), allow_pickle=False)  # an edited membership
    with pytest.raises(UserInputError, match=r"\(membership.npy: changed since the run was written\)"):
        store.is_complete(run)
    np.save(folder / "membership.npy", np.arange(10), allow_pickle=False)  # the same bytes again
    assert store.is_complete(run)
    (folder / "notes.txt").write_text("x")
    with pytest.raises(UserInputError, match=r"\(notes.txt: not among the files"):
        store.load_membership(run)
    (folder / "notes.txt").unlink()
    renamed = store.path("exp-r001-0123456789ab")
    os.rename(folder, renamed)  # one run's files under another run's id
    with pytest.raises(UserInputError, match=r"\(seal.json: not sealed with this machine's key"):
        store.is_complete(renamed.name)


def test_a_run_written_under_another_key_is_refused_and_says_how_to_trust_it(key_file, tmp_path, monkeypatch):
    store = RunStore(tmp_path / "out")
    run = _save(store)
    monkeypatch.setenv(seal.KEY_ENV, str(tmp_path / "other.key"))
    seal.key.cache_clear()
    store_seal._HELD.clear()
    with pytest.raises(UserInputError, match=f"written on another machine: set {seal.KEY_ENV}"):
        store.is_complete(run)


def test_runs_from_a_remote_worker_are_sealed_again_here(key_file, tmp_path):
    worker = RunStore(tmp_path / "worker")
    run = _save(worker)
    files = worker.run_files(run)
    files["seal.json"] = b'{"run": "forged", "files": {}, "seal": "0"}\n'
    here = RunStore(tmp_path / "here")
    here.save_files(run, files)
    assert here.is_complete(run)
