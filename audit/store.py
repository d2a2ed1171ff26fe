"""The run store: one directory per trained run, written atomically, read without unpickling.

Layout of ``<out>/runs/<run_id>/``:

* ``manifest.json`` — config, seeds, privacy claim, utility, package versions, timings; written
  last, so its presence marks a finished run;
* ``model.safetensors`` — the final global model (parameter name → tensor);
* ``membership.npy`` — the pool indices this run trained on (``np.load(allow_pickle=False)``);
* ``metrics.jsonl`` — one JSON object per round;
* ``server_view.safetensors`` / ``global_models.safetensors`` — recorded uploads and global
  models (flat vectors; the parameter layout is in the manifest), when any were recorded;
* ``seal.json`` — every other file's SHA-256 under an HMAC with a key kept outside the folder
  (:mod:`audit.store_seal`): a run is reused, and read, only while its seal holds.

A run is built in a temporary sibling directory and renamed into place in one step, so a
killed run leaves nothing that looks finished and a rerun of the same config resumes by
skipping every run whose directory exists.

A run's id (:func:`run_id`, :func:`canary_run_id`) is its folder's name: the experiment key, the
run index and a hash of everything that determines the run (with :data:`STORE_FORMAT`), so a
rerun, or another audit that needs the same run, finds it stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError, safe_open

from audit import store_seal
from audit.core.atomic import dumps
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.safe_names import is_safe, slug
from audit.core.schema import to_mapping

if TYPE_CHECKING:
    import torch
    from safetensors import torch as safetensors_torch

    from attacks.canaries.canary_audit import CanaryAudit
    from audit.planning import Plan, PlannedExperiment
else:  # imported when first used (audit.core.lazy_modules)
    safetensors_torch = lazy_module("safetensors.torch")
    torch = lazy_module("torch")

# bump when a change makes stored runs incompatible (or trains them differently: 3 = Philox batch streams, 4 = fully keyed noise
# streams, claims per observer, 5 = membership designs matching the claim's relation, zero-out canary clients, 6 = DDGauss canary
# clients without a noise share, LDP-FL zero-centred ranges that hold the tensor, FL-TOP family claims zero-out, 7 = Dirac
# canaries mirrored under replace-one claims, each reading's noise recorded, 8 = runs sealed)
STORE_FORMAT = 8


def _reason(exc: BaseException) -> str:
    """Why a stored file could not be read, in a few words (one line, cut short)."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, IsADirectoryError):
        return "a folder, not a file"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    if isinstance(exc, EOFError):
        return "empty or truncated"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


class RunStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.runs = self.root / "runs"

    def path(self, run_id: str) -> Path:
        # run ids are built from slugs (audit.core.safe_names); one that is not would step out of runs/
        if not is_safe(run_id, max_length=200):
            raise ValueError(f"run id '{run_id}' is not a safe folder name")
        return self.runs / run_id

    def is_complete(self, run_id: str) -> bool:
        """Whether run ``run_id`` is stored, finished (its manifest is there) and holds its seal
        (:mod:`audit.store_seal`); a finished run whose seal does not hold is refused with one line."""
        if not (self.path(run_id) / "manifest.json").is_file():
            return False
        self._check_seal(run_id)
        return True

    def _check_seal(self, run_id: str) -> None:
        found = store_seal.problem(self.path(run_id), run_id)
        if found is not None:
            raise self.corrupted(run_id, *found)

    def _commit(self, run_id: str, write: Callable[[Path], None]) -> Path:
        """Build run ``run_id`` with ``write(staging directory)`` (manifest last) and rename it into
        place in one step; if another process stored the run first, keep theirs."""
        self.runs.mkdir(parents=True, exist_ok=True)
        staging = self.runs / f".staging-{run_id}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            write(staging)
            store_seal.write(staging, run_id)  # after every other file: what the run holds, sealed
            target = self.path(run_id)
            try:
                os.replace(staging, target)  # atomic on one file system; fails if target exists
            except OSError:
                if not self.is_complete(run_id):
                    if target.is_dir():  # a run folder without its manifest: not left by this code
                        raise self.corrupted(run_id, "manifest.json", "missing") from None
                    raise
                shutil.rmtree(staging, ignore_errors=True)  # another process finished it first
            return target
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def save_run(
        self,
        run_id: str,
        manifest: dict[str, Any],
        final_params: dict[str, torch.Tensor],
        membership: np.ndarray,
        metrics: list[dict[str, Any]],
        server_view: dict[str, torch.Tensor] | None = None,
        global_models: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        def write(staging: Path) -> None:
            safetensors_torch.save_file({k: v.detach().cpu().contiguous() for k, v in final_params.items()},
                                        str(staging / "model.safetensors"))
            np.save(staging / "membership.npy", np.asarray(membership, dtype=np.int64), allow_pickle=False)
            with open(staging / "metrics.jsonl", "w", encoding="utf-8") as out:
                for row in metrics:
                    out.write(dumps(row, indent=None) + "\n")
            for name, tensors in (("server_view", server_view), ("global_models", global_models)):
                if tensors:
                    safetensors_torch.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                                                str(staging / f"{name}.safetensors"))
            with open(staging / "manifest.json", "w", encoding="utf-8") as out:
                out.write(dumps(manifest) + "\n")

        return self._commit(run_id, write)

    def run_files(self, run_id: str) -> dict[str, bytes]:
        """A stored run's files, ``{path inside the run directory: bytes}`` (to ship it elsewhere)."""
        root = self.path(run_id)
        return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}

    def save_files(self, run_id: str, files: dict[str, bytes]) -> Path:
        """Store a run given as :meth:`run_files` returned it, atomically like :meth:`save_run`
        (the manifest, which marks a finished run, written last)."""
        if "manifest.json" not in files:
            raise ValueError(f"run {run_id}: no manifest.json among its files")

        def write(staging: Path) -> None:
            # manifest last; a seal from elsewhere (another node's key) is replaced by ours
            for name in sorted((n for n in files if n != store_seal.SEAL_NAME), key=lambda n: n == "manifest.json"):
                path = staging / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(files[name])

        return self._commit(run_id, write)

    def corrupted(self, run_id: str, file: str, reason: str) -> UserInputError:
        """The one-line error for a stored run whose ``file`` cannot be read: name the folder and how
        to discard it (a rerun of the same command retrains exactly the runs that are missing)."""
        return UserInputError(f"stored run '{self.path(run_id)}' is corrupted ({file}: {reason}); "
                              "delete that folder and rerun the same command to retrain it")

    @contextmanager
    def _reading(self, run_id: str, file: str) -> Iterator[None]:
        """Turn a failure to read or parse ``file`` of stored run ``run_id`` into :meth:`corrupted`.
        A file missing from a run folder that does not exist at all is a caller's error, re-raised."""
        folder = self.path(run_id)
        if folder.is_dir():
            self._check_seal(run_id)  # once per process while the files stay as they are
        try:
            yield
        except FileNotFoundError as exc:
            if not folder.is_dir():
                raise
            raise self.corrupted(run_id, file, _reason(exc)) from None
        except PermissionError as exc:
            raise UserInputError(f"stored run '{folder}' cannot be read ({file}: {exc.strerror or exc}); "
                                 "check the folder's permissions") from None
        except UserInputError:
            raise
        except (SafetensorError, ValueError, EOFError, OSError, RecursionError) as exc:  # ValueError: JSON, Unicode, numpy
            raise self.corrupted(run_id, file, _reason(exc)) from None

    def load_manifest(self, run_id: str) -> dict[str, Any]:
        with self._reading(run_id, "manifest.json"), open(self.path(run_id) / "manifest.json", encoding="utf-8") as handle:
            manifest = json.load(handle)
        if not isinstance(manifest, dict):
            raise self.corrupted(run_id, "manifest.json", "not a JSON object")
        return manifest

    def load_params(self, run_id: str, device: str = "cpu") -> dict[str, torch.Tensor]:
        with self._reading(run_id, "model.safetensors"):
            return safetensors_torch.load_file(str(self.path(run_id) / "model.safetensors"), device=device)

    def load_membership(self, run_id: str) -> np.ndarray:
        with self._reading(run_id, "membership.npy"):
            membership = np.load(self.path(run_id) / "membership.npy", allow_pickle=False)
        if membership.ndim != 1 or not np.issubdtype(membership.dtype, np.integer):
            raise self.corrupted(run_id, "membership.npy", f"not a list of indices (a {membership.dtype} array "
                                                           f"of shape {membership.shape})")
        return membership

    def load_metrics(self, run_id: str) -> list[dict[str, Any]]:
        rows = []
        with self._reading(run_id, "metrics.jsonl"), open(self.path(run_id) / "metrics.jsonl", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise self.corrupted(run_id, "metrics.jsonl",
                                         f"line {number} is not valid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise self.corrupted(run_id, "metrics.jsonl", f"line {number} is not a JSON object")
                rows.append(row)
        return rows

    def load_tensors(self, run_id: str, name: str) -> dict[str, torch.Tensor]:
        path = self.path(run_id) / f"{name}.safetensors"
        with self._reading(run_id, path.name):
            return safetensors_torch.load_file(str(path)) if path.is_file() else {}

    def load_tensor(self, run_id: str, name: str, key: str, device: str = "cpu") -> torch.Tensor:
        """One tensor of a stored file, read without loading the others (e.g. one round's global model)."""
        with self._reading(run_id, f"{name}.safetensors"), \
                safe_open(str(self.path(run_id) / f"{name}.safetensors"), framework="pt", device=device) as handle:
            return handle.get_tensor(key)

    def clean_staging(self) -> None:
        """Remove directories left by killed runs."""
        if self.runs.is_dir():
            for leftover in self.runs.glob(".staging-*"):
                shutil.rmtree(leftover, ignore_errors=True)


def run_id(plan: Plan, experiment: PlannedExperiment, run_index: int) -> str:
    """A stable id: the experiment key, the run index and a hash of everything that determines the run."""
    config = plan.config
    fingerprint = {
        "format": STORE_FORMAT,
        "seed": config.seed,
        "dataset": to_mapping(config.dataset),
        "model": to_mapping(config.model),
        "partition": to_mapping(config.partition),
        "membership": to_mapping(config.membership),
        "training": to_mapping(experiment.training),
        "defense": experiment.defense.name or type(experiment.defense).__name__,
        "params": to_mapping(asdict(experiment.defense.params)),
        "delta": experiment.delta,
        "accounting": asdict(plan.accounting),
        "record": asdict(plan.record_for(run_index)),
        "run": run_index,
        "keep": hashlib.sha256(np.packbits(plan.keep[run_index]).tobytes()).hexdigest(),
        "clients": clients_digest(plan.clients[run_index]),
        "device": config.device,
    }
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-r{run_index:03d}-{digest}"


def clients_digest(clients: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for part in clients:
        digest.update(np.asarray(part, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()


def canary_run_id(plan: Plan, experiment: PlannedExperiment, audit: CanaryAudit, index: int) -> str:
    """Canary run ``index`` of ``audit``: the id of the membership run whose clients it trains on,
    the audit and what its runs store, hashed."""
    base = run_id(plan, experiment, plan.canary_base_run(index))
    fingerprint = {"base": base, "audit": audit.name, "label": audit.label, "params": to_mapping(asdict(audit.params)),
                   "index": index, "record": asdict(plan.canary_record(audit))}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-{slug(audit.label)}-c{index:03d}-{digest}"


def side_run_id(plan: Plan, experiment: PlannedExperiment, dataset: str, root: str | None,
                clients: list[np.ndarray]) -> tuple[str, dict[str, Any]]:
    """A side run's id (the experiment's defense trained on another dataset, for attacks its own data
    cannot serve) and the fingerprint it hashes, which its manifest keeps."""
    fingerprint = {"base": run_id(plan, experiment, 0), "dataset": dataset, "root": root, "clients": clients_digest(clients)}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-side-{dataset}-{digest}", fingerprint
