"""Where an audit's membership runs train: in this process (``local``) or in a pool of worker
processes (``process``).

The membership runs of an experiment differ only in their data and their seed
(``derive_seed(seed, "run", r)``), and every random draw of a run comes from its own seed
streams, so a run trains to the same bytes wherever it trains; the run store writes each run
atomically, so workers never see each other's half-written runs. The pool uses the ``spawn``
start method (safe with torch's threads); each worker rebuilds the plan once from the config —
planning is deterministic — gives torch one thread (the workers already fill the cores) and
trains the runs it is sent. Canary-audit runs and the attacks stay in the parent process.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

if TYPE_CHECKING:
    from audit.config import AuditConfig
    from audit.pipeline import Plan
    from audit.store import RunStore

EXECUTORS = ("local", "process")

_WORKER: dict = {}  # the plan and store of this worker process


def pending_runs(plan: Plan, store: RunStore) -> list[tuple[int, int]]:
    """(experiment index, run index) of every membership run not yet in the store."""
    from audit.pipeline import run_id

    return [(e, r) for e, experiment in enumerate(plan.experiments) for r in range(plan.config.membership.runs)
            if not store.is_complete(run_id(plan, experiment, r))]


def _start_worker(config: AuditConfig, root: str) -> None:
    import torch

    from audit.pipeline import plan_audit
    from audit.store import RunStore

    torch.set_num_threads(1)
    _WORKER["plan"], _WORKER["store"] = plan_audit(config), RunStore(root)


def _train(job: tuple[int, int]) -> str:
    from audit.pipeline import train_membership_run

    experiment, run = job
    return train_membership_run(_WORKER["plan"], _WORKER["store"], _WORKER["plan"].experiments[experiment], run)


def train_in_processes(plan: Plan, store: RunStore, workers: int | None = None, quiet: bool = False) -> int:
    """Train the pending membership runs in ``workers`` processes (default: the CPU count); returns how many."""
    jobs = pending_runs(plan, store)
    if not jobs:
        return 0
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    context = multiprocessing.get_context("spawn")
    bar = tqdm(total=len(jobs), desc=f"train {len(jobs)} runs in {workers} processes", disable=quiet, leave=False)
    with context.Pool(workers, initializer=_start_worker, initargs=(plan.config, str(Path(store.root)))) as pool:
        for _ in pool.imap_unordered(_train, jobs):
            bar.update(1)
    bar.close()
    return len(jobs)


def check_executor(executor: str, workers: int | None) -> None:
    from audit.errors import UserInputError

    if executor not in EXECUTORS:
        raise UserInputError(f"--executor: unknown executor '{executor}'; allowed: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise UserInputError(f"--workers: must be >= 1, got {workers}")
