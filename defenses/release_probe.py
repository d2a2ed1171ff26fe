"""One round of a defense's own code, as the conformance audit drives it: contributions in, what
each observer sees out (DESIGN.md, "Conformance"; ``../shared/specs/auditing.md`` §2).

A :class:`ReleaseProbe` wraps a defense bound to a real (small) training job. Its ``views``
takes the m × d matrix of contributions — raw client updates for round-based defenses, one
client's per-example gradients for DP-SGD, agents' votes for private voting — and a trial seed,
and returns, per adversary a claim names, the vector that observer sees:

* ``released``: the noisy statistic the released model is computed from by post-processing
  (:meth:`Defense.release_statistic`; the global step itself by default);
* ``server``: that statistic where the server sees only the aggregate, else the target's upload;
* ``local``: the target's upload (contribution row 0).

Nothing here is a re-implementation: :func:`engine_probe` calls the defense's ``privatize`` and
``release_statistic`` on a :class:`RoundContext` built by the engine itself; the seed of a trial
keys every random stream of the round, so two calls with the same seed and different inputs see
the same masks and noise (coupled trials) and calls with different seeds are independent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from defenses.engine import FederatedEngine
from defenses.training_job import TrainingJob

if TYPE_CHECKING:
    from defenses.base import Defense

Views = dict[str, torch.Tensor]


@dataclass
class ReleaseProbe:
    """A defense's round as a function from contributions to observations.

    ``bound`` is the norm a contribution is clipped to (the audit's inputs lie far beyond it, so
    every clip acts); ``defense`` is the defense as prepared for the job (its claim is the one
    checked); ``one_coordinate`` says that neighbours differ in one coordinate only
    (per-weight claims), so only concentrated inputs are neighbours; ``contribution`` says in
    words what a row is.
    """

    dim: int
    contributors: int
    bound: float
    views: Callable[[torch.Tensor, int], Views]
    contribution: str
    defense: Defense
    one_coordinate: bool = False


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.float64).reshape(-1).cpu()


def engine_probe(defense: Defense, job: TrainingJob) -> ReleaseProbe:
    """A round-based defense's privatise → release path on the engine's own round context.

    The defense is prepared and bound as in training (:meth:`FederatedEngine.start`), every
    client of ``job`` takes part, and contribution row i is client i's raw update Δ_i.
    """

    engine = FederatedEngine(defense, job)
    state = engine.start()
    bound_defense = engine.defense
    participants = np.arange(len(job.clients))
    base = engine.context(0, participants, state.model, state.layout, state.global_vector, job.training.lr)

    def views(contributions: torch.Tensor, seed: int) -> Views:
        ctx = replace(base, seed=seed, sizes=base.sizes.copy())  # privatize may reorder sizes (shuffling)
        uploads, _ = bound_defense.privatize(contributions.to(base.global_vector).clone(), ctx)
        released = _flat(bound_defense.release_statistic(uploads, ctx))
        upload = _flat(uploads[0])
        return {"released": released, "server": released if bound_defense.observes == "aggregate" else upload,
                "local": upload}

    # the clip, as calibrated in prepare() where the defense calibrates it (FL-TOP's S)
    bound = float(getattr(bound_defense, "_clip", 0.0) or getattr(bound_defense.params, "clip", 0.0) or 1.0)
    return ReleaseProbe(state.layout.dim, len(participants), bound, views, "a client's raw model update Δ_i", bound_defense)
