"""Where an audit's membership runs train: in this process (``local``) or in a pool of worker
processes (``process``).

The membership runs of an experiment differ only in their data and their seed
(``derive_seed(seed, "run", r)``), and every random draw of a run comes from its own seed
streams, so a run trains to the same bytes wherever it trains; the run store writes each run
atomically, so workers never see each other's half-written runs. The pool uses the ``spawn``
start method (safe with torch's threads); each worker rebuilds the plan once from the config —
planning is deterministic — gives torch one thread (the workers already fill the cores) and
trains the runs it is sent. Canary-audit runs and the attacks stay in the parent process.

``ray`` (optional: the ``distributed`` extra, ``pip install 'ray>=2.9'``) sends the same jobs to Ray tasks, on
a local Ray instance or a cluster (``--ray-address``). No file system is assumed to be shared:
each task trains its job into a temporary store on its node and returns the runs' files as bytes,
and this process writes them into its own store, each run atomically. A worker process plans
once per config (the plan is cached, keyed by a hash of the config) and gives torch one thread.
Both pools train a job through :func:`train_job`, so they train the same runs to the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from audit.config import config_to_yaml
from audit.core.errors import UserInputError
from audit.core.extras import install_line
from audit.core.lazy_modules import lazy_module
from audit.logs import progress_bar
from audit.planning import Plan, plan_audit
from audit.run_training import run_groups, train_membership_runs
from audit.store import RunStore, run_id

if TYPE_CHECKING:
    import torch

    from audit.config import AuditConfig
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

EXECUTORS = ("local", "process", "ray")
RAY_MISSING = "--executor ray needs Ray, which is not installed; install it with: {install}"

_WORKER: dict = {}  # the plan and store of this worker process (process executor)
_RAY_PLAN: dict = {}  # {config hash: plan} of this Ray worker process, the latest config only


Job = tuple[int, tuple[int, ...]]  # (experiment index, membership runs trained together)


def pending_jobs(plan: Plan, store: RunStore, workers: int, batch_runs: int | None = None) -> list[Job]:
    """The membership runs not yet in the store, as jobs: groups of runs of one experiment trained
    together (:func:`audit.run_training.run_groups`), split so that ``workers`` workers all get work.
    A run's result does not depend on its group, so any split trains the same bytes."""
    return [(e, tuple(group)) for e, experiment in enumerate(plan.experiments)
            for group in run_groups(plan, store, experiment, batch_runs, parts=workers)]


def _start_worker(config: AuditConfig, root: str) -> None:
    torch.set_num_threads(1)
    _WORKER["plan"], _WORKER["store"] = plan_audit(config), RunStore(root)


def train_job(plan: Plan, store: RunStore, job: Job) -> list[str]:
    """Train the membership runs of one job into ``store`` (those not in it yet); returns their ids.

    The one code path of every pool: a job is what :func:`pending_jobs` lists."""
    index, runs = job
    experiment = plan.experiments[index]
    train_membership_runs(plan, store, experiment, list(runs))  # a diverged run is found again by the stage that follows
    return [rid for rid in (run_id(plan, experiment, r) for r in runs) if store.is_complete(rid)]


def _train(job: Job) -> list[str]:
    return train_job(_WORKER["plan"], _WORKER["store"], job)


def train_in_processes(plan: Plan, store: RunStore, workers: int | None = None, quiet: bool = False,
                       batch_runs: int | None = None) -> int:
    """Train the pending membership runs in ``workers`` processes (default: the CPU count); returns how many."""
    workers = max(1, workers or os.cpu_count() or 1)
    jobs = pending_jobs(plan, store, workers, batch_runs)
    if not jobs:
        return 0
    runs = sum(len(job[1]) for job in jobs)
    workers = min(workers, len(jobs))
    context = multiprocessing.get_context("spawn")
    bar = progress_bar(runs, f"train {runs} runs in {workers} processes", quiet, leave=False)
    with context.Pool(workers, initializer=_start_worker, initargs=(plan.config, str(Path(store.root)))) as pool:
        for ids in pool.imap_unordered(_train, jobs):
            bar.update(len(ids))
    bar.close()
    return runs


# --------------------------------------------------------------------------- ray


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserInputError(RAY_MISSING.format(install=install_line("distributed"))) from None
    return ray


def config_key(config: AuditConfig) -> str:
    """A hash of everything the plan is built from: the resolved config."""
    return hashlib.sha256(config_to_yaml(config).encode("utf-8")).hexdigest()


def _worker_plan(config: AuditConfig, key: str) -> Plan:
    """The plan of ``config``, built once per worker process (planning is deterministic but not free)."""
    if key not in _RAY_PLAN:
        _RAY_PLAN.clear()  # one audit at a time: keep only the latest plan
        _RAY_PLAN[key] = plan_audit(config)
    return _RAY_PLAN[key]


def _train_remotely(config: AuditConfig, key: str, job: Job) -> dict[str, dict[str, bytes]]:
    """Body of the Ray task: train ``job`` into a temporary store on this node and return its runs,
    ``{run id: {path inside the run directory: bytes}}``."""
    torch.set_num_threads(1)  # the other tasks fill the other cores
    plan = _worker_plan(config, key)
    with tempfile.TemporaryDirectory(prefix="dpfl-audit-ray-") as scratch:
        store = RunStore(scratch)
        return {rid: store.run_files(rid) for rid in train_job(plan, store, job)}


def store_runs(store: RunStore, runs: dict[str, dict[str, bytes]]) -> list[str]:
    """Write runs returned by a remote task into ``store``, each atomically (:meth:`RunStore.save_files`),
    after checking that every path stays inside its run's directory; returns their ids."""
    for rid, files in runs.items():
        names = [PurePosixPath(name) for name in files]
        if "/" in rid or rid.startswith(".") or rid in ("", "..") or any(
                not name.parts or name.is_absolute() or ".." in name.parts for name in names):
            raise ValueError(f"a remote task returned a file outside a run directory: run {rid!r}, files {sorted(files)}")
    for rid, files in runs.items():
        if not store.is_complete(rid):
            store.save_files(rid, files)
    return sorted(runs)


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nobody answers on: Ray itself retries
    an unreachable cluster for minutes, printing a warning every few seconds."""
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: Ray resolves them
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UserInputError(f"--ray-address: no Ray cluster answers at {address}: {exc}") from None


@contextmanager
def ray_session(address: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """Ray, initialised: joined to the cluster at ``address``, or a local instance of ``workers``
    CPUs (default: the CPU count). Shuts down only what it started; an already initialised Ray is
    used as it is."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
             "configure_logging": True}
    if address:
        _check_reachable(address)
    try:
        with warnings.catch_warnings():  # Ray's FutureWarning about accelerator env vars is not for our users
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray(\.|$)")
            if address:
                ray.init(address=address, **quiet)
            else:
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, **quiet)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise UserInputError(f"--executor ray: cannot start or reach {where}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()  # a local instance stops; a cluster only loses this driver


def train_in_ray(plan: Plan, store: RunStore, workers: int | None = None, quiet: bool = False,
                 address: str | None = None, batch_runs: int | None = None) -> int:
    """Train the pending membership runs as Ray tasks (one CPU each), at most ``workers`` at a time
    (default: the cluster's CPUs), and store them here; returns how many runs were trained."""
    check_executor_plan("ray", plan)
    if not pending_jobs(plan, store, 1, batch_runs):
        return 0
    with ray_session(address, workers) as ray:
        task = ray.remote(num_cpus=1)(_train_remotely)
        config = ray.put(plan.config)
        key = config_key(plan.config)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        jobs = pending_jobs(plan, store, workers or cpus, batch_runs)
        runs = sum(len(job[1]) for job in jobs)
        window = max(1, min(workers or cpus, len(jobs)))
        bar = progress_bar(runs, f"train {runs} runs as Ray tasks, {window} at a time", quiet, leave=False)
        queue, running = list(reversed(jobs)), []
        try:
            while queue or running:
                while queue and len(running) < window:
                    running.append(task.remote(config, key, queue.pop()))
                done, running = ray.wait(running, num_returns=1)
                for ref in done:
                    bar.update(len(store_runs(store, ray.get(ref))))
        finally:
            for ref in running:
                ray.cancel(ref)
            bar.close()
    return runs


# --------------------------------------------------------------------------- checks


def check_executor(executor: str, workers: int | None, ray_address: str | None = None,
                   batch_runs: int | None = None) -> None:
    """Check the executor options before any work; for ``ray``, that Ray can be imported."""
    if executor not in EXECUTORS:
        raise UserInputError(f"--executor: unknown executor '{executor}'; allowed: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise UserInputError(f"--workers: must be >= 1, got {workers}")
    if batch_runs is not None and batch_runs < 1:
        raise UserInputError(f"--batch-runs: must be >= 1, got {batch_runs}")
    if ray_address is not None and executor != "ray":
        raise UserInputError(f"--ray-address: only with --executor ray, not --executor {executor}")
    if executor == "ray":
        _import_ray()


def check_executor_plan(executor: str, plan: Plan) -> None:
    """Checks that need the plan (run before the output directory exists)."""
    if executor == "ray" and plan.config.device != "cpu":  # Ray hides the GPUs from tasks that do not reserve one
        raise UserInputError(f"--executor ray trains on the CPU only; got device '{plan.config.device}' "
                             "(use --device cpu, or --executor local or process)")
