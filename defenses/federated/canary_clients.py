"""Canary clients joining a round (Andrew et al. 2024, canary clients): which join, and what they
upload before privatisation.

Update canaries (:attr:`TrainingJob.update_canaries`) are dense rows appended after the real
participants, privatised with them; Dirac canary clients (:attr:`TrainingJob.dirac_canaries`)
join as structured rows whose passage through the defense's code
:mod:`defenses.federated.dirac_passage` measures. Both join each round like clients: Poisson at the
clients' sampling rate, from a stream of their own. Gradient canaries (:attr:`TrainingJob.gradient_canaries`)
are records, not clients: the run's log of them (:func:`gradient_canary_log`) rides with its local steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng
from defenses.blocks.dirac_rows import DiracRows
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalObjective
from defenses.blocks.record_gradient_canaries import GradientCanaryLog
from defenses.federated.round_defense import RoundDefense
from defenses.federated.training_job import RoundContext, RunState, TrainingJob

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def sample_canaries(count: int, rate: float, seed: int, round_index: int) -> np.ndarray:
    """Canary clients joining round ``round_index`` (Poisson at the clients' sampling rate)."""
    return np.flatnonzero(numpy_rng(seed, "round", round_index, "canaries").random(count) < rate)


def canary_clients(ctx: RoundContext) -> np.ndarray:
    """Which participants of ``ctx`` are canary clients (a boolean per participant):
    :func:`add_canaries` gives them the ids N, N+1, ... after the N real clients."""
    return np.asarray(ctx.participants) >= ctx.num_clients


def add_canaries(defense: RoundDefense, job: TrainingJob, updates: torch.Tensor, ctx: RoundContext,
                 row: dict[str, Any]) -> tuple[torch.Tensor, RoundContext]:
    """Append the canary clients of this round (ids N, N+1, ...) after the real participants.

    A canary uploads its direction scaled by the defense's audit hooks
    (:meth:`~defenses.audit_hooks.AuditHooks.canary_rows`, to
    the clip S, per tensor under per-tensor clipping), only in the job's ``canary_rounds``, and
    then goes through the same privatisation and aggregation as every client (a defense that
    must tell them apart, as DDGauss, whose noise shares are set for its real clients, uses
    :func:`canary_clients`). Canaries join only rounds with at least one real participant
    (the hooks need a round to exist).
    """
    directions = job.update_canaries
    chosen = sample_canaries(len(directions), job.training.sampling_rate(len(job.clients)), job.seed, ctx.round)
    first, last = job.canary_rounds or (1, job.training.rounds)
    if not first <= ctx.round + 1 <= last:  # the audit targets other rounds
        chosen = chosen[:0]
    row["canary_participants"] = int(len(chosen))
    if not len(chosen):
        return updates, ctx
    honest = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64)
    # clients without data (a zero-out design's held-out ones) upload nothing: a canary is
    # scaled like the clients that trained, not like the empty ones
    trained = torch.as_tensor(np.asarray(ctx.sizes) > 0, device=honest.device)
    rows = defense.audit_hooks().canary_rows(directions[torch.as_tensor(chosen, device=directions.device)].to(updates),
                                             honest[trained] if bool(trained.any()) else honest, ctx.state)
    empty = np.array([], dtype=np.int64)
    ctx = replace(ctx, participants=np.concatenate([ctx.participants, len(job.clients) + chosen]),
                  sizes=np.concatenate([ctx.sizes, np.full(len(chosen), max(1, int(np.median(ctx.sizes))))]),
                  client_data=list(ctx.client_data) + [empty] * len(chosen))
    return torch.cat([updates, rows]), ctx


def dirac_round(job: TrainingJob, ctx: RoundContext, row: dict[str, Any]) -> tuple[DiracRows, np.ndarray]:
    """This round's Dirac canary clients (:attr:`TrainingJob.dirac_canaries`): each joins
    like a client — Poisson at the clients' sampling rate, from its own stream. Returns the
    joined canaries' rows and their positions."""
    canaries = job.dirac_canaries
    assert canaries is not None
    chosen = sample_canaries(len(canaries), job.training.sampling_rate(len(job.clients)), job.seed,
                             ctx.round)
    row["canary_participants"] = int(len(chosen))
    return canaries.subset(torch.as_tensor(chosen, dtype=torch.long)), chosen


def gradient_canary_log(defense: RoundDefense, job: TrainingJob, layout: ParamLayout) -> GradientCanaryLog:
    """The run's gradient canaries, refused (one line) where its local step does not clip per example
    in the batched trainer — the only path that hands them to the objective's clipping."""
    plan = job.gradient_canaries
    assert plan is not None
    objective = defense.local_objective()
    if type(objective).released_scale is LocalObjective.released_scale or not hasattr(objective, "clip"):
        raise ValueError(f"{defense.name} cannot take gradient canaries: its local step ({type(objective).__name__}) "
                         "is no per-example-clipping DP-SGD step")
    if job.training.engine != "batched":
        raise ValueError("gradient canaries go through the batched trainer only; set training.engine: batched")
    if len(plan.holders) and int(plan.holders.max()) >= len(job.clients):
        raise ValueError(f"gradient canaries: holder {int(plan.holders.max())} beyond the run's {len(job.clients)} clients")
    if plan.coords.size and int(plan.coords.max()) >= layout.dim:
        raise ValueError(f"gradient canaries: coordinate {int(plan.coords.max())} beyond the model's {layout.dim}")
    return GradientCanaryLog(plan, layout, float(objective.clip))


def canary_views(state: RunState) -> dict[str, torch.Tensor]:
    """What a run's canaries leave in its recorded server view: each Dirac canary's upload and the
    noise in it, whether its coordinate was released, the real clients' share on it; every released
    step at each gradient canary's coordinates."""
    views: dict[str, torch.Tensor] = {}
    if state.dirac_uploads is not None:  # what a server that sees each upload reads of each canary
        views["dirac/uploads"] = state.dirac_uploads
    if state.dirac_noise is not None:  # the noise in each reading: the mechanism's, for the conformance tests
        views["dirac/noise"] = state.dirac_noise
    if state.dirac_exercised is not None and not bool(state.dirac_exercised.all()):
        views["dirac/exercised"] = state.dirac_exercised.to(torch.uint8)
    if state.gradient_canaries is not None:  # every step's release at each gradient canary's coordinates
        views["gradient/readings"] = torch.from_numpy(state.gradient_canaries.readings())
        views["gradient/joined"] = torch.tensor([state.gradient_canaries.joined], dtype=torch.int64)
    if state.dirac_drift is not None and not any("dirac_drift" in row for row in state.metrics):
        # the real clients' noise-free share of each step on each canary's coordinate (0 in a skipped round)
        views["dirac/drift"] = torch.nan_to_num(state.dirac_drift, nan=0.0)
    return views
