"""Seals: what the product wrote into an output folder, authenticated with a key kept outside it.

A digest stored beside the data it covers proves nothing against someone who can edit both: they
recompute it. The stage cache's entries and the run store's runs are therefore sealed with an
HMAC-SHA256 (RFC 2104) under a key that never lies in an output folder:

* ``$DPFL_AUDIT_KEY_FILE`` when set, else ``$XDG_CACHE_HOME/dpfl-audit/seal.key`` (by default
  ``~/.cache/dpfl-audit/seal.key``): 32 random bytes, created on first use with mode 0600;
* when that file can be neither read nor created (a read-only home), a key of this process only,
  with one warning: what it writes is then trusted by no later command.

Trust model: someone who can write in ``--out`` but cannot read the key can delete or damage what
is there, but cannot make the product *reuse* a value it did not compute — an edited cache entry is
recomputed, an edited run is refused with one line. Copying an output folder to another machine
makes its runs untrusted there, unless the key file is copied too (or ``DPFL_AUDIT_KEY_FILE`` names
a shared one). Reports (``results.json``) are not sealed: ``report`` and ``check`` judge the file
they are given, and the file is only as trustworthy as whoever wrote it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
from functools import cache
from pathlib import Path

LOG = logging.getLogger(__name__)

#: the environment variable naming the key file
KEY_ENV = "DPFL_AUDIT_KEY_FILE"
KEY_BYTES = 32


def key_path() -> Path:
    """Where the key is kept (see the module docstring)."""
    named = os.environ.get(KEY_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "dpfl-audit", "seal.key")


def _read_key(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            key = handle.read(KEY_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(key) != KEY_BYTES:
        raise OSError(f"the key file holds {len(key)} bytes, not {KEY_BYTES}")
    return key


def _create_key(path: Path) -> bytes:
    """A new random key at ``path``, written whole before it gets its name (two processes
    creating it at once: the first link wins, the other reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs is read
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    key = _read_key(path)
    if key is None:  # pragma: no cover - removed between the link and the read
        raise OSError("the key file disappeared while it was created")
    return key


@cache
def key() -> bytes:
    """The sealing key, read (or created) once per process."""
    path = key_path()
    try:
        return _read_key(path) or _create_key(path)
    except OSError as exc:
        LOG.warning("cannot keep the sealing key at '%s' (%s): stored runs and cache entries written now will "
                    "not be trusted by a later command; set %s to a file you can write", path,
                    exc.strerror or exc, KEY_ENV)
        return secrets.token_bytes(KEY_BYTES)


def seal(data: bytes) -> str:
    """The HMAC-SHA256 of ``data`` under :func:`key`, as hex."""
    return hmac.new(key(), data, hashlib.sha256).hexdigest()


def holds(data: bytes, tag: object) -> bool:
    """Whether ``tag`` is ``data``'s seal (compared in constant time)."""
    return isinstance(tag, str) and hmac.compare_digest(seal(data), tag)
