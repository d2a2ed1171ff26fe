"""The stage cache: what a rerun of a finished audit takes from ``<out>/cache/`` instead of recomputing.

An attack's results on one experiment (:mod:`audit.attacking`), one experiment's loss-landscape
diagnostics (:mod:`audit.diagnosis`), one experiment's attack records with their verdicts
(:mod:`audit.summary`: the verdicts' power simulations), the figures, the HTML report
(:mod:`audit.pipeline`) and the model's FLOP count of the budget check (:mod:`audit.budget`) are
each kept with the **key** they were computed under: a SHA-256 of everything they read —

* the code: every source and template file of the ``audit``, ``attacks``, ``defenses`` and
  ``reports`` packages and the versions of the libraries the results depend on
  (:mod:`audit.provenance`), hashed once per process (:func:`code_version`);
* the data: the dataset's records as loaded (features, labels, sensitive attributes);
* the runs they read: the bytes of every file of those runs in the run store (an attack: the
  experiment's membership runs, a canary audit also its own runs);
* their parameters: the config's canonical JSON without the other attacks (and, for the
  diagnostics, without any attack), the attack's class, label and resolved parameters;
* for the records, the figures and the report: exactly the values they are made from.

A stage whose key matches its entry is not run again, and its outputs stay as they are: the entry
records the SHA-256 of each file it wrote and of each run it read beyond its key (a run attack's
side runs on other datasets, trained while it ran); one of them changed or missing, or an entry
whose seal does not hold, means the stage runs again and rewrites them. The seal is an HMAC under
a key kept outside the folder (:mod:`audit.core.seal`): an entry edited with a digest recomputed,
or written on another machine, is not trusted. Anything
else — another seed, a changed run file, an edited source file, a new library version — changes
the key, and the stage recomputes. Entries are JSON written atomically (:mod:`audit.core.atomic`),
values in :mod:`audit.core.exact_json` (never a pickle); one entry per stage and experiment,
replaced when its key changes. ``dpfl-audit run --no-cache`` (or deleting ``<out>/cache``)
recomputes everything.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import attacks
import defenses
import reports
from audit import provenance
from audit.core import exact_json, seal
from audit.core.atomic import dumps, file_sha256, write_text
from audit.core.safe_names import inside, is_safe, slug
from audit.core.schema import to_mapping

LOG = logging.getLogger(__name__)

#: bump when the layout of an entry changes (2: sealed with a key kept outside the folder)
CACHE_FORMAT = 2
#: the packages whose files are the code version
_PACKAGES = ("audit", "attacks", "defenses", "reports")
_SKIPPED_FOLDERS = frozenset({"__pycache__"})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str | None:
    """SHA-256 of a file's bytes; None if it cannot be read."""
    try:
        return file_sha256(path)
    except OSError:
        return None


def source_digest(roots: Mapping[str, Path]) -> str:
    """SHA-256 over every file under each root (name → folder): its path and bytes, in sorted
    order; compiled caches (``__pycache__``, ``.pyc``) left out."""
    digest = hashlib.sha256()
    for name, root in sorted(roots.items()):
        files = sorted(p for p in root.rglob("*") if p.is_file() and not _SKIPPED_FOLDERS & set(p.relative_to(root).parts)
                       and p.suffix != ".pyc")
        for path in files:
            digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


@cache
def code_version() -> str:
    """A digest of the installed code: every file of the four packages (:func:`source_digest`) and
    the libraries' versions (:func:`audit.provenance.versions`). Computed once per process."""
    import audit

    roots = {package.__name__: Path(next(iter(package.__path__))) for package in (audit, attacks, defenses, reports)}
    return _sha256(f"{source_digest(roots)}\0{json.dumps(provenance.versions(), sort_keys=True)}".encode())


def key_of(parts: Mapping[str, Any]) -> str:
    """The key of a stage's inputs: SHA-256 of their canonical exact JSON."""
    return _sha256(json.dumps(exact_json.encode(dict(parts)), sort_keys=True, separators=(",", ":"),
                              allow_nan=False).encode())


def config_without(config: Any, *fields: str) -> dict[str, Any]:
    """The config as a plain mapping, without ``fields`` (e.g. the attacks a stage does not read)."""
    mapping = to_mapping(config)
    return {k: v for k, v in mapping.items() if k not in fields}


def _sealed(body: dict, tag: object) -> bool:
    """Whether ``tag`` is the seal of ``body`` (an entry nested too deeply to encode is not)."""
    try:
        return seal.holds(dumps(body, indent=None).encode(), tag)
    except (RecursionError, ValueError, TypeError):
        return False


class StageCache:
    """The entries under ``<out>/cache`` (``enabled=False``: every lookup misses, nothing is written).

    ``lookup(slot, key, allowed)`` gives the value stored under ``slot`` if its key is ``key``, its
    own digest checks and every output file it lists still has the bytes it had; ``store(slot,
    key, value, outputs)`` keeps ``value`` (exact JSON) and the digests of ``outputs``."""

    def __init__(self, out: Path, enabled: bool = True):
        self.out = Path(out)
        self.root = self.out / "cache"
        self.enabled = enabled
        self._code: str | None = None
        self._runs: dict[Path, str] = {}
        self._data: dict[int, tuple[Any, str]] = {}
        self.hits: list[str] = []
        self.misses: list[str] = []

    @property
    def code(self) -> str:
        """:func:`code_version`, looked up when first needed."""
        if self._code is None:
            self._code = code_version()
        return self._code

    def _entry(self, slot: str) -> Path:
        return inside(self.out, self.root / f"{'/'.join(slug(part) for part in slot.split('/'))}.json")

    def run_digest(self, folder: Path) -> str:
        """SHA-256 over the names and bytes of every file of one stored run (once per process)."""
        if folder not in self._runs:
            digest = hashlib.sha256()
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                digest.update(f"{path.relative_to(folder).as_posix()}\0{file_digest(path)}\0".encode())
            self._runs[folder] = digest.hexdigest()
        return self._runs[folder]

    def data_digest(self, task: Any) -> str:
        """SHA-256 of a task's dataset as loaded: every split's features, labels and sensitive
        attributes, and what describes them (once per task and process)."""
        if id(task) not in self._data:
            dataset = task.dataset
            digest = hashlib.sha256(json.dumps(exact_json.encode({
                "name": dataset.name, "classes": dataset.num_classes, "kind": dataset.kind, "source": dataset.source,
                "attributes": dataset.attribute_values, "columns": dataset.attribute_columns, "names": dataset.class_names,
            }), sort_keys=True).encode())
            for split in (dataset.train, dataset.test, task.pool, task.test):
                if split is None:
                    digest.update(b"none")
                    continue
                for name, array in (("features", split.features.cpu().numpy()), ("labels", split.labels.cpu().numpy()),
                                    *sorted(split.attributes.items())):
                    array = np.ascontiguousarray(array)
                    digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
                    digest.update(memoryview(array).cast("B"))
            self._data[id(task)] = (task, digest.hexdigest())  # the task is held: its id stays its own
        return self._data[id(task)][1]

    def runs_digest(self, folders: Iterable[Path]) -> dict[str, str]:
        return {folder.name: self.run_digest(folder) for folder in folders}

    def _unchanged(self, entry: dict, runs: Path | None) -> bool:
        """Whether every output file an entry lists, and every run it says it read, still has its digest."""
        outputs, reads = entry.get("outputs"), entry.get("reads")
        if not (isinstance(outputs, dict) and isinstance(reads, dict)) or (reads and runs is None):
            return False
        try:
            return (all(file_digest(inside(self.out, self.out / name)) == sha for name, sha in outputs.items())
                    and all(is_safe(rid) and self.run_digest(Path(runs) / rid) == sha for rid, sha in reads.items()))
        except (ValueError, OSError):  # a listed path outside the folder: not an entry this code wrote
            return False

    def lookup(self, slot: str, key: str, allowed: Mapping[str, type], runs: Path | None = None) -> Any | None:
        """The value kept under ``slot`` for ``key`` (None where there is none, or it no longer
        holds); ``runs``: the run store's ``runs`` folder, where the runs the entry read are."""
        if not self.enabled:
            return None
        path = self._entry(slot)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deeply
            entry = None
        found = None
        if isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT and entry.get("key") == key:
            body = {"key": key, "outputs": entry.get("outputs"), "reads": entry.get("reads"), "value": entry.get("value")}
            if not _sealed(body, entry.get("seal")):
                LOG.warning("cache entry %s does not carry this machine's seal (edited, or written with another key): "
                            "recomputing it", path)
            elif self._unchanged(entry, runs):
                try:
                    found = exact_json.decode(entry["value"], allowed)
                except exact_json.NotExact as error:
                    LOG.warning("cache entry %s cannot be read (%s): recomputing it", path, error)
        (self.hits if found is not None else self.misses).append(slot)
        return found

    def store(self, slot: str, key: str, value: Any, outputs: Iterable[Path] = (),
              allowed: Mapping[str, type] | None = None, reads: Iterable[Path] = ()) -> bool:
        """Keep ``value`` under ``slot``; False (nothing kept) where it is not exact JSON, or —
        given ``allowed`` — does not read back as itself. ``outputs``: the files it wrote (inside
        the output folder); ``reads``: run folders it read beyond those its key holds (a run
        attack's side runs, trained while it ran), checked like the outputs."""
        if not self.enabled:
            return False
        try:
            encoded = exact_json.encode(value)
            if allowed is not None and exact_json.encode(exact_json.decode(encoded, allowed)) != encoded:
                raise exact_json.NotExact("it does not read back as itself")
        except exact_json.NotExact as error:
            LOG.debug("not cached: %s (%s)", slot, error)
            return False
        digests = {}
        for path in outputs:
            sha = file_digest(path)
            if sha is None:
                return False
            digests[Path(path).relative_to(self.out).as_posix()] = sha
        body = {"key": key, "outputs": digests, "reads": {Path(folder).name: self.run_digest(Path(folder)) for folder in reads},
                "value": encoded}
        entry = {"format": CACHE_FORMAT, **body, "seal": seal.seal(dumps(body, indent=None).encode())}
        write_text(self._entry(slot), dumps(entry, indent=None) + "\n")
        return True
