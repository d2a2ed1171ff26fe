"""Every round of a short run of a defense's own code, as the conformance audit drives it:
contributions in, what each observer sees out (docs/how-to/audit-a-mechanism.md, "Does a defense's code release its noise?").

A :class:`ReleaseProbe` wraps a defense bound to a real (small) training job. A trial is a
:class:`Trial`: a seed that keys every random stream of the round, the round, who takes part and
which contribution row is the target's. ``observe`` takes the matrix of contributions — raw
client updates for round-based defenses, one client's per-example gradients for DP-SGD, agents'
votes for private voting — and a trial, and returns, per adversary a claim names, the vector that
observer sees:

* ``released``: the noisy statistic the released model is computed from by post-processing
  (:meth:`defenses.audit_hooks.AuditHooks.release_statistic`; the global step itself by default);
* ``server``: that statistic where the server sees only the aggregate, else the target's upload;
* ``local``: the target's upload (its own contribution row).

Nothing here is a re-implementation: :func:`engine_probe` runs the defense's ``prepare`` and the
rounds of a real run through :class:`FederatedEngine`, and a trial of round t calls the
defense's ``privatize`` and its audit hooks' ``release_statistic`` on the :class:`RoundContext` the engine builds
for round t (its global model, learning rate and round index, the defense as it stood when round
t began). The participants are drawn by the engine's own sampler (Poisson or fixed size,
:func:`defenses.federated.engine.sample_participants`) from the trial's seed, conditioned on the target
taking part: a Poisson sample is the target plus each other client independently with
probability q; a fixed-size sample the target plus m − 1 of the others uniformly. The target
itself is a client drawn uniformly, so it takes every participant position. Two calls with the
same trial and different inputs see the same participants, masks and noise (coupled trials);
different seeds are independent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Observer
from defenses.federated.engine import FederatedEngine, sample_participants
from defenses.federated.round_defense import RoundDefense
from defenses.federated.training_job import (
    NO_STATE,
    DefenseState,
    ReleaseAnomaly,
    RoundContext,
    RunState,
    TrainingConfig,
    TrainingDiverged,
    TrainingJob,
)

if TYPE_CHECKING:
    import torch

else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

Views = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class Trial:
    """One trial: its seed (every random stream of the round), the round (0-based), the target's
    contribution row, and the participating client ids (None: every one of the probe's
    ``contributors`` rows takes part)."""

    seed: int
    round: int = 0
    target: int = 0
    participants: np.ndarray | None = field(default=None, compare=False)


@dataclass
class ReleaseProbe:
    """A defense's rounds as a function from contributions to observations.

    ``bound`` is the norm a contribution is clipped to (the audit's inputs lie far beyond it, so
    every clip acts); ``defense`` is the defense bound for the job and ``state`` what it derived
    from the job's data (its claim for that state is the one checked, for ``training``: the
    settings the probe ran, None for the job's own);
    ``one_coordinate`` says that neighbours differ in one coordinate only (per-weight claims),
    so only concentrated inputs are neighbours; ``contribution`` says in words what a row is.

    ``views(contributions, seed)`` is one step with every one of the ``contributors`` rows taking
    part and the target in row 0. A probe that runs rounds of a run also has ``rounds``,
    ``draw(seed, round)`` (the trial: participants and target row) and ``trial_views``;
    ``participation`` says in words how a trial's participants are drawn.
    """

    dim: int
    contributors: int
    bound: float
    views: Callable[[torch.Tensor, int], Views]
    contribution: str
    defense: RoundDefense
    one_coordinate: bool = False
    rounds: int = 1
    draw: Callable[[int, int], Trial] | None = None
    trial_views: Callable[[torch.Tensor, Trial], Views] | None = None
    training: TrainingConfig | None = None
    participation: str = "one step of the defense's own probe, every contribution in it, the target in row 0"
    state: DefenseState = NO_STATE

    def trial(self, seed: int, round_index: int = 0) -> Trial:
        """Trial ``seed`` of round ``round_index`` (a probe of one step has round 0 only)."""
        if self.draw is None:
            return Trial(seed)
        return self.draw(seed, round_index % self.rounds)

    def rows(self, trial: Trial) -> int:
        """How many contribution rows the trial takes."""
        return self.contributors if trial.participants is None else len(trial.participants)

    def observe(self, contributions: torch.Tensor, trial: Trial) -> Views:
        if self.trial_views is None:
            return self.views(contributions, trial.seed)
        return self.trial_views(contributions, trial)


def describe_participation(training: TrainingConfig, population: int) -> str:
    """In words, how :func:`engine_probe` draws a trial of a run with ``training``'s settings."""
    if training.sampling_rate(population) >= 1:
        how = "every client taking part"
    elif training.sampling == "poisson":
        how = f"Poisson sampling at q = {training.client_rate:g}"
    else:
        how = f"fixed-size sampling, {training.round_size(population)} of {population} clients"
    rounds = "round 1" if training.rounds == 1 else f"rounds 1–{training.rounds}"
    return f"{rounds} of a run, {how}, the target a random participant"


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.float64).reshape(-1).cpu()


@dataclass
class _RoundStart:
    """What a round starts from in the run: the global model, the client learning rate and the
    run's defense state (a copy, so that what a round leaves for the next — UDP-FL's penalty
    target — is as that round began)."""

    global_vector: torch.Tensor
    lr: float
    state: DefenseState


def _started(defense: RoundDefense, job: TrainingJob) -> tuple[FederatedEngine, TrainingJob, RunState]:
    """The engine with the run started; a defense that rejects Poisson sampling below rate 1 (an
    analysis for exactly m clients per round, as DDGauss's) is run with fixed-size sampling at
    the same rate, which is how it would be trained."""
    engine = FederatedEngine(defense, job)
    try:
        return engine, job, engine.start()
    except UserInputError:
        training = job.training
        if training.sampling != "poisson" or training.client_rate >= 1:
            raise
    job = replace(job, training=replace(job.training, sampling="fixed"))
    engine = FederatedEngine(defense, job)
    return engine, job, engine.start()


def engine_probe(defense: RoundDefense, job: TrainingJob) -> ReleaseProbe:
    """A round-based defense's privatise → release path in every round of ``job``'s run.

    The defense is prepared and bound as in training (:meth:`FederatedEngine.start`), and the
    run's rounds are trained as the engine trains them (its sampler, local training, the
    defense's own privatisation and aggregation), so round t's trials see the global model,
    learning rate and run state (:class:`DefenseState`) of round t. Contribution row i is participant i's raw update
    Δ_i; the rows are the trial's participants in ascending id, as the engine orders them.
    """

    engine, job, state = _started(defense, job)
    training, population = job.training, len(job.clients)
    starts: list[_RoundStart] = []
    for t in range(training.rounds):
        starts.append(_RoundStart(state.global_vector.clone(), training.lr * training.lr_decay ** t,
                                  copy.deepcopy(state.defense_state)))
        if t + 1 < training.rounds:  # round t as training runs it, so round t + 1 starts where it leaves off
            ctx, row = engine.begin_round(state, t)
            updates = engine.local_updates(ctx) if ctx is not None else None
            try:
                engine.finish_round(state, t, ctx, updates, row)
            except TrainingDiverged as diverged:  # finite clients, a non-finite release
                raise ReleaseAnomaly(f"its own run released non-finite values in round {diverged.round} ({diverged.what}) "
                                     "from finite client updates") from diverged
    bound_defense = engine.defense

    def draw(seed: int, round_index: int) -> Trial:
        target = int(numpy_rng(seed, "conformance", "target").integers(population))
        sampled = sample_participants(population, training, seed, round_index)
        if target not in sampled:
            if training.sampling == "fixed":  # given the target, the other m − 1 are uniform among the rest
                sampled = np.delete(sampled, int(numpy_rng(seed, "conformance", "drop").integers(len(sampled))))
            sampled = np.sort(np.append(sampled, target))
        return Trial(seed, round_index, int(np.searchsorted(sampled, target)), sampled)

    # the context of the last trial: a trial runs its inputs one after the other
    cached: dict[tuple[int, int, tuple[int, ...]], RoundContext] = {}

    def trial_views(contributions: torch.Tensor, trial: Trial) -> Views:
        participants = trial.participants if trial.participants is not None else np.arange(len(contributions))
        key = (trial.seed, trial.round, tuple(int(c) for c in participants))
        if key not in cached:
            cached.clear()
            start = starts[trial.round]
            ctx = engine.context(trial.round, participants, state.model, state.layout, start.global_vector, start.lr,
                                 start.state)
            cached[key] = replace(ctx, seed=trial.seed)
        ctx = cached[key]
        defense = bound_defense
        uploads, _ = defense.privatize(contributions.to(ctx.global_vector).clone(), ctx)
        if len(uploads) != len(contributions):
            raise ReleaseAnomaly(f"privatize returned {len(uploads)} uploads for {len(contributions)} participants "
                                 "(one upload per participant is what every observer's claim describes)")
        released = _flat(defense.audit_hooks().release_statistic(uploads, ctx))
        upload = _flat(uploads[trial.target])
        return {Observer.RELEASED: released, Observer.SERVER: released if defense.observes == "aggregate" else upload,
                Observer.LOCAL: upload}

    def views(contributions: torch.Tensor, seed: int) -> Views:
        return trial_views(contributions, Trial(seed, 0, 0, np.arange(len(contributions))))

    # the run's clip, as calibrated in prepare() where the defense calibrates it (FL-TOP's S)
    bound = (bound_defense.audit_hooks().clip_bound(state.defense_state)
             or float(getattr(bound_defense.params, "clip", 0.0) or 1.0))
    return ReleaseProbe(state.layout.dim, population, bound, views, "a client's raw model update Δ_i", bound_defense,
                        rounds=training.rounds, draw=draw, trial_views=trial_views, training=training,
                        participation=describe_participation(training, population), state=state.defense_state)
