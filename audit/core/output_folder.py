"""The output folder: checked before any work, created and locked only once the input is accepted.

Every command that writes into a folder (``--out``, or the results folder ``report`` writes
``report.html`` and ``figures/`` into) goes through two steps:

* :func:`check`, before any work and before anything is written: the path can be a folder we
  write in (not empty, not too long, not an existing file, ``/dev/null``, a dangling link or a link
  loop, not under a file), and no symbolic link inside it leads out of it — ``runs``, ``figures``,
  ``attacks``, ``diagnostics``, ``run.log`` or any deeper entry. No entry in it is of a kind the
  command cannot use safely: a FIFO, socket or device (a read or write would block or reach
  something else), a folder where a file is written (``results.json/``), a file where a folder is
  (``figures``), or a second name (hard link) of a file written in place (the lock, ``run.log``;
  every other file is replaced by a rename, :mod:`audit.core.atomic`). Otherwise a one-line
  :class:`~audit.core.errors.UserInputError` (exit code 2). The folder itself may be a link to a
  folder elsewhere: the user chose it; what is inside must stay inside what it resolves to.
* :func:`claim`, once the command has checked all its input and is about to write: create the
  folder, take its lock and remove the temporary files a killed command left behind.

The lock is ``<folder>/.dpfl-audit.lock``, held with ``fcntl.flock``: the kernel releases it when
the process ends, however it ends, so a killed command never blocks the next one. A second process
on the same folder gets a one-line error naming the holder's pid. Claims are re-entrant within a
process (a sweep's point folders lie inside the sweep's folder), and are released by
:func:`release_all` (the command line calls it when a command ends) or when the process exits.

:func:`audit.core.safe_names.inside` stays the last line of defence at each write; a
``ValueError`` from it after :func:`check` passed is a bug.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from audit.core.errors import UserInputError

try:  # POSIX; elsewhere the folder is used without a lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOG = logging.getLogger(__name__)

#: the lock file every claimed folder holds
LOCK_NAME = ".dpfl-audit.lock"
#: longest file name and path (bytes) that Linux file systems accept
NAME_MAX, PATH_MAX = 255, 4096
#: temporary files of interrupted writes: audit.core.atomic's ``.NAME.PID-RANDOM.tmp`` and the
#: score files' ``.NAME.PID-RANDOM.tmp.npz`` (audit.attacking); nothing else of the folder's,
#: not even a user's own ``.notes.tmp``
STALE_TEMPORARY = re.compile(r"\..+\.\d+-\w+\.tmp(\.npz)?")

_ALLOWED = "allowed: a new or existing folder you can write in"

#: resolved folder → file descriptor of its lock (held while open)
_HELD: dict[Path, int] = {}


def _fail(option: str, what: str, allowed: str = _ALLOWED) -> UserInputError:
    return UserInputError(f"{option}: {what}; {allowed}")


def _check_length(text: str, option: str) -> None:
    encoded = os.fsencode(text)
    if len(encoded) > PATH_MAX:
        raise _fail(option, f"the path has {len(encoded)} bytes, more than the {PATH_MAX} a path may have",
                    f"allowed: paths up to {PATH_MAX} bytes, each name up to {NAME_MAX}")
    for part in Path(text).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise _fail(option, f"the name '{part[:40]}...' has {len(os.fsencode(part))} bytes, more than the {NAME_MAX} "
                                "a file name may have", f"allowed: names up to {NAME_MAX} bytes")


def _check_parents(path: Path, option: str) -> Path:
    """The nearest existing ancestor of a path that does not exist yet: it must be a directory we
    can write in (``out/x`` under a file, or under a dangling link, is refused)."""
    for parent in path.absolute().parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise _fail(option, f"'{path}' lies under '{parent}', which is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise _fail(option, f"cannot create '{path}': the folder '{parent}' is not writable")
            return parent
    raise _fail(option, f"'{path}' has no existing parent folder")  # pragma: no cover - '/' exists


def _lstat(path: Path, option: str) -> os.stat_result | None:
    """``os.lstat(path)``, None when nothing is there; a path the system refuses is one line."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _fail(option, f"'{path}' lies under a file, not a folder") from None
    except OSError as exc:
        why = "a symbolic link loop" if exc.errno == errno.ELOOP else exc.strerror or type(exc).__name__
        raise _fail(option, f"'{path}' cannot be used ({why})") from None


def _resolve_link(link: Path, option: str) -> Path:
    try:
        return link.resolve(strict=False)
    except (RuntimeError, OSError):  # RuntimeError: Python < 3.13's "Symlink loop"
        raise _fail(option, f"'{link}' is a symbolic link loop") from None


#: files written in place rather than replaced by a rename: the lock (its inode is what two
#: processes lock) and ``run.log`` (appended to). A second name for either (a hard link) would
#: carry our writes to a file elsewhere, so either must be a regular file with one name.
WRITTEN_IN_PLACE = frozenset({LOCK_NAME, "run.log"})
#: the folders a command writes in an output folder (a sweep's point folders hold the same)
FOLDER_NAMES = frozenset({"figures", "runs", "attacks", "diagnostics", "cache", "points", "raw", "tensorboard",
                          "mlruns"})
#: the suffixes of every file the product writes: a folder named so sits where a file will go
FILE_SUFFIXES = frozenset({".json", ".jsonl", ".csv", ".html", ".log", ".lock", ".npy", ".npz", ".safetensors",
                           ".png", ".pdf", ".svg", ".yaml", ".md", ".xml", ".tmp"})
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))
_REMOVE = "allowed: files and folders of the kinds the command writes (remove it, or choose another --out)"


def _check_entry(path: Path, status: os.stat_result, option: str) -> None:
    """Refuse an entry the command could not use safely: one that blocks or is no file (a FIFO,
    socket or device: reading or writing it would hang or reach something else), a folder where a
    file is written or a file where a folder is, or a second name of a file written in place."""
    mode = status.st_mode
    for test, kind in _KINDS:
        if test(mode):
            raise _fail(option, f"'{path}' is {kind}, not a file or folder", _REMOVE)
    if stat.S_ISDIR(mode) and path.suffix.lower() in FILE_SUFFIXES:
        raise _fail(option, f"'{path}' is a folder where the command writes a file", _REMOVE)
    if stat.S_ISREG(mode) and path.name in FOLDER_NAMES:
        raise _fail(option, f"'{path}' is a file where the command writes a folder", _REMOVE)
    if stat.S_ISREG(mode) and path.name in WRITTEN_IN_PLACE and status.st_nlink > 1:
        raise _fail(option, f"'{path}' is a hard link (the file has {status.st_nlink} names); the command writes "
                            "this file in place and would change the others", "allowed: a file with one name (remove it)")


def _check_entries(folder: Path, entries: Iterable[str] | None, option: str) -> None:
    """Walk ``folder`` (only ``entries`` of it, when given) without following links: refuse any
    symbolic link that resolves outside it, dangling ones included (a write through it would land
    elsewhere), and any entry :func:`_check_entry` refuses."""
    root = folder.resolve()

    def visit(path: Path) -> bool:
        """Check one entry; True when it is a folder to walk into."""
        status = _lstat(path, option)
        if status is None:
            return False
        if stat.S_ISLNK(status.st_mode):
            target = _resolve_link(path, option)
            if target != root and root not in target.parents:
                raise _fail(option, f"'{path}' is a symbolic link to '{os.readlink(path)}', outside the output folder "
                                    f"'{folder}'", "allowed: files, folders and links that stay inside it (remove the link)")
            return False
        _check_entry(path, status, option)
        return stat.S_ISDIR(status.st_mode)

    tops = [folder / name for name in entries] if entries is not None else [folder]
    for top in tops:
        if top != folder and not visit(top):
            continue
        for directory, folders, files in os.walk(top, followlinks=False):  # links are checked, not followed
            for name in folders + files:
                visit(Path(directory, name))


def check(out: str | os.PathLike | None, option: str = "--out", entries: Iterable[str] | None = None) -> Path:
    """``out`` as a :class:`Path` if a command may write into it (see the module docstring),
    else a one-line :class:`UserInputError` naming ``option``. Nothing is created.

    ``entries``: check only these names inside the folder for links leading out (``report`` writes
    only ``report.html`` and ``figures/`` into a results folder); default: everything in it."""
    text = os.fspath(out) if out is not None else ""
    if not text.strip():
        raise _fail(option, "the path is empty", "allowed: a folder path, e.g. audit-out")
    if "\0" in text:
        raise _fail(option, "the path contains a NUL character")
    _check_length(text, option)
    path = Path(text)
    status = _lstat(path, option)
    if status is None:
        _check_parents(path, option)
        return path
    if stat.S_ISLNK(status.st_mode):
        try:
            path.resolve(strict=True)
        except FileNotFoundError:
            raise _fail(option, f"'{path}' is a symbolic link to '{os.readlink(path)}', which does not exist") from None
        except (RuntimeError, OSError):
            raise _fail(option, f"'{path}' is a symbolic link loop") from None
    if not path.is_dir():
        raise _fail(option, f"'{path}' exists and is not a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise _fail(option, f"the folder '{path}' is not writable")
    _check_entries(path, entries, option)
    if not is_claimed(path):
        _not_in_use(path, option)
    return path


def _not_in_use(folder: Path, option: str) -> None:
    """Refuse a folder another process holds, up front (before the command's work), by trying its
    lock once without creating anything; :func:`claim` takes the lock for good."""
    lock = folder / LOCK_NAME
    if fcntl is None or lock.is_symlink() or not lock.is_file():
        return  # no lock file yet (claim creates it, refusing a link with O_NOFOLLOW)
    try:
        handle = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # unreadable: claim() reports it
    try:
        _lock(handle, folder, option, probe=True)
    finally:
        os.close(handle)  # the probe's lock, if it got one, goes with the descriptor


def check_file(path: str | os.PathLike, option: str) -> Path:
    """A file a command will write (``report --out FILE``): not empty, not an existing folder, not
    under a file; its folder may not exist yet. Nothing is created."""
    text = os.fspath(path)
    if not text.strip():
        raise _fail(option, "the path is empty", "allowed: a file path, e.g. report.html")
    _check_length(text, option)
    file = Path(text)
    status = _lstat(file, option)
    if status is not None and file.is_dir():
        raise _fail(option, f"'{file}' is a folder", "allowed: a file path, e.g. report.html")
    _check_parents(file, option)
    return file


def is_claimed(folder: str | os.PathLike) -> bool:
    """True once this process has claimed ``folder`` or a folder above it."""
    resolved = Path(folder).resolve()
    return any(held == resolved or held in resolved.parents for held in _HELD)


def claimed() -> bool:
    """True when this process holds any output folder (its command's input was accepted)."""
    return bool(_HELD)


def claim(out: str | os.PathLike, option: str = "--out", entries: Iterable[str] | None = None) -> Path:
    """Create ``out`` (once :func:`check` and every other check of the command passed), lock it for
    this process and remove stale temporary files; returns ``out`` as a :class:`Path`.
    ``entries``: as for :func:`check`."""
    folder = Path(out)
    if is_claimed(folder):
        return folder
    check(folder, option, entries)  # again: the folder may have changed while the input was checked
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO put there since check() must not hang the open
        handle = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         0o644)
    except OSError as exc:
        raise _fail(option, f"cannot write in '{folder}' ({exc.strerror or exc})") from None
    try:
        _check_entry(folder / LOCK_NAME, os.fstat(handle), option)  # what was opened, not what a name shows
        _lock(handle, folder, option)
    except BaseException:
        os.close(handle)
        raise
    _HELD[folder.resolve()] = handle
    remove_stale_temporaries(folder)
    return folder


def _lock(handle: int, folder: Path, option: str, probe: bool = False) -> None:
    """Lock ``handle`` (the folder's lock file) for this process, or refuse: another holds it.
    ``probe``: only test (read-only descriptor), do not record our pid."""
    if fcntl is None:  # pragma: no cover - Windows
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 32, 0).decode("ascii", "replace").strip() or "unknown"
        other = " or choose another --out" if option == "--out" else ""
        raise UserInputError(f"{option}: '{folder}' is in use by another dpfl-audit process (pid {holder}); "
                             f"wait for it{other}") from None
    except OSError as exc:  # a file system without locks (some network mounts): go on unlocked
        if probe:
            return
        LOG.warning("%s: cannot lock '%s' (%s); make sure no other dpfl-audit process writes there",
                    option, folder, exc.strerror or exc)
        return
    if probe:
        return
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"{os.getpid()}\n".encode("ascii"), 0)


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of interrupted writes under ``folder`` (only safe while holding
    its lock: no other process is writing there); returns what was removed."""
    removed = []
    for directory, _, files in os.walk(os.fspath(folder), followlinks=False):
        for name in files:
            if STALE_TEMPORARY.fullmatch(name):
                path = Path(directory, name)
                try:
                    path.unlink()
                    removed.append(path)
                except OSError:  # gone already, or not ours to remove: leave it
                    pass
    if removed:
        LOG.info("removed %d temporary file(s) of an interrupted command in %s", len(removed), folder)
    return removed


def release_all() -> None:
    """Release every folder this process claimed (the command line, when a command ends)."""
    while _HELD:
        _, handle = _HELD.popitem()
        os.close(handle)  # closing the last descriptor releases the flock
