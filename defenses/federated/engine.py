"""The federated round loop shared by every round-based defense.

One round (McMahan et al. 2017, FedAvg; 2018, DP-FedAvg Alg. 1):

1. sample participants P_t — Poisson (each client independently with probability q) or a
   fixed-size sample without replacement;
2. every participant trains locally from the global model w (SGD, by epochs or iterations),
   giving an update Δ_i = w_i − w; clients run batched (:func:`train_batched`) or one by one;
3. the defense privatises the updates (:meth:`Defense.privatize`: clip, noise, ...), which is
   what the clients upload;
4. the defense aggregates the uploads (:meth:`Defense.aggregate`, a mean by default) and the
   server steps w ← w + η_g · aggregate;
5. metrics: pre-clip update norms, clip fraction, test loss/accuracy, ε so far; and the
   server view (uploads and global models of the rounds and clients chosen for recording);
6. divergence: a non-finite global model (or a non-finite loss in an evaluated round) stops
   the run with :class:`TrainingDiverged` naming the round (a result the pipeline records).

Randomness: the participants of round t come from stream ``(seed, "round", t, "sampling")``,
client i's batches from the keyed Philox stream ``(seed, "round", t, "client", i, "batches")``
(:func:`batch_stream`); defenses draw noise
from :meth:`RoundContext.client_generator` / :meth:`RoundContext.server_generator`.

What a run is given, what the hooks see each round and what a run returns (:class:`TrainingJob`,
:class:`RoundContext`, :class:`TrainingOutcome`, ...) are in :mod:`defenses.federated.training_job`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, philox_rng, seed_torch
from defenses.blocks.flat import ParamLayout, parameters_of
from defenses.blocks.local_training import TRAINERS, LocalSchedule, OptimizerSettings
from defenses.blocks.record_gradient_canaries import GradientCanaryLog
from defenses.federated.canary_clients import add_canaries, canary_views, dirac_round, gradient_canary_log
from defenses.federated.dirac_passage import DiracPassage, dirac_passage, real_share, released_step
from defenses.federated.evaluation import evaluate_many
from defenses.federated.round_defense import RoundDefense
from defenses.federated.round_metrics import divergences, norm_summaries
from defenses.federated.training_job import (
    NO_STATE,
    DefenseState,
    ReleaseAnomaly,
    RoundContext,
    RunState,
    TrainingConfig,
    TrainingDiverged,
    TrainingJob,
    TrainingOutcome,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


def mean_update(uploads: torch.Tensor, ctx: RoundContext, denominator: float | None = None) -> torch.Tensor:
    """Uniform mean (1/|P_t| or 1/denominator) or client-size-weighted mean of the uploads."""
    if ctx.training.aggregation == "weighted":
        weights = torch.as_tensor(ctx.sizes / ctx.sizes.sum(), dtype=uploads.dtype, device=uploads.device)
        return weights @ uploads
    return uploads.sum(0) / (denominator if denominator is not None else uploads.shape[0])


def sample_participants(num_clients: int, training: TrainingConfig, seed: int, round_index: int) -> np.ndarray:
    rng = numpy_rng(seed, "round", round_index, "sampling")
    if training.sampling == "poisson":
        return np.flatnonzero(rng.random(num_clients) < training.client_rate)
    return np.sort(rng.choice(num_clients, size=training.round_size(num_clients), replace=False))


def batch_stream(seed: int, round_index: int, client: int) -> np.random.Generator:
    """The stream of client ``client``'s mini-batch order in round ``round_index`` (a keyed Philox:
    the engine creates one per participant and round, so creation cost matters)."""
    return philox_rng(seed, "round", round_index, "client", int(client), "batches")


def initial_vector(model_factory: Callable[[], nn.Module], seed: int) -> tuple[nn.Module, ParamLayout, torch.Tensor]:
    """The initial global model of a run with this seed (the same draw :meth:`FederatedEngine.run` makes)."""
    seed_torch(seed, "torch")  # model init and dropout
    model = model_factory()
    layout = ParamLayout.of(model)
    return model, layout, layout.flatten(parameters_of(model))


def chunk_size(training: TrainingConfig, dim: int, factor: float = 1.0) -> int:
    """Clients per batched computation: the configured value, or about 2^25 parameter-sized values in
    all; ``factor`` is how many parameter-sized tensors one client needs (e.g. per-example gradients)."""
    return training.client_chunk or max(1, int((1 << 25) // max(1.0, dim * factor)))


def train_in_chunks(steps: list[int], size: int, train: Callable[[list[int]], torch.Tensor],
                    start: torch.Tensor) -> torch.Tensor:
    """The trained flat parameters [rows, d] of clients with ``steps`` local steps each, computed by
    ``train(rows)`` in chunks of at most ``size`` rows; ``start`` [rows, d] holds where each row
    starts. Rows with similar step counts share a chunk, so little padding is computed; one chunk
    in row order needs no reassembly. A row with no local step (a client holding no records, as
    the clients a membership run leaves out) is its start: it is not computed at all — in a chunk
    beside training rows it would be carried through every step for nothing."""
    order = [i for i in sorted(range(len(steps)), key=lambda i: -steps[i]) if steps[i] > 0]
    if len(order) == len(steps) and len(order) <= size and order == sorted(order):
        return train(order)
    out = start.clone()
    for chunk in (order[i:i + size] for i in range(0, len(order), size)):
        out[torch.as_tensor(chunk, device=out.device)] = train(chunk)
    return out


def prepared_state(defense: RoundDefense, state: DefenseState | None) -> DefenseState:
    """What ``defense.prepare`` returned, checked: a :class:`DefenseState` (None, from a ``prepare``
    that derives nothing, is the empty one); anything else is refused by name, because the engine
    must be able to keep it per run as a value."""
    if state is None:
        return NO_STATE
    if not isinstance(state, DefenseState):
        raise TypeError(f"defense '{defense.name or type(defense).__name__}': prepare() returned a "
                        f"{type(state).__name__}; it must return a DefenseState (a frozen dataclass of what the run derives)")
    return state


def optimizer_settings(training: TrainingConfig, lr: float) -> OptimizerSettings:
    return OptimizerSettings(lr, training.momentum, training.weight_decay, training.optimizer)


class FederatedEngine:
    """Runs a round-based defense on a :class:`TrainingJob`."""

    def __init__(self, defense: RoundDefense, job: TrainingJob):
        self.defense = defense
        self.job = job

    def schedule(self, participants: np.ndarray, round_index: int) -> LocalSchedule:
        job = self.job
        batches = [self.defense.local_batches(len(job.clients[c]), job.training, batch_stream(job.seed, round_index, c))
                   for c in participants]
        return LocalSchedule.build(batches, [job.clients[c] for c in participants], participants)

    def context(self, round_index: int, participants: np.ndarray, model: nn.Module, layout: ParamLayout,
                global_vector: torch.Tensor, lr: float, state: DefenseState = NO_STATE) -> RoundContext:
        """Everything the defense's hooks may use in round ``round_index``, ``state`` the run's own
        (what the defense's :meth:`prepare` derived from this run's data)."""
        job = self.job
        sizes = np.array([len(job.clients[c]) for c in participants])
        return RoundContext(round_index, participants, sizes, len(job.clients), job.training, job.seed, job.device,
                            model=model, layout=layout, global_vector=global_vector,
                            client_data=[job.clients[c] for c in participants], pool_x=job.pool_x, pool_y=job.pool_y,
                            schedule=self.schedule(participants, round_index), lr=lr,
                            chunk_size=chunk_size(job.training, layout.dim, self.defense.memory_factor(job.training)),
                            state=state)

    def local_updates(self, ctx: RoundContext, canaries: GradientCanaryLog | None = None) -> torch.Tensor:
        """Train the participants locally (with the run's gradient canaries, when it has them); returns
        their raw updates Δ_i = w_i − w as a C×d matrix."""
        job, training, layout = self.job, self.job.training, ctx.layout
        trainer = TRAINERS[training.engine]
        opt = optimizer_settings(training, ctx.lr)
        objective = self.defense.local_objective()
        objective.begin_round(ctx)
        if canaries is not None:
            canaries.round = ctx.round
            objective.gradient_canaries = canaries
        global_params = {n: v.clone() for n, v in ctx.global_params().items()}

        def train(rows: list[int]) -> torch.Tensor:
            schedule = ctx.schedule.select(rows)
            return layout.flatten_stacked(trainer(ctx.model, objective, global_params, schedule, job.pool_x, job.pool_y, opt))

        starts = ctx.global_vector.expand(len(ctx.schedule.steps), -1)
        return train_in_chunks(ctx.schedule.steps, ctx.chunk_size, train, starts) - ctx.global_vector

    def start(self) -> RunState:
        """Initialise the run: the initial global model, the bound defense, what the defense derives
        from this run's data (its state, kept here for this run only), its ε trajectory."""
        job, training = self.job, self.job.training
        model, layout, _ = initial_vector(job.model_factory, job.seed)
        model = model.to(job.device)
        model.train()
        defense = self.defense = self.defense if self.defense.layout is not None else self.defense.bind(layout)
        global_vector = layout.flatten(parameters_of(model))
        prepared = prepared_state(defense, defense.prepare(job, model, {n: v.clone() for n, v in
                                                                       layout.unflatten(global_vector).items()}))
        members = torch.as_tensor(np.concatenate(job.clients) if job.clients else np.array([], dtype=np.int64),
                                  device=job.pool_x.device)
        defense.validate(training, len(job.clients))
        trajectory = defense.epsilon_trajectory(training, len(job.clients), job.delta, job.accounting, prepared)
        test_x, test_y = defense.test_split(job, prepared)
        state = RunState(model, layout, global_vector, prepared, members, trajectory, test_x, test_y)
        if len(members):  # the training-set metrics' records, gathered once
            state.member_x, state.member_y = job.pool_x[members], job.pool_y[members]
        if job.dirac_canaries is not None:
            reason = defense.audit_hooks().dirac_canaries_refused(training)
            if reason is not None:
                raise ValueError(f"{defense.name} cannot take Dirac canary clients: {reason}")
            state.dirac_uploads = torch.full((training.rounds, len(job.dirac_canaries)), math.nan)
            state.dirac_noise = torch.full((training.rounds, len(job.dirac_canaries)), math.nan)
            state.dirac_drift = torch.full((training.rounds, len(job.dirac_canaries)), math.nan, dtype=torch.float64)
            state.dirac_exercised = torch.zeros(len(job.dirac_canaries), dtype=torch.bool)
        if job.gradient_canaries is not None:
            state.gradient_canaries = gradient_canary_log(defense, job, layout)
        return state

    def begin_round(self, state: RunState, t: int) -> tuple[RoundContext | None, dict[str, Any]]:
        """Round ``t``'s participants and context (None when the Poisson sample is empty)."""
        job, training = self.job, self.job.training
        participants = sample_participants(len(job.clients), training, job.seed, t)
        lr = training.lr * training.lr_decay ** t
        row: dict[str, Any] = {"round": t + 1, "participants": int(len(participants)), "lr": lr}
        if not len(participants):
            return None, row
        return self.context(t, participants, state.model, state.layout, state.global_vector, lr, state.defense_state), row

    def finish_round(self, state: RunState, t: int, ctx: RoundContext | None, updates: torch.Tensor | None,
                     row: dict[str, Any]) -> None:
        """Privatise and aggregate the round's raw updates, step the global model, record metrics
        (:func:`finish_rounds` for this run alone: a run's numbers are the same alone or together)."""
        diverged = finish_rounds([self], [state], t, [ctx], [updates], [row])[0]
        if diverged is not None:
            raise diverged

    def with_canaries(self, state: RunState, t: int, ctx: RoundContext, updates: torch.Tensor,
                      row: dict[str, Any]) -> tuple[torch.Tensor, RoundContext, DiracPassage | None]:
        """The round's update canaries joined to its updates and context, and what its Dirac
        canary clients contribute, measured through the defense's own privatisation
        (:func:`~defenses.federated.dirac_passage.dirac_passage`; None without Dirac canaries)."""
        job = self.job
        if job.update_canaries is not None:
            updates, ctx = add_canaries(self.defense, job, updates, ctx, row)
        if job.dirac_canaries is None:
            return updates, ctx, None
        rows, joined = dirac_round(job, ctx, row)
        assert state.dirac_uploads is not None and state.dirac_noise is not None and state.dirac_exercised is not None
        hooks = self.defense.audit_hooks()
        # a canary whose coordinate the round does not release takes no part: not probed, no reading
        released = hooks.released_coordinates(ctx)
        if released is not None:
            taking = released.to(rows.coords.device)[rows.coords]
            rows, joined = rows.subset(torch.nonzero(taking).flatten()), joined[taking.cpu().numpy()]
        passage = dirac_passage(self.defense, ctx, updates, rows, alike=hooks.dirac_canaries_alike(),
                                origin=hooks.dirac_origin(ctx))
        if passage.anomaly is not None:
            row["dirac_path"] = passage.anomaly
        row["dirac_inserted"] = int((rows.values != 0).sum())
        row["dirac_dropped"] = passage.dropped
        joined_at = torch.as_tensor(joined, dtype=torch.long)
        state.dirac_uploads[t, joined_at] = passage.readings.float().cpu()
        if passage.noise is not None:
            state.dirac_noise[t, joined_at] = passage.noise.float().cpu()
        state.dirac_exercised[joined_at] = True
        return updates, ctx, passage

    def release(self, state: RunState, t: int, updates: torch.Tensor, uploads: torch.Tensor, ctx: RoundContext,
                passage: DiracPassage | None, row: dict[str, Any]) -> torch.Tensor:
        """The round's released step: the defense's ``aggregate`` of the uploads, carrying the
        Dirac canaries' signal where they take part (:func:`~defenses.federated.dirac_passage.released_step`,
        which also gives the divisor the audit standardises the step with), and the real clients'
        noise-free share of it on the canaries' coordinates (:func:`~defenses.federated.dirac_passage.real_share`)."""
        if passage is None:
            return self.defense.aggregate(uploads, ctx)
        canaries = self.job.dirac_canaries
        assert canaries is not None and state.dirac_drift is not None
        plain = self.defense.aggregate(uploads, ctx)  # the step without the canaries, computed once for both
        step, divisor, anomaly = released_step(self.defense, uploads, ctx, passage, canaries.coords, plain)
        row["divisor"] = divisor
        if anomaly is not None and "dirac_path" not in row:
            row["dirac_path"] = anomaly
        share = real_share(self.defense, updates, plain, ctx)
        if share is None:
            row["dirac_drift"] = "the real clients' share depends on the noise draw: left in the readings"
        else:
            state.dirac_drift[t] = share[canaries.coords.to(share.device)].cpu()
        return step

    def record_uploads(self, state: RunState, round_number: int, ctx: RoundContext, uploads: torch.Tensor,
                       step: torch.Tensor) -> None:
        """The server view of this round, if the job records it: uploads by client (or shuffled) and the step."""
        job, defense = self.job, self.defense
        if not job.record.wants_uploads(round_number, job.training.rounds):
            return
        participants = ctx.participants
        if defense.observes == "uploads":
            for i, client in enumerate(participants):
                if job.record.wants_client(int(client)):
                    state.server_view[f"round_{round_number:04d}/client_{int(client):05d}"] = uploads[i].clone()
        elif defense.observes == "shuffled":  # the anonymous channel: uploads in random order, no identities
            order = torch.randperm(len(participants), generator=ctx.server_generator("shuffle"))
            for i, row in enumerate(order.tolist()):
                state.server_view[f"round_{round_number:04d}/upload_{i:05d}"] = uploads[row].clone()
        state.server_view[f"round_{round_number:04d}/aggregate"] = step.clone()

    def outcome(self, state: RunState) -> TrainingOutcome:
        job, training = self.job, self.job.training
        # Dirac canary clients add signal only and count in no |P_t|: the run's claim is the canary-free one
        claim = self.defense.privacy_claim(training, len(job.clients), training.rounds, job.delta, job.accounting,
                                           state.defense_state)
        final = {n: v.clone() for n, v in state.layout.unflatten(state.global_vector).items()}
        state.server_view.update(canary_views(state))
        return TrainingOutcome(final, state.layout, state.metrics, claim, state.server_view, state.global_models)

    def run(self, on_round: Callable[[int, int, dict[str, Any]], None] | None = None) -> TrainingOutcome:
        return self.train_from(self.start(), on_round)

    def train_from(self, state: RunState, on_round: Callable[[int, int, dict[str, Any]], None] | None = None
                   ) -> TrainingOutcome:
        """Every round of a started run, then its outcome; raises :class:`TrainingDiverged` at the
        first round that leaves a non-finite global model or loss."""
        total = self.job.training.rounds
        for t in range(total):
            ctx, row = self.begin_round(state, t)
            updates = self.local_updates(ctx, state.gradient_canaries) if ctx is not None else None
            if state.gradient_canaries is not None and state.gradient_canaries.anomaly:
                row["gradient_path"] = state.gradient_canaries.anomaly
            self.finish_round(state, t, ctx, updates, row)
            if on_round is not None:
                on_round(t + 1, total, row)
        return self.outcome(state)


def finish_rounds(engines: list[FederatedEngine], states: list[RunState], t: int, contexts: list[RoundContext | None],
                  updates: list[torch.Tensor | None], rows: list[dict[str, Any]]) -> list[TrainingDiverged | None]:
    """Finish round ``t`` of several runs of one defense with the same training settings (runs
    trained together, :mod:`defenses.run_batch`; a run alone is the case of one): privatise
    (:meth:`Defense.privatize_together`), aggregate, step each global model, record the metrics
    and the server view, evaluate, check for divergence. Stages that cross runs share their
    computations and host synchronisations; every run's numbers are computed as for the run alone.
    Returns, per run, the :class:`TrainingDiverged` that stops it at this round, or None.
    """
    training = engines[0].job.training
    round_number, total = t + 1, training.rounds
    live = [k for k, ctx in enumerate(contexts) if ctx is not None]
    joined: dict[int, tuple[torch.Tensor, RoundContext, Any]] = {}
    for k in live:
        ctx, delta = contexts[k], updates[k]
        assert ctx is not None and delta is not None
        joined[k] = engines[k].with_canaries(states[k], t, ctx, delta, rows[k])
    runs = [(engines[k].defense, joined[k][0], joined[k][1]) for k in live]
    privatized = engines[live[0]].defense.privatize_together(runs) if live else []
    norms, steps = [], {}
    for k, (uploads, diagnostics) in zip(live, privatized):
        delta, ctx, passage = joined[k]
        steps[k] = engines[k].release(states[k], t, delta, uploads, ctx, passage, rows[k])
        if steps[k].shape != states[k].global_vector.shape:
            raise ReleaseAnomaly(f"defense '{engines[k].defense.name}': aggregate returned a step of shape "
                                 f"{tuple(steps[k].shape)} for a model of {states[k].layout.dim} parameters")
        states[k].global_vector = states[k].global_vector + training.server_lr * steps[k]
        # the norms of what is clipped (after any pre-clip sparsification), else of the raw updates
        norm = diagnostics.pop("clip_input_norms", None)
        norms.append(torch.linalg.vector_norm(delta, dim=1, dtype=torch.float64) if norm is None else norm)
    for k, (summary, listed), (uploads, diagnostics) in zip(live, norm_summaries(norms), privatized):
        rows[k].update(summary)
        rows[k]["update_norms"] = listed
        rows[k].update(diagnostics)
        ctx = contexts[k]
        assert ctx is not None
        engines[k].record_uploads(states[k], round_number, ctx, uploads, steps[k])
    for k, (state, row) in enumerate(zip(states, rows)):
        if contexts[k] is None:
            row["skipped"] = True  # an empty Poisson round still counts in the accounting
        if state.trajectory is not None:
            row["epsilon"] = state.trajectory[t]
    if round_number % training.eval_every == 0 or round_number == total:
        _evaluate(states, rows)
    for engine, state in zip(engines, states):
        if engine.job.record.wants_global(round_number, total):
            state.global_models[f"round_{round_number:04d}"] = state.global_vector.clone()
    for state, row in zip(states, rows):
        state.metrics.append(row)
    # an empty evaluation set gives a NaN loss that is no divergence
    losses = [(("train_loss",) if len(state.members) else ()) +
              (("test_loss",) if state.test_y is not None and len(state.test_y) else ()) for state in states]
    out: list[TrainingDiverged | None] = []
    for state, row, what in zip(states, rows, divergences([s.global_vector for s in states], rows, losses)):
        if what is not None:  # stop here: the remaining rounds would only carry NaN
            row["diverged"] = what
        out.append(None if what is None else TrainingDiverged(round_number, what, state.metrics))
    return out


def _evaluate(states: list[RunState], rows: list[dict[str, Any]]) -> None:
    """Test and training-set loss and accuracy of every run's global model (one host transfer)."""
    items, where = [], []
    for k, state in enumerate(states):
        params = state.layout.unflatten(state.global_vector)
        items.append((state.model, params, state.test_x, state.test_y))
        where.append((k, "test"))
        if len(state.members):
            items.append((state.model, params, state.member_x, state.member_y))
            where.append((k, "train"))
    for (k, split), (loss, accuracy) in zip(where, evaluate_many(items)):
        rows[k][f"{split}_loss"], rows[k][f"{split}_accuracy"] = loss, accuracy
