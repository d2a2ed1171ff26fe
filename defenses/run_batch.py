"""Several independent runs of one defense trained together, as one batched computation.

The reference runs of a membership experiment (LiRA, Shokri) share the model, the defense and
the training settings and differ only in their clients' data and their seed. Trained one after
another, each round of each run is a small batched computation whose fixed costs (Python,
dispatch, vmap set-up) dominate on small models. Trained together, round t of all R runs is
one computation: the participants of every run become rows of one :class:`LocalSchedule`, each
row starting from its own run's global model (``train_batched(..., per_client_start=True)``).
The round's finishing is joined too (:func:`~defenses.federated.engine.finish_rounds`): the
defense privatises all runs' rows in shared computations where it can
(:meth:`Defense.privatize_together`: DP-FedAvg's clipping and noise), the runs' norms, losses and
accuracies reach the host together, one synchronisation checks every run for divergence. Each run
keeps its own :class:`FederatedEngine`, seed streams, participant sampling, aggregation and server
view, and every number of a run is computed as for the run alone — a run alone goes through the
same functions with one run — so a run's result does not depend on which runs it was trained
with (``tests/defenses/federated/test_run_batch.py``).

Runs fall back to training one after another when their defense trains outside the round
engine (its own ``train``), when the engine is the per-client reference loop, or when the local
objective keeps per-run state (:attr:`LocalObjective.joins_runs`: DP-SGD's noise streams,
FL-TOP's masks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from defenses.base import Defense
from defenses.blocks.local_training import LocalSchedule, train_batched
from defenses.federated.engine import FederatedEngine, finish_rounds, optimizer_settings, train_in_chunks
from defenses.federated.training_job import RoundContext, TrainingDiverged, TrainingJob, TrainingOutcome

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: parameter values per shared computation (16 MB of float32), see :func:`joint_local_updates`
CACHE_VALUES = 1 << 22


def joinable(defense: Defense, jobs: list[TrainingJob]) -> bool:
    """Whether these runs may share batched computations as far as their jobs tell: the round
    engine's batched path, the same training settings, model and data pool. (Whether the
    defense's local objective allows it is known once a run has started:
    :attr:`LocalObjective.joins_runs`.)"""
    first = jobs[0]
    return (len(jobs) > 1 and type(defense).train is Defense.train and first.training.engine == "batched"
            and all(job.training == first.training and job.model_factory is first.model_factory
                    and job.pool_x is first.pool_x and job.device == first.device for job in jobs))


def joint_local_updates(engines: list[FederatedEngine], contexts: list[RoundContext | None]) -> list[torch.Tensor | None]:
    """Every run's raw client updates Δ_i = w_i − w of one round, computed in shared batches.

    Rows are ordered by their number of local steps (little padding per chunk) and cut into
    chunks of at most the size one run would use (so the memory per computation is unchanged),
    and of at most :data:`CACHE_VALUES` parameter values unless one run's round alone is larger:
    batched products of many small per-client matrices slow down once the stacked parameters
    outgrow the CPU's caches (on a 2-core machine, the weight-gradient products of 1,280 stacked
    64×128 matrices ran 6× slower per client than those of 320).
    """
    live = [(k, ctx) for k, ctx in enumerate(contexts) if ctx is not None]
    if not live:
        return [None] * len(contexts)
    first = live[0][1]
    job, layout = engines[live[0][0]].job, first.layout
    schedule = LocalSchedule.concat([ctx.schedule for _, ctx in live])
    starts = torch.cat([ctx.global_vector.expand(len(ctx.participants), -1) for _, ctx in live])
    objective = engines[live[0][0]].defense.local_objective()
    objective.begin_round(first)  # joinable objectives keep no per-run state
    opt = optimizer_settings(job.training, first.lr)
    largest_run = max(len(ctx.participants) for _, ctx in live)
    size = min(first.chunk_size, max(largest_run, CACHE_VALUES // layout.dim))

    def train(rows: list[int]) -> torch.Tensor:
        local = train_batched(first.model, objective, layout.unflatten_stacked(starts[rows]), schedule.select(rows),
                              job.pool_x, job.pool_y, opt, per_client_start=True)
        return layout.flatten_stacked(local)

    updates = train_in_chunks(schedule.steps, size, train, starts) - starts
    result: list[torch.Tensor | None] = [None] * len(contexts)
    offset = 0
    for k, ctx in live:
        result[k] = updates[offset:offset + len(ctx.participants)]
        offset += len(ctx.participants)
    return result


def _outcome_or_divergence(train: Callable[[], TrainingOutcome]) -> TrainingOutcome | TrainingDiverged:
    try:
        return train()
    except TrainingDiverged as diverged:
        return diverged


def train_together(defense: Defense, jobs: list[TrainingJob],
                   on_round: Callable[[int, int], None] | None = None) -> list[TrainingOutcome | TrainingDiverged]:
    """Train the runs ``jobs`` of ``defense``; outcomes in the order of ``jobs``. A run whose
    training diverges stops at that round and gives its :class:`TrainingDiverged` in place of an
    outcome; the other runs train on, unaffected (every row of a shared computation is its own)."""
    if not joinable(defense, jobs):
        return [_outcome_or_divergence(lambda job=job: defense.train(job)) for job in jobs]
    engines = [FederatedEngine(defense, job) for job in jobs]
    engines[0].start()  # prepares the defense, whose local objective says whether it joins runs
    if not engines[0].defense.local_objective().joins_runs:
        # One run at a time, each started just before it trains: start() prepares the shared
        # defense object for that run's clients (their sizes differ between runs).
        return [_outcome_or_divergence(lambda engine=engine: engine.train_from(engine.start())) for engine in engines]
    states = [engine.start() for engine in engines]
    total = jobs[0].training.rounds
    stopped: dict[int, TrainingDiverged] = {}
    for t in range(total):
        live = [k for k in range(len(jobs)) if k not in stopped]
        if not live:
            break
        begun = [engines[k].begin_round(states[k], t) for k in live]
        updates = joint_local_updates([engines[k] for k in live], [ctx for ctx, _ in begun])
        finished = finish_rounds([engines[k] for k in live], [states[k] for k in live], t, [ctx for ctx, _ in begun], updates,
                                 [row for _, row in begun])
        stopped.update((k, diverged) for k, diverged in zip(live, finished) if diverged is not None)
        if on_round is not None:
            on_round(t + 1, total)
    return [stopped[k] if k in stopped else engine.outcome(state)
            for k, (engine, state) in enumerate(zip(engines, states))]
