"""Record canaries and the one-run audit: Steinke, Nasr, Jagielski 2023, "Privacy Auditing with
One (1) Training Run" (§5–6), with the canary records Privacy Meter's DP audit uses.

m canary records are built and each is inserted independently with probability ½ into one
training run, into the data of a uniformly chosen client. Canaries are records the model
would not fit without memorising them:

* ``mislabelled`` (default): held-out test records with a label drawn uniformly from the
  other classes;
* ``ood``: inputs drawn uniformly over the data's value range, with random labels.

The statistic is the trained model's logit-scaled confidence in the canary's (canary) label.
The one-run audit gives an ε lower bound at 95 % confidence per record; a record-level claim
bounds it by ε, a client-level claim by 2ε through group privacy (a record changes one
client's data; :func:`reports.soundness.claim_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.base import ATTACKS
from attacks.canaries.canary_audit import CanaryAudit, CanaryContext, CanaryInjection, CanaryRun
from attacks.signals import logit_scaled_confidence
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, torch_generator
from audit.core.vocabulary import Unit
from defenses.federated.evaluation import logits_of

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def mislabelled_records(x: torch.Tensor, y: torch.Tensor, num_classes: int, m: int,
                        rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """m canary records: copies of records drawn from (x, y) (with replacement only when m > len(y)),
    each with a label drawn uniformly from the other ``num_classes − 1`` classes — records a model
    fits only by memorising them (the mislabelled canaries of Privacy Meter's DP audit)."""
    source = torch.as_tensor(rng.choice(len(y), size=m, replace=m > len(y)))
    shift = torch.as_tensor(rng.integers(1, num_classes, size=m))
    return x[source].clone(), (y[source] + shift) % num_classes


#: most canary records per run: Steinke et al. audit with m up to a few thousand; the bound keeps a
#: typo (1000000) from being refused only after minutes of building and inserting records
MAX_CANARIES = 50_000


@dataclass(frozen=True)
class RecordCanaryParams:
    canaries: int = field(default=200, metadata={
        "min": 4, "max": MAX_CANARIES, "help": "canary records per run (each inserted with probability ½)"})
    kind: Literal["mislabelled", "ood"] = field(default="mislabelled", metadata={"help": "what a canary record is"})
    runs: int = field(default=1, metadata={"min": 1, "help": "audit runs (their canaries are pooled)"})


@ATTACKS.register
class RecordCanaries(CanaryAudit):
    name = "record-canaries"
    summary = "mislabelled or out-of-distribution canary records in one run; Steinke et al.'s one-run audit"
    reference = "Steinke, Nasr, Jagielski 2023, Privacy Auditing with One (1) Training Run"
    Params = RecordCanaryParams
    unit = Unit.RECORD

    def injection(self, context: CanaryContext, run: int) -> CanaryInjection:
        m = self.params.canaries
        rng = numpy_rng(context.seed, "canaries", self.label, run, "records")
        if self.params.kind == "mislabelled":
            x, y = mislabelled_records(context.test_x, context.test_y, context.num_classes, m, rng)
        else:
            low, high = float(context.pool_x.min()), float(context.pool_x.max())
            generator = torch_generator(context.seed, "canaries", self.label, run, "ood")
            x = low + (high - low) * torch.rand((m,) + tuple(context.pool_x.shape[1:]), generator=generator)
            y = torch.as_tensor(rng.integers(0, context.num_classes, size=m))
        clients = rng.integers(0, context.clients, size=m)
        return CanaryInjection(self.inclusion(context, run, m), records_x=x.to(context.pool_x.dtype),
                               records_y=y.to(context.pool_y.dtype), record_clients=clients)

    def statistics(self, context: CanaryContext, run: CanaryRun, model: torch.nn.Module) -> np.ndarray:
        injection = run.injection
        x = injection.records_x.to(next(iter(run.params.values())).device)
        logits = logits_of(model, run.params, x).cpu().numpy()
        return logit_scaled_confidence(logits, injection.records_y.numpy())
