"""Canary clients: clients whose update is a fixed direction, for auditing client-level DP.

* ``client-canaries`` — Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar 2024, "One-shot
  Empirical Privacy Estimation for Federated Learning" (§3, Alg. 1): each canary client's
  update is a random unit direction u_i (scaled to the clip norm); the statistic is the cosine
  between u_i and the final model's change w_T − w_0. Held-out canaries are directions that
  were never inserted; in high dimension their cosines are ≈ N(0, 1/d).
* ``gradient-canaries`` — a Dirac canary: the update is ±S on a single coordinate (zero
  elsewhere), the white-box canary that puts all of a client's allowed contribution where the
  other clients' updates are smallest; the statistic is the (signed, normalised) change of the
  model on that coordinate.

Both read the aggregate the server forms (the change of the global model over the run, the sum
of its aggregated steps), which is what a client-level claim on the released models covers.
Canary clients join the rounds like any client (:meth:`defenses.engine.FederatedEngine.add_canaries`):
sampled at the clients' rate, their update scaled to :meth:`defenses.base.Defense.canary_norm`
— the clip S where the defense clips updates — and privatised like every other upload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attacks.base import ATTACKS
from attacks.canary_audit import CanaryAudit, CanaryContext, CanaryInjection, CanaryRun
from audit.core.seeding import numpy_rng, torch_generator


@dataclass(frozen=True)
class UpdateCanaryParams:
    canaries: int = field(default=100, metadata={"min": 4, "help": "canary clients per run (each inserted with probability ½)"})
    runs: int = field(default=1, metadata={"min": 1, "help": "audit runs (their canaries are pooled)"})


class UpdateCanaryAudit(CanaryAudit):
    Params = UpdateCanaryParams
    unit = "client"

    def not_applicable(self, defense) -> str | None:
        if not defense.update_canaries:
            return f"'{defense.name}' cannot take canary clients (its privatisation needs client data, or clients do not upload updates)"
        return None

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        raise NotImplementedError

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        return CanaryInjection(self.inclusion(context, run, self.params.canaries), directions=self.directions(context, run))

    def statistics(self, context: CanaryContext, run: CanaryRun, model: torch.nn.Module) -> np.ndarray:
        change = (run.final - run.initial).to(torch.float64)
        norm = float(torch.linalg.vector_norm(change))
        directions = run.injection.directions.to(torch.float64)
        return (directions @ change / max(norm, 1e-300)).numpy()


@ATTACKS.register("client-canaries")
class ClientCanaries(UpdateCanaryAudit):
    name = "client-canaries"
    summary = "canary clients with random update directions; cosine with the model change; one-shot ε estimate"
    reference = "Andrew et al. 2024, One-shot Empirical Privacy Estimation for Federated Learning"

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        generator = torch_generator(context.seed, "canaries", self.label, run, "directions")
        raw = torch.randn(self.params.canaries, context.layout.dim, generator=generator, dtype=torch.float64)
        return (raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True)).to(torch.float32)


@ATTACKS.register("gradient-canaries")
class GradientCanaries(UpdateCanaryAudit):
    name = "gradient-canaries"
    summary = "white-box Dirac canaries: a canary client's update is ±S on one coordinate"
    reference = "Dirac canaries (Nasr et al. 2021/2023; Steinke et al. 2023, §6); the one-run audit of Steinke et al. 2023"

    def directions(self, context: CanaryContext, run: int) -> torch.Tensor:
        rng = numpy_rng(context.seed, "canaries", self.label, run, "coordinates")
        dim = context.layout.dim
        count = self.params.canaries
        coordinates = rng.choice(dim, size=count, replace=count > dim)
        signs = rng.choice([-1.0, 1.0], size=count)
        out = torch.zeros(count, dim)
        out[torch.arange(count), torch.as_tensor(coordinates)] = torch.as_tensor(signs, dtype=torch.float32)
        return out
