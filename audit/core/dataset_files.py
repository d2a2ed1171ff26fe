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


def _entries(folder: Path) -> set[str]:
    """Every path under ``folder`` (links not followed); empty when it is not a folder."""
    found: set[str] = set()
    for directory, folders, files in os.walk(folder, followlinks=False):
        found.update(os.path.join(directory, name) for name in folders + files)
    return found


def _remove(path: str) -> None:
    import contextlib
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def attempt_download(base: Path, download: Callable[[Path], None]) -> str:
    """Run ``download(base)``; on failure remove everything it created — the missing folders above
    ``base`` (``/nonexistent`` of ``/nonexistent/x``) and what appeared inside an existing ``base``
    (torchvision's ``MNIST/raw``) — and return the reason for the error."""
    absolute = base.expanduser().absolute()
    missing = [p for p in [absolute, *absolute.parents] if not os.path.lexists(p)]
    top = missing[-1] if missing else None  # the highest folder the download would create
    before = _entries(absolute) if top is None else set()
    try:
        download(base)
    except Exception as exc:  # offline, proxy, checksum: the caller's error message says why
        if top is not None:
            _remove(str(top))
        else:
            created = _entries(absolute) - before
            for path in created:
                if os.path.dirname(path) not in created:  # the topmost new entries; their content goes with them
                    _remove(path)
        return f"; download failed ({type(exc).__name__}: {str(exc)[:120]})"
    return ""
