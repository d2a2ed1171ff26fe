"""Where a dataset's files are looked for, and a download that leaves nothing behind when it fails.

A loader reads its files from the config's ``dataset.root`` or from :func:`default_root`
(``$DPFL_AUDIT_DATA/<name>``, else ``~/.cache/dpfl-audit/data/<name>``). When the files are
missing it may try a download (:func:`attempt_download`); a failed download (offline, proxy,
checksum) removes what it created and becomes part of the loader's one-line error, which names
the directories searched and how to provide the files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def default_root(name: str) -> Path:
    """Where a dataset is looked for when the config gives no ``root``."""
    base = os.environ.get("DPFL_AUDIT_DATA")
    if base:
        return Path(base).expanduser() / name
    return Path.home() / ".cache" / "dpfl-audit" / "data" / name


def attempt_download(base: Path, download: Callable[[Path], None]) -> str:
    """Run ``download(base)``; on failure remove what it created and return the reason for the error."""
    import shutil

    existed = base.exists()
    try:
        download(base)
    except Exception as exc:  # offline, proxy, checksum: the caller's error message says why
        if not existed:
            shutil.rmtree(base, ignore_errors=True)
        return f"; download failed ({type(exc).__name__}: {str(exc)[:120]})"
    return ""
