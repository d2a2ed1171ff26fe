"""Atomic file writes (temp file + rename) and strict JSON.

A killed process leaves either the old file or the new one, never half of one (and perhaps a
temporary ``.NAME.PID-RANDOM.tmp``, removed when a command next claims the folder). JSON is
written with ``allow_nan=False`` after mapping NaN and ±inf to ``null``, so every file we
write is valid JSON for any parser.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from audit.core.errors import OutputError


def json_safe(value: Any) -> Any:
    """Recursively convert numpy scalars/arrays and non-finite floats to JSON-compatible values."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def dumps(value: Any, indent: int | None = 2) -> str:
    return json.dumps(json_safe(value), indent=indent, sort_keys=False, allow_nan=False, ensure_ascii=False)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in blocks (raises OSError if it cannot be read). A loop rather
    than ``hashlib.file_digest``, which Python 3.10 lacks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_mode() -> int:
    """The mode ``open()`` would give a new file: 0666 less the process's umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()


def _existing(path: Path) -> os.stat_result | None:
    """What is at ``path`` now (links not followed); None if nothing. Anything but a regular file
    (or a link) there is refused: a rename over a folder fails, and a FIFO would block a reader."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    if not (stat.S_ISREG(status.st_mode) or stat.S_ISLNK(status.st_mode)):
        kind = "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        raise OutputError(path, f"{kind} is in its place (remove it)")
    return status


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a new temporary file beside ``path`` and rename it into place: never
    through the existing entry (a hard link to it keeps its bytes). An OS error (a full disk) is an
    :class:`~audit.core.errors.OutputError` naming the file; no temporary file is left."""
    path = Path(path)
    try:
        _existing(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # unique per process and call (pid + mkstemp's random part): two writers never share a temp
        # file, and a killed writer's ``.NAME.PID-RANDOM.tmp`` is removed when a command next claims
        # the folder (audit.core.output_folder)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError.from_os_error(path, exc) from None
    try:
        os.fchmod(handle, _FILE_MODE)  # mkstemp's 0600 would make our outputs private to us
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise OutputError.from_os_error(path, exc) from None
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def update_text(path: str | os.PathLike, text: str) -> bool:
    """Write ``text`` atomically unless the file already holds exactly these bytes (then it is left
    untouched, its time stamps too: a rerun rewrites only what changed); True if it wrote."""
    data = text.encode("utf-8")
    status = _existing(Path(path))
    # only a regular file of the same size is read (a link, or a huge sparse file, is rewritten)
    if status is not None and stat.S_ISREG(status.st_mode) and status.st_size == len(data):
        try:
            if Path(path).read_bytes() == data:
                return False
        except OSError:  # unreadable: write it
            pass
    write_bytes(path, data)
    return True


def write_json(path: str | os.PathLike, value: Any) -> None:
    write_text(path, dumps(value) + "\n")
