"""Training runs of a plan into the run store: groups of runs trained together where the defense
allows it (one batched computation), each finished run stored with its manifest, and what a
diverged run leaves (nothing stored; where it diverged, returned)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from audit import provenance
from audit.core.lazy_modules import lazy_module
from audit.core.schema import to_mapping
from audit.core.seeding import derive_seed
from audit.planning import Plan, PlannedExperiment
from audit.store import RunStore, run_id
from defenses.blocks.flat import ParamLayout
from defenses.federated.engine import chunk_size
from defenses.federated.training_job import RecordSpec, TrainingDiverged, TrainingJob
from defenses.run_batch import train_together
from reports.document import Diverged

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def _manifest(plan: Plan, experiment: PlannedExperiment, rid: str, run_index: int, job: TrainingJob, outcome, seconds: float,
              members: np.ndarray) -> dict[str, Any]:
    last = outcome.metrics[-1] if outcome.metrics else {}
    return {
        "run_id": rid,
        "experiment": experiment.key,
        "label": experiment.label,
        "run_index": run_index,
        "config_seed": plan.config.seed,
        "run_seed": job.seed,
        "dataset": plan.config.dataset.name,
        "model": plan.config.model.name,
        "defense": {"name": experiment.defense.name, "params": to_mapping(asdict(experiment.defense.params))},
        "training": to_mapping(experiment.training),
        "target_epsilon": experiment.target_epsilon,
        "claim": outcome.claim.as_dict(),
        "membership_unit": plan.membership.unit,
        "members": int(len(members)),
        "client_sizes": [int(len(c)) for c in job.clients],
        "utility": {"test_accuracy": last.get("test_accuracy"), "test_loss": last.get("test_loss")},
        "layout": {"names": list(outcome.layout.names), "shapes": [list(s) for s in outcome.layout.shapes]},
        "server_view": {"observes": experiment.defense.observes},
        "timings": {"train_seconds": seconds},
        "versions": provenance.versions(),
    }


@dataclass(frozen=True)
class PendingRun:
    """A run to train and store: its id and index, its job, its members, extra manifest fields."""

    rid: str
    index: int
    job: TrainingJob
    members: np.ndarray
    extra: dict[str, Any] | None = None


def train_and_store(plan: Plan, store: RunStore, experiment: PlannedExperiment, runs: list[PendingRun]) -> Diverged | None:
    """Train runs of one experiment together (:func:`defenses.run_batch.train_together`: one
    batched computation where the defense allows it) and store each that finished; returns the
    lowest-index run whose training diverged (None when none did). Diverged runs are not stored
    (nothing half-trained looks finished): a rerun trains them again, and they diverge at the same
    round. A run's result does not depend on the runs it is trained with."""
    if not runs:
        return None
    started = time.perf_counter()
    outcomes = train_together(experiment.defense, [run.job for run in runs])
    seconds = (time.perf_counter() - started) / len(runs)  # shared computation: the mean per run
    diverged: list[tuple[PendingRun, TrainingDiverged]] = []
    for run, outcome in zip(runs, outcomes):
        if isinstance(outcome, TrainingDiverged):
            diverged.append((run, outcome))
            continue
        manifest = _manifest(plan, experiment, run.rid, run.index, run.job, outcome, seconds, run.members)
        manifest["timings"]["trained_together"] = len(runs)
        manifest.update(run.extra or {})
        store.save_run(run.rid, manifest, outcome.final_params, run.members, outcome.metrics, outcome.server_view,
                       outcome.global_models)
    if not diverged:
        return None
    run, failure = min(diverged, key=lambda item: item[0].index)
    return Diverged(run=run.index, run_id=run.rid, round=failure.round, what=failure.what)


def divergence_reason(diverged: Diverged, kind: str = "run") -> str:
    """Why the attacks of a diverged experiment (or one canary audit) are skipped."""
    return f"training diverged: {kind} {diverged.run} at round {diverged.round} ({diverged.what})"


def training_job(plan: Plan, experiment: PlannedExperiment, clients: list[np.ndarray], seed: int, pool_x=None, pool_y=None,
                 update_canaries: torch.Tensor | None = None, record: RecordSpec | None = None,
                 canary_rounds: tuple[int, int] | None = None) -> TrainingJob:
    """The training job of one run of ``experiment``: the pool (or one with canary records added),
    the clients' indices into it, the run's seed and what it stores."""
    task, device = plan.task, plan.config.device
    pool_x = task.pool.features if pool_x is None else pool_x
    pool_y = task.pool.labels if pool_y is None else pool_y
    return TrainingJob(task.model_factory, pool_x.to(device), pool_y.to(device), clients, task.test.features.to(device),
                       task.test.labels.to(device), experiment.training, seed=seed, delta=experiment.delta,
                       accounting=plan.accounting, record=record or plan.record, device=device,
                       update_canaries=None if update_canaries is None else update_canaries.to(device),
                       canary_rounds=canary_rounds)


def membership_pending(plan: Plan, store: RunStore, experiment: PlannedExperiment, r: int) -> PendingRun | None:
    """Membership run ``r`` of ``experiment`` as a run to train, or None when the store has it."""
    rid = run_id(plan, experiment, r)
    if store.is_complete(rid):
        return None
    job = training_job(plan, experiment, plan.clients[r], derive_seed(plan.config.seed, "run", r), record=plan.record_for(r))
    return PendingRun(rid, r, job, np.flatnonzero(plan.keep[r]))


def train_membership_runs(plan: Plan, store: RunStore, experiment: PlannedExperiment, runs: list[int]) -> Diverged | None:
    """Membership runs ``runs`` of ``experiment``, trained together unless the store has them; a
    run whose training diverges is not stored. Returns the lowest-index one that diverged."""
    pending = [p for p in (membership_pending(plan, store, experiment, r) for r in runs) if p is not None]
    return train_and_store(plan, store, experiment, pending)


def joint_run_limit(plan: Plan, experiment: PlannedExperiment) -> int:
    """How many runs train together by default: as many as fit the batched computation one
    run's round would use (the engine's chunk of about 2^25 values), at least one."""
    dim = ParamLayout.of(plan.task.model_factory()).dim
    training = experiment.training
    clients = len(plan.clients[0]) if plan.clients else 1
    per_round = max(1.0, training.sampling_rate(clients) * clients)
    return max(1, int(chunk_size(training, dim, experiment.defense.memory_factor(training)) // per_round))


def run_groups(plan: Plan, store: RunStore, experiment: PlannedExperiment, batch_runs: int | None = None,
               parts: int = 1) -> list[list[int]]:
    """The membership runs of ``experiment`` not yet stored, in groups trained together: groups of
    ``batch_runs`` (default :func:`joint_run_limit`), and at least ``parts`` groups when there are
    that many runs (so an executor's workers all get work)."""
    pending = [r for r in range(plan.config.membership.runs) if not store.is_complete(run_id(plan, experiment, r))]
    size = batch_runs or joint_run_limit(plan, experiment)
    size = max(1, min(size, -(-len(pending) // max(1, parts))))
    return [pending[i:i + size] for i in range(0, len(pending), size)]
