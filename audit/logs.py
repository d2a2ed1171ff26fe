"""What the pipeline is doing, through the standard :mod:`logging` module.

Library modules log to their own loggers (``logging.getLogger(__name__)``) under the four
packages :data:`PACKAGES`; nothing here prints. The command line decides where records go
(:func:`configure`):

* the console (stderr, through ``tqdm.write`` so progress bars stay intact): warnings by default,
  also INFO with ``-v``, also DEBUG with ``-vv``;
* ``--log-file FILE``: every record from DEBUG up;
* ``run.log`` in the command's output directory: every record from DEBUG up.

Both files are written only once the command's input is accepted: records wait in memory until
the command claims its output folder (:func:`audit.core.output_folder.claim`, which creates and
locks it), or, for ``--log-file``, until the command ends other than refused. A command refused for
bad input — which must write nothing — leaves no ``run.log``, no log file and no directory behind.

Third-party loggers (Ray, Flower, absl) are left as they are.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from audit.core import output_folder
from audit.core.errors import UserInputError
from audit.core.safe_names import inside
from audit.core.visible_text import terminal_text

#: the packages whose loggers the command line configures
PACKAGES = ("audit", "defenses", "attacks", "reports")
FILE_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: the console's level per -v count
LEVELS = {0: logging.WARNING, 1: logging.INFO}

def bars_on(quiet: bool, stream: TextIO | None = None) -> bool:
    """Whether progress bars are drawn on ``stream`` (default stderr): never with --quiet, and only
    on a terminal — in a log file or a CI log every redraw would be one more ``\\r`` line."""
    if quiet:
        return False
    try:
        return bool((sys.stderr if stream is None else stream).isatty())
    except (AttributeError, ValueError, OSError):  # no stream, or a closed one
        return False


def progress_bar(total: int, desc: str, quiet: bool, **options: Any) -> tqdm:
    """A progress bar on stderr, drawn around the console's log records; none with --quiet or when
    stderr is not a terminal (:func:`bars_on`). ``options`` go to tqdm (``leave``, ``unit``, ...).
    Every progress bar of the command line is made here."""
    settings: dict[str, Any] = {"leave": True, "dynamic_ncols": True, "mininterval": 0.5,
                                "bar_format": "{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}"}
    settings.update(options)
    return tqdm(total=total, desc=desc, disable=not bars_on(quiet), file=sys.stderr, **settings)


class ConsoleHandler(logging.Handler):
    """``dpfl-audit: warning: ...`` (``dpfl-audit: ...`` below WARNING) on stderr, written with
    ``tqdm.write`` so that a progress bar being drawn is not broken."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            label = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            tqdm.write(f"dpfl-audit: {label}{terminal_text(record.getMessage())}", file=sys.stderr)
        except Exception:  # logging must never take the command down
            self.handleError(record)


class DeferredFileHandler(logging.Handler):
    """Appends records to the file :attr:`path` once :meth:`ready`; until then they wait in memory
    (bounded), and they are dropped if it never is. The file is opened only to append."""

    LIMIT = 100_000

    def __init__(self, path: str | Path):
        super().__init__(logging.DEBUG)
        self.file = Path(path)
        self.pending: list[str] = []
        self.failed: OSError | None = None
        self.setFormatter(logging.Formatter(FILE_FORMAT))

    @property
    def path(self) -> Path:
        return self.file

    def ready(self) -> bool:
        """The command's input is accepted: it has claimed an output folder."""
        return output_folder.claimed()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.pending.append(terminal_text(self.format(record)))  # one record, one line, no escapes
            del self.pending[:-self.LIMIT]
            self.flush()
        except Exception:
            self.handleError(record)

    def flush(self, accepted: bool = False) -> None:
        """Write what waits, if the input is accepted (``accepted``: the command ended unrefused;
        the file is then created even with no record, as the user asked for it)."""
        if self.failed is None and (self.pending or accepted) and (accepted or self.ready()):
            try:
                with self.open() as file:
                    file.write("\n".join(self.pending) + "\n")
            except OSError as exc:  # a full disk: the console goes on, once told; no traceback per record
                self.failed = exc
                tqdm.write(f"dpfl-audit: warning: cannot write the log '{self.path}' ({exc.strerror or exc}); "
                           "records go to the console only", file=sys.stderr)
            self.pending.clear()

    def open(self) -> TextIO:
        return open(self.path, "a", encoding="utf-8")


class RunLogHandler(DeferredFileHandler):
    """``<folder>/run.log``, written once the command has claimed ``folder`` (created and locked it);
    records of a command that never claims it are dropped."""

    def __init__(self, folder: str | Path):
        super().__init__(Path(folder) / "run.log")
        self.folder = Path(folder)

    @property
    def path(self) -> Path:
        # checked up front (audit.core.output_folder.check); inside() is the last line of defence
        return inside(self.folder, self.folder / "run.log")

    def ready(self) -> bool:
        return output_folder.is_claimed(self.folder)

    def open(self) -> TextIO:
        """Append to ``run.log`` only if it is a regular file with one name (checked on what was
        opened, not on the name): never through a link, a hard link or a FIFO put there since the
        folder was checked (O_NONBLOCK: opening a FIFO must not hang)."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        handle = os.open(self.path, flags, 0o644)
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink > 1:
            os.close(handle)
            raise OSError(errno.EPERM, "not a regular file with one name")
        return os.fdopen(handle, "a", encoding="utf-8")

    def flush(self, accepted: bool = False) -> None:
        super().flush(accepted=False)  # run.log needs its folder claimed, whatever the outcome


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(name) for name in PACKAGES]


@contextmanager
def configure(verbosity: int = 0, log_file: str | Path | None = None, run_folder: str | Path | None = None
              ) -> Iterator[RunLogHandler | None]:
    """Route the packages' records for the duration of one command (see the module docstring);
    the previous configuration is restored afterwards, so tests and notebooks can call it repeatedly."""
    console = ConsoleHandler(LEVELS.get(verbosity, logging.DEBUG))
    handlers: list[logging.Handler] = [console]
    if log_file is not None:  # opened once the input is accepted: refused input creates no file
        handlers.append(DeferredFileHandler(log_file))
    run_log = RunLogHandler(run_folder) if run_folder is not None else None
    if run_log is not None:
        handlers.append(run_log)
    saved = [(logger, logger.level, logger.propagate, list(logger.handlers)) for logger in _loggers()]
    for logger in _loggers():
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # our records go to our handlers only, once
        logger.handlers = list(handlers)
    refused = False
    try:
        yield run_log
    except UserInputError:
        refused = True
        raise
    finally:
        for handler in handlers:
            if isinstance(handler, DeferredFileHandler):
                handler.flush(accepted=not refused)
            else:
                handler.flush()
            handler.close()
        for logger, level, propagate, previous in saved:
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers = previous
