"""Canary clients: clients whose update is a fixed direction, for auditing client-level DP.

* ``client-canaries`` — Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar 2024, "One-shot
  Empirical Privacy Estimation for Federated Learning" (ICLR 2024, §3, Alg. 1): each canary
  client's update is a random unit direction u_i (scaled to the clip norm). Held-out canaries are
  directions that were never inserted; in high dimension their cosines are ≈ N(0, 1/d).
* ``gradient-canaries`` — a Dirac canary: the update is ±S on a single coordinate (zero
  elsewhere), the white-box canary that puts all of a client's allowed contribution where the
  other clients' updates are smallest.

What the adversary observes (``params.observation``; each is its own result, named by its
``observation``):

* **final model** — the statistic is the cosine between u_i and the final model's change
  w_T − w_0: what anyone holding the released model sees (Andrew et al. §3);
* **all iterates** — the server (and every client) holds each round's global model. The
  statistic is the largest over rounds of the cosine between u_i and the round's model delta
  w_t − w_{t−1} (Andrew et al. §5, "all model deltas"; their code's ``max_model_delta_cosines``):
  a canary that joins a few rounds stands out in each of them, while the final change blends
  it with every other round's noise. Both read the same canary runs.

Both read the aggregate the server forms, which is what a client-level claim on the released
models covers. Canary clients join the rounds like any client
(:func:`defenses.federated.canary_clients.add_canaries`): sampled at the clients' rate — only in
``params.round_range`` when one is given — their update scaled by
:meth:`defenses.audit_hooks.AuditHooks.canary_rows` (the clip S where the defense clips updates; S for
*every* tensor under per-tensor clipping) and privatised like every other upload. Under
per-tensor clipping a canary's direction has the same norm in every tensor, so the scaled
upload stays parallel to it (a Dirac canary then marks one coordinate per tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, Setting
from attacks.canaries.canary_audit import (
    CanaryAudit,
    CanaryContext,
    CanaryInjection,
    CanaryRun,
    canary_result,
    sampling_caveat,
)
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, torch_generator
from audit.core.vocabulary import Observation, Unit

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: ``params.observation`` → the observation set named in the results
OBSERVATIONS = {"final-model": Observation.FINAL_MODEL, "all-iterates": Observation.ALL_ITERATES}


#: most canary clients per run (Andrew et al. 2024 use about a thousand): each holds a direction of
#: the model's size, so a typo (1000000) would otherwise try to allocate canaries × parameters
MAX_CANARY_CLIENTS = 10_000


@dataclass(frozen=True)
class UpdateCanaryParams:
    canaries: int = field(default=100, metadata={
        "min": 4, "max": MAX_CANARY_CLIENTS, "help": "canary clients per run (each inserted with probability ½)"})
    runs: int = field(default=1, metadata={"min": 1, "help": "audit runs (their canaries are pooled)"})
    observation: Literal["both", "final-model", "all-iterates"] = field(default="both", metadata={
        "help": "what the adversary sees: the final model, every round's global model (the server), or both (two results)"})
    round_range: list[int] = field(default_factory=list, metadata={
        "min": 1, "max_length": 2, "help": "[first, last]: the 1-based rounds canary clients join (empty: every round)"})


def _directions_per_tensor(context: CanaryContext) -> list[slice] | None:
    """The tensors the defense clips separately (None: flat clipping): its audit hooks'
    :meth:`~defenses.audit_hooks.AuditHooks.clip_slices`, the defense bound to the audited model's layout."""
    return context.defense.bind(context.layout).audit_hooks().clip_slices()


class UpdateCanaryAudit(CanaryAudit):
    Params = UpdateCanaryParams
    unit = Unit.CLIENT

    def not_applicable(self, defense) -> str | None:
        if not defense.audit_hooks().update_canaries:
            return (f"'{defense.name}' cannot take canary clients (its privatisation needs client data, or clients "
                    "do not upload updates)")
        return None

    @property
    def observations(self) -> list[str]:
        chosen = self.params.observation
        return list(OBSERVATIONS) if chosen == "both" else [chosen]

    def check(self, field_path: str, setting: Setting) -> None:
        chosen, rounds = self.params.round_range, setting.rounds
        if chosen and (len(chosen) != 2 or chosen[0] > chosen[1] or chosen[1] > rounds):
            raise UserInputError(f"{field_path}.params.round_range: {chosen} is not [first, last] with "
                                 f"1 ≤ first ≤ last ≤ {rounds} (the training rounds); allowed: two rounds, or [] for every round")

    def canary_rounds(self) -> tuple[int, int] | None:
        return tuple(self.params.round_range) if self.params.round_range else None  # type: ignore[return-value]

    def needs_iterates(self) -> bool:
        return "all-iterates" in self.observations

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        raise NotImplementedError

    def memory_bytes(self, dim: int) -> float:
        """Every run's [canaries, dim] float32 directions are held until the runs are evaluated, and
        one run's are drawn (and turned into unit vectors for the cosines) in float64."""
        one_run = float(self.params.canaries) * dim
        return self.run_count(dim) * one_run * 4 + 2 * one_run * 8

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        return CanaryInjection(self.inclusion(context, run, self.params.canaries), directions=self.directions(context, run))

    def statistics(self, context: CanaryContext, run: CanaryRun, model: torch.nn.Module) -> np.ndarray:
        """Final model: the cosine of each direction with w_T − w_0."""
        return cosines(run.injection.directions, (run.final - run.initial)[None, :])[:, 0]

    def iterate_statistics(self, run: CanaryRun) -> np.ndarray:
        """All iterates: the largest cosine of each direction with a round's model delta, over the
        rounds the canaries could join (a round without a model change has cosine 0)."""
        if run.iterates is None:
            raise ValueError("all-iterates statistics need the run's global model of every round")
        models = torch.cat([run.initial[None, :], run.iterates])
        first, last = self.canary_rounds() or (1, len(run.iterates))
        deltas = models[first:last + 1] - models[first - 1:last]
        return cosines(run.injection.directions, deltas).max(axis=1)

    def evaluate(self, context: CanaryContext, runs: list[CanaryRun], model: torch.nn.Module) -> list[AttackResult]:
        inserted = np.stack([run.injection.inserted for run in runs])
        results = []
        for observation in self.observations:
            if observation == "final-model":
                statistics = np.stack([self.statistics(context, run, model) for run in runs])
                variant = ""  # the audit's original figure keeps its name
            else:
                statistics = np.stack([self.iterate_statistics(run) for run in runs])
                variant = observation
            result = canary_result(self.label, self.unit, statistics, inserted, context.delta, context.seed,
                                   f"{self.describe(runs)}; observed: {OBSERVATIONS[observation]}{self._rounds_note()}"
                                   f"{_scaling_note(context)}",
                                   unmodelled_power=sampling_caveat(context))
            result.variant, result.observation = variant, OBSERVATIONS[observation]
            results.append(result)
        return results

    def _rounds_note(self) -> str:
        if not self.params.round_range:
            return ""
        first, last = self.params.round_range
        return f"; canaries join rounds {first}–{last} only (the claim covers every round: a smaller ε_LB is expected)"


def _scaling_note(context: CanaryContext) -> str:
    """Where canary updates got their size: a defense that does not declare a clip of each update
    gives them the round's median honest norm (:meth:`~defenses.audit_hooks.AuditHooks.canary_norm`),
    which is not the largest contribution the claim covers — said, with how to change it."""
    if context.defense.bind(context.layout).audit_hooks().clips_updates:
        return ""
    return ("; canary updates were scaled to each round's median honest update norm, not to a clip: the defense "
            "does not declare that a clip bounds each update (a defense whose params.clip does should return "
            "AuditHooks(self, clips_updates=True) from audit_hooks(), so that canaries carry the largest update a "
            "client can make)")


def cosines(directions: torch.Tensor, changes: torch.Tensor) -> np.ndarray:
    """cos(u_i, Δ_t) for directions [m, d] and changes [T, d], in float64: [m, T]."""
    changes = changes.to(torch.float64)
    norms = torch.linalg.vector_norm(changes, dim=1).clamp_min(1e-300)
    units = directions.to(torch.float64)
    units = units / torch.linalg.vector_norm(units, dim=1, keepdim=True).clamp_min(1e-300)
    return (units @ changes.T / norms).numpy()


@ATTACKS.register
class ClientCanaries(UpdateCanaryAudit):
    name = "client-canaries"
    summary = "canary clients with random update directions; cosine with the final model change and with every round's"
    reference = "Andrew et al. 2024, One-shot Empirical Privacy Estimation for Federated Learning"

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        generator = torch_generator(context.seed, "canaries", self.label, run, "directions")
        raw = torch.randn(self.params.canaries, context.layout.dim, generator=generator, dtype=torch.float64)
        tensors = _directions_per_tensor(context)
        if tensors is None:
            return (raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True)).to(torch.float32)
        # per-tensor clipping: a unit direction in every tensor, so the upload (S per tensor) is parallel to it
        for part in tensors:
            raw[:, part] /= torch.linalg.vector_norm(raw[:, part], dim=1, keepdim=True) * len(tensors) ** 0.5
        return raw.to(torch.float32)


@ATTACKS.register
class GradientCanaries(UpdateCanaryAudit):
    name = "gradient-canaries"
    summary = ("white-box Dirac canaries: a canary client's update is ±S on one coordinate (one per tensor under "
               "per-tensor clipping)")
    reference = "Dirac canaries (Nasr et al. 2021/2023; Steinke et al. 2023, §6); the one-run audit of Steinke et al. 2023"

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        rng = numpy_rng(context.seed, "canaries", self.label, run, "coordinates")
        dim, count = context.layout.dim, self.params.canaries
        tensors = _directions_per_tensor(context)
        if tensors is None:
            coordinates = rng.choice(dim, size=count, replace=count > dim)
            signs = rng.choice([-1.0, 1.0], size=count)
            out = torch.zeros(count, dim)
            out[torch.arange(count), torch.as_tensor(coordinates)] = torch.as_tensor(signs, dtype=torch.float32)
            return out
        out = torch.zeros(count, dim)
        for part in tensors:  # one signed coordinate in every tensor, each 1/√L: a unit direction
            size = part.stop - part.start
            coordinates = part.start + rng.choice(size, size=count, replace=count > size)
            signs = rng.choice([-1.0, 1.0], size=count) / len(tensors) ** 0.5
            out[torch.arange(count), torch.as_tensor(coordinates)] = torch.as_tensor(signs, dtype=torch.float32)
        return out
