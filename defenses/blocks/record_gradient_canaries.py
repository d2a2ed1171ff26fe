"""Record-level gradient canaries inside a client's local DP-SGD: per-example gradients that go
through the step's own per-example clipping and noise, read in every step's noisy gradient.

**Design** (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4:
gradient canaries, every iterate observed; Steinke, Nasr, Jagielski 2023, "Privacy Auditing with
One (1) Training Run": independent coins counted in one run). Canary k is a record of one client
(its *holder*) whose per-example gradient is fixed: U/√b·s_{k,i} on each of the b coordinates it
owns (U = amplitude × the clip C, so every clip acts; signs s_{k,i} = ±1; ℓ2 norm U, ℓ1 norm √b·U).
Its coordinates are its own among its holder's canaries, so after clipping it is the only
contribution of a canary on them; b = 1 is a Dirac canary. An *inserted* canary joins each of
its holder's local steps independently with the Poisson rate q the claim accounts — a record of
a Poisson batch — and a held-out one never does (add/remove neighbours).

**One code path.** The rows of the canaries joining a step are handed to the objective's
per-example clipping with the real examples' gradients (:func:`defenses.blocks.dp_sgd.clipped_gradient_sum`),
so the objective's own clip, noise and scaling act on them; the *released* step — the gradient
the trainer applies — is read after the objective returns it, at every canary's coordinates,
joined or not, in units of the clipped sum: reading = g̃·B/C (B the expected batch q·n), less the
real examples' clipped sum there (:meth:`GradientCanaryLog.real_share`, which the adversary of a DP
claim, knowing every other record, can compute). An
objective whose step never passes the canary rows through that clipping (a subclass that
computes its step with code of its own) cannot be audited this way: the log says so
(:attr:`GradientCanaryLog.anomaly`), and the audit reads no statistic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng

if TYPE_CHECKING:
    import torch

    from defenses.blocks.flat import ParamLayout
    from defenses.blocks.mechanisms import Mechanism
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: canary rows per clipping chunk are bounded by this many values (16 MB of float32), as real examples are
CHUNK_VALUES = 1 << 22


@dataclass(frozen=True)
class ClaimedStep:
    """What a record-level claim accounts for one local DP-SGD step: i.i.d. ``mechanism`` noise of
    sensitivity C on every coordinate of the clipped sum (``clip_norm`` per example), each record in
    the batch with Poisson probability ``rate``, ``steps_per_round`` steps in each round a client
    takes part in."""

    mechanism: Mechanism
    rate: float
    clip_norm: str
    steps_per_round: int

    def never_joins(self, rounds: int, participation: float) -> float:
        """The probability that an inserted canary joins none of its holder's steps, the holder taking
        part in each of ``rounds`` rounds with probability ``participation``: such a canary is a coin
        whose insertion no observer can see, and dilutes the audit's power."""
        return (1.0 - participation + participation * (1.0 - self.rate) ** self.steps_per_round) ** rounds

    def shift(self, width: int) -> float:
        """A clipped canary's value on each of its ``width`` coordinates, in units of C: the clip maps
        ±U/√b on b coordinates to ±1/√b (ℓ2) or ±1/b (ℓ1)."""
        return 1.0 / width if self.clip_norm == "l1" else 1.0 / math.sqrt(width)


@dataclass(frozen=True)
class GradientCanaryPlan:
    """The gradient canaries of one run (see the module docstring)."""

    coords: np.ndarray  # int64 [K, b]: the flat coordinates canary k owns (distinct among its holder's canaries)
    signs: np.ndarray  # float64 [K, b]: ±1
    holders: np.ndarray  # int64 [K]: the client (index in the run's client list) whose data holds it
    inserted: np.ndarray  # bool [K]
    amplitude: float  # U / C
    rate: float  # q: the Poisson rate at which an inserted canary joins each of its holder's steps
    seed: int  # keys the participation draws

    def __post_init__(self) -> None:
        k = len(self.holders)
        if self.coords.shape[0] != k or self.signs.shape != self.coords.shape or self.inserted.shape != (k,):
            raise ValueError("coords, signs, holders and inserted must have one row per canary")
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"rate: must lie in (0, 1], got {self.rate!r}")
        for client in np.unique(self.holders):
            owned = self.coords[self.holders == client].ravel()
            if len(np.unique(owned)) != len(owned):
                raise ValueError(f"client {int(client)}'s canaries share a coordinate: each owns its own")

    @property
    def width(self) -> int:
        return int(self.coords.shape[1])


class GradientCanaryLog:
    """One run's gradient canaries at work: which join each step, the rows they add to the
    per-example gradients, and what each released step shows at their coordinates.

    The trainer calls :meth:`begin_step` before a step and :meth:`read` after it; the objective
    calls :meth:`rows` for the rows to clip with its examples. ``round`` is set by the engine."""

    def __init__(self, plan: GradientCanaryPlan, layout: ParamLayout, clip: float):
        self.plan, self.layout, self.clip = plan, layout, float(clip)
        self.round = 0
        self._own = {int(c): np.flatnonzero(plan.holders == c) for c in np.unique(plan.holders)}
        self._columns: dict[tuple[int, int], np.ndarray] = {}  # (round, step) → readings [K, b] (NaN: no step)
        self._step = 0
        self._clients: list[int] = []
        self._joining: dict[int, np.ndarray] = {}  # client → its canaries joining this step (positions in the plan)
        self._live: set[int] = set()  # the clients that take this step
        self._share: np.ndarray | None = None  # the real examples' clipped sum / C this step [C, d]
        self._passed = 0
        self.joined = 0  # canary rows that joined a step, over the run
        #: why the canaries' path through the step could not be exercised (None: it was, every step)
        self.anomaly: str | None = None

    def begin_step(self, step: int, clients: list[int], active: list[bool]) -> None:
        """Draw which inserted canaries of ``clients`` (the rows of this computation; ``active``: those
        that take this step) join local step ``step`` of this round: each independently with
        probability q, from a stream keyed by the run's seed, round, client and step (so chunks of
        clients and the order they are computed in draw the same)."""
        self._step, self._clients, self._passed = step, [int(c) for c in clients], 0
        self._joining, self._live = {}, {c for c, on in zip(self._clients, active) if on}
        self._share: np.ndarray | None = None
        for client in self._live:
            own = self._own.get(client)
            if own is None:
                continue
            draw = numpy_rng(self.plan.seed, "record-gradient-canaries", self.round, client, step).random(len(own))
            self._joining[client] = own[self.plan.inserted[own] & (draw < self.plan.rate)]

    @property
    def pending(self) -> int:
        return sum(len(j) for j in self._joining.values())

    def rows(self, like: torch.Tensor) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """The joining canaries' per-example gradients, stacked per client of this step ([C, R, *shape]
        with mask [C, R], R the most any client has; in chunks of at most :data:`CHUNK_VALUES`)."""
        widest = max((len(j) for j in self._joining.values()), default=0)
        if widest == 0:
            return
        dim, clients = self.layout.dim, len(self._clients)
        per_chunk = max(1, CHUNK_VALUES // max(1, clients * dim))
        value = self.plan.amplitude * self.clip / math.sqrt(self.plan.width)
        for start in range(0, widest, per_chunk):
            stop = min(widest, start + per_chunk)
            flat = torch.zeros(clients, stop - start, dim, dtype=like.dtype, device=like.device)
            mask = torch.zeros(clients, stop - start, dtype=like.dtype, device=like.device)
            for row, client in enumerate(self._clients):
                chosen = self._joining.get(client, np.empty(0, dtype=np.int64))[start:stop]
                if not len(chosen):
                    continue
                slots = np.repeat(np.arange(len(chosen)), self.plan.width)
                flat[row, torch.as_tensor(slots), torch.as_tensor(self.plan.coords[chosen].ravel())] = torch.as_tensor(
                    value * self.plan.signs[chosen].ravel(), dtype=like.dtype, device=like.device)
                mask[row, :len(chosen)] = 1.0
            self._passed += int(mask.sum())
            stacked = self.layout.unflatten_stacked(flat.reshape(clients * (stop - start), dim))
            yield {n: t.reshape(clients, stop - start, *t.shape[1:]) for n, t in stacked.items()}, mask

    def real_share(self, summed: dict[str, torch.Tensor]) -> None:
        """Keep the real examples' clipped sum of this step at the canaries' coordinates: what the
        adversary of a DP claim, who knows every other record, computes from the model it holds —
        taken out of the readings, it leaves the canary's own value and the noise (more power, the
        same validity)."""
        self._share = self.layout.flatten_stacked(summed).detach().to(torch.float64).cpu().numpy() / self.clip

    def read(self, released: dict[str, torch.Tensor], scale_of: Callable[[int], float]) -> None:
        """Record the released step of this step's clients at their canaries' coordinates, in units of
        the clipped sum (``scale_of(client)`` = B/C); where canaries were due to join but did not all
        go through the objective's clipping, say so in :attr:`anomaly` (the first such step)."""
        due = self.pending
        if due and self._passed < due and self.anomaly is None:
            self.anomaly = (f"{due} gradient canaries were due to join local step {self._step + 1} of round {self.round + 1}, "
                            f"{self._passed} went through the objective's per-example clipping: the step is computed by "
                            "code that does not clip them with the real examples (an override of batched_gradient), so "
                            "this path cannot be audited with gradient canaries")
        flat = self.layout.flatten_stacked(released).detach().to(torch.float64).cpu().numpy()
        self.joined += due
        for row, client in enumerate(self._clients):
            own = self._own.get(client)
            if own is None or client not in self._live:
                continue
            column = self._columns.setdefault((self.round, self._step),
                                              np.full(self.plan.coords.shape, np.nan, dtype=np.float32))
            share = self._share[row][self.plan.coords[own]] if self._share is not None else 0.0
            column[own] = flat[row][self.plan.coords[own]] * scale_of(client) - share

    def readings(self) -> np.ndarray:
        """[T, K, b] float32: every step's readings in (round, step) order; NaN where a canary's holder
        took no such step."""
        keys = sorted(self._columns)
        if not keys:
            return np.zeros((0, *self.plan.coords.shape), dtype=np.float32)
        return np.stack([self._columns[k] for k in keys])
