"""What an audit will cost, estimated before anything is trained, and the refusal when it is too much.

The estimate counts the training an audit must do — every membership run, canary run and side
run of every experiment: rounds × participating clients × local examples — at the model's
measured FLOPs per example (forward ×3 for forward and backward, counted by
``torch.utils.flop_counter``), and divides by this machine's measured matrix-multiply peak. Real
training of small models reaches a few per cent of that peak (see ``benchmarks/README.md``), and
defense-specific work (SAM's second pass, FL-TOP's reconstruction) is not counted, so the time is
a **lower bound**: an audit refused here could not have finished within the budget.

Memory and disk are estimated from what the runs keep: the recorded global models and uploads
of one run in memory (all runs of an experiment may train together), the arrays a canary audit
holds (every run's canary directions: runs × canaries × parameters), and every run's files on
disk. An estimate above the machine's memory or the free disk space of the output folder is
refused too. None of this is a guess at a limit: the user raises ``--max-hours`` when a long
audit is intended.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from audit.core.errors import UserInputError
from audit.core.vocabulary import AttackKind

if TYPE_CHECKING:
    import torch

    from audit.planning import Plan, PlannedExperiment

#: default of ``--max-hours``: a day of training at the machine's peak is no typo-sized audit
DEFAULT_MAX_HOURS = 24.0
_BYTES = 4  # float32 parameters


@dataclass(frozen=True)
class CostEstimate:
    trainings: int  # federated trainings (membership, canary and side runs)
    examples: float  # training examples processed (forward and backward), all trainings
    flops: float  # training FLOPs, a lower bound
    peak_flops: float  # this machine's measured fp32 matrix-multiply rate (FLOP/s)
    stored_bytes: float  # run files written
    memory_bytes: float  # recorded views held at once, plus the data
    canary_bytes: float = 0.0  # the largest canary audit's own arrays (e.g. canary directions)

    @property
    def hours(self) -> float:
        """Training time at the measured peak: a lower bound on the audit's time."""
        return self.flops / self.peak_flops / 3600

    def describe(self) -> str:
        return (f"{self.trainings} trainings, {self.examples:.3g} training examples, {self.flops:.3g} FLOP "
                f"(≥ {_duration(self.hours * 3600)} at this machine's {self.peak_flops / 1e9:.0f} GFLOP/s peak), "
                f"{_size(self.stored_bytes)} of runs stored")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"


def _size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} TB"


def forward_flops(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs of one example's forward pass (counted by torch; 2 × parameters if it cannot count)."""
    import torch  # here, not at the top: the CLI imports this module for --help, which must stay fast
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters())
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros((1, *input_shape)))
        counted = float(counter.get_total_flops())
    except Exception:  # a user's model the counter cannot trace: fall back to the dense estimate
        counted = 0.0
    return max(counted, 2.0 * params)


#: forward FLOPs counted in this process, by key (:func:`_flops_key`), for :func:`remember_flop_counts`
_COUNTED: dict[str, float] = {}
_FLOPS_SLOT = "budget/forward-flops"


def _flops_key(plan: Plan) -> str:
    from audit.stage_cache import code_version, key_of

    dataset = plan.task.dataset
    return key_of({"stage": "forward-flops", "code": code_version(), "model": plan.config.model,
                   "input_shape": tuple(plan.task.pool.features.shape[1:]), "classes": dataset.num_classes})


def _model_flops(plan: Plan, model: torch.nn.Module, out: str | os.PathLike | None) -> float:
    """:func:`forward_flops` of the plan's model, read from ``<out>/cache`` where an earlier command
    on ``out`` counted it for the same model and code (counting imports torch's compiler, about a
    second: most of a resumed audit's start-up)."""
    if out is None:
        return forward_flops(model, tuple(plan.task.pool.features.shape[1:]))
    from audit.stage_cache import StageCache

    key = _flops_key(plan)
    try:  # reads only: nothing is written before the folder is claimed
        counted = StageCache(Path(out)).lookup(_FLOPS_SLOT, key, {})
    except (OSError, ValueError):  # a folder the claim will refuse, with its own message
        counted = None
    if not isinstance(counted, float):
        counted = _COUNTED[key] = forward_flops(model, tuple(plan.task.pool.features.shape[1:]))
    return counted


def remember_flop_counts(cache) -> None:
    """Keep the FLOP counts this process made in ``cache`` (an :class:`audit.stage_cache.StageCache`
    of the claimed output folder), for the next command's budget check on it."""
    for key, flops in _COUNTED.items():
        cache.store(_FLOPS_SLOT, key, flops)


def matmul_peak(device: str = "cpu", size: int = 1024) -> float:
    """Measured fp32 matrix-multiply rate (FLOP/s): best of a few products on ``device``."""
    import torch
    a = torch.ones(size, size, device=device)
    best = math.inf
    for _ in range(5):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        a @ a
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / max(best, 1e-9)


def _rounds_recorded(selection, total: int) -> int:
    if selection == "all":
        return total
    if selection == "none":
        return 0
    if selection == "final":
        return 1
    return len(set(selection))


def _canary_trainings(plan: Plan, dim: int) -> int:
    return sum(audit.run_count(dim) for audit in plan.canary_audits)


def _run_examples(experiment: PlannedExperiment, records: float, clients: int) -> float:
    """Examples one training of ``experiment`` processes: local training, plus evaluation passes
    (a forward pass, a third of a training example) every ``eval_every`` rounds."""
    training = experiment.training
    per_round = training.round_size(clients) if training.sampling == "fixed" else training.client_rate * clients
    if training.local_unit == "epochs":
        local = training.local_steps * records * per_round / max(clients, 1)
    else:
        local = training.local_steps * training.batch_size * per_round
    evaluations = math.ceil(training.rounds / training.eval_every)
    return training.rounds * local + evaluations * records / 3


def estimate(plan: Plan, out: str | os.PathLike | None = None) -> CostEstimate:
    """The cost of ``plan``'s training, before any of it runs (``out``: an output folder whose cache
    may hold the model's FLOP count)."""
    import numpy as np
    config, task = plan.config, plan.task
    model = task.model_factory()
    params = sum(p.numel() for p in model.parameters())
    per_example = 3.0 * _model_flops(plan, model, out)
    clients = config.partition.clients
    runs = config.membership.runs
    records = float(np.mean([sum(len(c) for c in run) for run in plan.clients])) if plan.clients else 0.0
    others = _canary_trainings(plan, params) + sum(1 for a in plan.attacks if a.kind == AttackKind.RUN)
    examples = stored = held = 0.0
    for experiment in plan.experiments:
        total = experiment.training.rounds
        one = _run_examples(experiment, records, clients)
        examples += (runs + others) * one
        kept = 1 + _rounds_recorded(plan.record.global_rounds, total)
        uploads = _rounds_recorded(plan.record.upload_rounds, total) * (
            clients if plan.record.upload_clients == "all" else len(plan.record.upload_clients))
        per_run = (kept + uploads) * params * _BYTES
        stored += (runs + others) * per_run
        # canary runs that keep every round's global model (all-iterates audits)
        stored += sum(a.run_count(params) for a in plan.canary_audits if a.needs_iterates()) * total * params * _BYTES
        held = max(held, runs * per_run)  # the runs of an experiment may train together
    data = float(task.pool.features.numel() + task.test.features.numel()) * _BYTES
    canaries = max((a.memory_bytes(params) for a in plan.canary_audits), default=0.0)
    return CostEstimate(len(plan.experiments) * (runs + others), examples, examples * per_example,
                    matmul_peak(config.device if config.device.startswith("cuda") else "cpu"), stored, held + data,
                    canaries)


def _free_disk(out: Path) -> float:
    folder = out.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return float(shutil.disk_usage(folder).free)


def _total_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def _parameters(plan: Plan) -> int:
    return sum(p.numel() for p in plan.task.model_factory().parameters())


def check_budget(plan: Plan, out: str | os.PathLike, max_hours: float = DEFAULT_MAX_HOURS,
                 cache: bool = False) -> CostEstimate:
    """The plan's estimate, or a one-line :class:`UserInputError` when it exceeds ``max_hours``
    (0: no limit), the machine's memory or the free disk space under ``out``. ``cache``: read the
    model's FLOP count from ``<out>/cache`` where an earlier command left it (:func:`remember_flop_counts`)."""
    cost = estimate(plan, out if cache else None)
    hint = "lower training.rounds, membership.runs, partition.clients or local work"
    if max_hours > 0 and cost.hours > max_hours:
        raise UserInputError(f"plan: this audit needs at least {cost.hours:.3g} hours of training ({cost.describe()}), "
                             f"more than --max-hours {max_hours:g}; {hint}, or raise --max-hours")
    memory = _total_memory()
    if cost.canary_bytes > memory:
        audit = max(plan.canary_audits, key=lambda a: a.memory_bytes(_parameters(plan)))
        raise UserInputError(f"plan: attack '{audit.label}' needs about {_size(cost.canary_bytes)} of memory for its canaries "
                             f"(runs × canaries × {_parameters(plan)} model parameters), more than this machine's "
                             f"{_size(memory)}; allowed: fewer params.canaries or params.runs, or a smaller model")
    if cost.memory_bytes + cost.canary_bytes > memory:
        raise UserInputError(f"plan: the runs' recorded views need about {_size(cost.memory_bytes)} of memory, more than this "
                             f"machine's {_size(memory)}; record fewer rounds (record.global_rounds, record.upload_rounds) "
                             "or fewer runs")
    free = _free_disk(Path(out))
    if cost.stored_bytes > free:
        raise UserInputError(f"plan: the runs would store about {_size(cost.stored_bytes)}, more than the "
                             f"{_size(free)} free under '{out}'; record fewer rounds or choose another --out")
    return cost
