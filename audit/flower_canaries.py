"""Canary clients for a Flower deployment (Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar 2024,
"One-shot Empirical Privacy Estimation for Federated Learning", §3 Alg. 1): the auditor's own nodes,
each inserted with probability ½, and the client-side Flower *Mod* that makes an inserted canary
upload the received model plus a fixed random direction (clipped by Flower to exactly S·u_i) and a
held-out one a tiny independent update (the replace-one design of :mod:`audit.flower_audit`).

The Mod runs in every client process (a Ray actor per CPU in simulation): this module imports only
numpy, Flower and the seeded streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flwr.app import Context, Message, MessageType
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat

from audit.core.errors import UserInputError
from audit.core.seeding import numpy_rng


@dataclass(frozen=True)
class CanaryClients:
    """Which nodes are canary clients and what they upload.

    ``ids`` are the values of ``node_config[id_key]`` (Flower's simulation sets ``partition-id``
    0..N−1) of the canary nodes; canary i is ``ids[i]``. ``clipping_norm`` is Flower's S; a canary
    uploads ``scale``·S·u_i, which the clip scales to S·u_i (hence ``scale`` > 1).
    """

    seed: int
    ids: tuple[int, ...]
    clipping_norm: float
    scale: float = 10.0
    id_key: str = "partition-id"
    num_examples: int = 1  # FedAvg weight: the same as every real client's (see "Uniform weights")
    held_out_norm: float = 1e-3  # a held-out canary's update norm, in units of S (small; not 0: see held_out_update)

    def __post_init__(self) -> None:
        ids = tuple(int(i) for i in self.ids)
        object.__setattr__(self, "ids", ids)
        if len(ids) < 4:
            raise UserInputError(f"canaries.ids: {len(ids)} canary clients; allowed: at least 4 distinct node ids")
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise UserInputError("canaries.ids: must be distinct non-negative node ids; allowed: e.g. range(N, N + m)")
        if not (self.clipping_norm > 0 and math.isfinite(self.clipping_norm)):
            raise UserInputError(f"canaries.clipping_norm: {self.clipping_norm} is not allowed; allowed: Flower's "
                                 "clipping norm S, a finite number > 0")
        if not (self.scale > 1 and math.isfinite(self.scale)):
            raise UserInputError(f"canaries.scale: {self.scale} is not allowed; allowed: a finite number > 1 (the clip "
                                 "must scale the canary's update down to exactly S)")
        if not (0 < self.held_out_norm < 1):
            raise UserInputError(f"canaries.held_out_norm: {self.held_out_norm} is not allowed; allowed: a number in "
                                 "(0, 1), a fraction of S")
        if self.num_examples < 1:
            raise UserInputError(f"canaries.num_examples: {self.num_examples} is not allowed; allowed: an integer ≥ 1")

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def inserted(self) -> np.ndarray:
        """The coins: bool [m], each canary inserted independently with probability ½."""
        return numpy_rng(self.seed, "flower-canaries", "inserted").random(self.count) < 0.5

    def direction(self, index: int, dim: int) -> np.ndarray:
        """u_i: a uniformly random unit vector of R^dim (a normalised Gaussian), float64."""
        raw = numpy_rng(self.seed, "flower-canaries", "direction", index).standard_normal(dim)
        return raw / np.linalg.norm(raw)

    def held_out_update(self, index: int, dim: int) -> np.ndarray:
        """A held-out canary's update: ``held_out_norm``·S·v_i, v_i a unit direction independent of u_i.
        Not zero: Flower's clip divides by the update's norm (flwr 1.42 ``clip_inputs_inplace``
        raises ZeroDivisionError on a zero update)."""
        raw = numpy_rng(self.seed, "flower-canaries", "held-out", index).standard_normal(dim)
        return self.held_out_norm * self.clipping_norm * raw / np.linalg.norm(raw)

    def directions(self, dim: int) -> np.ndarray:
        """All canaries' directions [m, dim]."""
        return np.stack([self.direction(i, dim) for i in range(self.count)])

    def index_of(self, context: Context) -> int | None:
        """The canary index of the node running ``context`` (None: a real client)."""
        if self.id_key not in context.node_config:
            raise UserInputError(f"canaries.id_key: '{self.id_key}' is not in the node's config; allowed: a key of "
                                 f"node_config, here {', '.join(sorted(context.node_config)) or 'none'}")
        node = int(context.node_config[self.id_key])
        return self.ids.index(node) if node in self.ids else None


def canary_mod(canaries: CanaryClients):
    """A Flower client Mod (``ClientApp(mods=[...])``) that makes the ``canaries`` nodes canary clients.

    On a TRAIN message a canary node does not call the client: it replies with the received
    global model w plus ``scale``·S·u_i when inserted, plus the tiny
    :meth:`CanaryClients.held_out_update` when held out (Andrew et al. 2024, Alg. 1: a canary's
    update is a fixed direction at the clip norm). Every other message, and
    every real client, passes through unchanged.
    """
    inserted = canaries.inserted

    def mod(msg: Message, ctxt: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctxt)
        index = canaries.index_of(ctxt)
        if index is None:
            return call_next(msg, ctxt)
        fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        arrays = parameters_to_ndarrays(fit_ins.parameters)
        dim = int(sum(a.size for a in arrays))
        step = (canaries.scale * canaries.clipping_norm * canaries.direction(index, dim) if inserted[index]
                else canaries.held_out_update(index, dim))
        out, start = [], 0
        for array in arrays:
            # float64 arithmetic, cast back: the upload keeps the model's dtype
            out.append((array.astype(np.float64) + step[start:start + array.size].reshape(array.shape)).astype(array.dtype))
            start += array.size
        arrays = out
        reply = FitRes(Status(Code.OK, "canary client"), ndarrays_to_parameters(arrays), canaries.num_examples, {})
        return Message(compat.fitres_to_recorddict(reply, keep_input=False), reply_to=msg)

    return mod
