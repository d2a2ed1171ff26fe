"""A stored run's seal: the SHA-256 of each of its files, authenticated under the machine's key.

``<out>/runs/<run_id>/seal.json`` lists every other file of the run with its SHA-256, and an
HMAC (:mod:`audit.core.seal`) over that list and the run's id — so a run cannot be renamed to
another id either. It is written in the run's staging folder after every other file, before the
run is renamed into place (:class:`audit.store.RunStore`). A run is reused only while its seal
holds: a flipped byte of ``model.safetensors``, an edited ``membership.npy``, an added or removed
file, or a run written under another key is refused, never silently trained on or attacked.

Checking reads every file once; the answer is kept per process for as long as the files' sizes,
modification times and inodes stay the same.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from audit.core import seal
from audit.core.atomic import dumps, file_sha256

SEAL_NAME = "seal.json"

#: folder → (the stat of its files, when they last held their seal)
_HELD: dict[Path, tuple] = {}


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != SEAL_NAME)


def _body(run_id: str, digests: dict[str, str]) -> bytes:
    return json.dumps({"run": run_id, "files": digests}, sort_keys=True, separators=(",", ":")).encode()


def _stamp(folder: Path, names: list[str]) -> tuple:
    stats = [os.stat(folder / name) for name in [*names, SEAL_NAME]]
    return tuple((name, s.st_size, s.st_mtime_ns, s.st_ino) for name, s in zip([*names, SEAL_NAME], stats))


def write(folder: Path, run_id: str) -> None:
    """Seal every file now in ``folder`` (a run being staged) for ``run_id``."""
    digests = {name: file_sha256(folder / name) for name in _files(folder)}
    document = {"run": run_id, "files": digests, "seal": seal.seal(_body(run_id, digests))}
    with open(folder / SEAL_NAME, "w", encoding="utf-8") as out:
        out.write(dumps(document) + "\n")


def problem(folder: Path, run_id: str) -> tuple[str, str] | None:
    """None while the run in ``folder`` holds its seal; else (the file, what is wrong with it)."""
    names = _files(folder)
    try:
        stamp = _stamp(folder, names)
    except OSError:  # a file gone since it was listed, or no seal.json: checked below
        stamp = None
    if stamp is not None and _HELD.get(folder) == stamp:
        return None
    try:
        document = json.loads((folder / SEAL_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return SEAL_NAME, "missing or unreadable: the run was not written by this version, or was damaged"
    digests = document.get("files") if isinstance(document, dict) else None
    flat = isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())
    if not flat or not seal.holds(_body(run_id, digests), document.get("seal")):
        return SEAL_NAME, ("not sealed with this machine's key (edited, or written on another machine: "
                           f"set {seal.KEY_ENV} to the key file it was written with)")
    for name in sorted(set(names) | set(digests)):
        if name not in digests:
            return name, "not among the files the run was written with"
        try:
            if file_sha256(folder / name) != digests[name]:
                return name, "changed since the run was written"
        except OSError:
            return name, "missing"
    if stamp is not None:
        _HELD[folder] = stamp
    return None
