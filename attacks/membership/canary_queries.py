"""Canary queries: Wen, Bansal, Kazemi, Borgnia, Goldblum, Geiping, Goldstein 2023, "Canary in
a Coalmine: Better Membership Inference with Ensembled Adversarial Queries" (ICLR; §3–4).

Instead of querying the target model on the record (x, y) itself, the attacker optimises a
small set of queries x'₁..x'_Q near x on reference models whose membership it knows: each
query should be classified as y with high confidence by the models that trained on (x, y)
and with low confidence by those that did not —

    min_{x'}  Σ_{in refs} CE(f(x'), y) + Σ_{out refs} −log(1 − p_y(f(x'))),   ‖x' − x‖_∞ ≤ radius,

by Adam on the sign of the gradient, starting from x and from random points of the ball (for
diversity), then projected back onto the ball and the data's range. The queries are scored
LiRA-style (:mod:`attacks.membership.lira`): φ of each query under the references gives one Gaussian
pair per query, and the per-query scores are averaged. This is the "Canary" column of paper
001's Table 6.

Runs are split into folds; the queries for the targets of one fold are optimised on, and
their Gaussians fitted to, the runs of the other folds — the target model never shapes its
own queries. Optimising per record is costly, so ``max_records`` records (or the records of
whole clients, for the client unit) are attacked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack, Setting
from attacks.membership.lira import VARIANTS, LiRA, LiRAParams
from attacks.membership_experiment import MembershipExperiment
from attacks.signals import logit_scaled_confidence
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, torch_generator
from audit.core.vocabulary import Unit
from defenses.federated.evaluation import logits_of

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")


@dataclass(frozen=True)
class CanaryQueryParams:
    unit: Literal["auto", "record", "client"] = field(default="auto", metadata={
        "help": "score records or whole clients (auto: the membership unit of the runs)"})
    variants: list[str] = field(default_factory=lambda: ["online", "offline"], metadata={"choices": VARIANTS})
    queries: int = field(default=8, metadata={"min": 1, "help": "Q: optimised queries per record"})
    iterations: int = field(default=30, metadata={"min": 1, "help": "sign-Adam steps"})
    step: float = field(default=0.01, metadata={"min": 0.0, "min_exclusive": True, "help": "Adam learning rate, in input units"})
    radius: float = field(default=0.1, metadata={"min": 0.0, "min_exclusive": True,
                                                 "help": "ℓ∞ radius of the query ball around the record, in input units"})
    folds: int = field(default=2, metadata={"min": 2, "help": "runs split into folds; references = the other folds"})
    max_records: int = field(default=300, metadata={"min": 2, "help": "records attacked (0 < n; a random subset)"})
    variance: Literal["global", "per-example"] = field(default="global", metadata={"help": "LiRA's variance estimate"})


def attacked_records(experiment: MembershipExperiment, unit: str, limit: int) -> np.ndarray:
    """A random subset of records; for the client unit, all records of randomly chosen clients."""
    rng = numpy_rng(experiment.seed, "canary-queries", "records")
    if unit == Unit.RECORD:
        count = min(limit, experiment.keep.shape[1])
        return np.sort(rng.choice(experiment.keep.shape[1], count, replace=False))
    chosen, total = [], 0
    for client in rng.permutation(experiment.client_keep.shape[1]):
        members = np.flatnonzero(experiment.owners == client)
        if total and total + len(members) > limit and len(chosen) >= 2:
            break
        chosen.append(members)
        total += len(members)
    return np.sort(np.concatenate(chosen))


@ATTACKS.register
class CanaryQueries(MembershipAttack):
    name = "canary-queries"
    summary = "LiRA on adversarially optimised query sets per record (Canary in a Coalmine)"
    reference = "Wen et al. 2023, Canary in a Coalmine: Better Membership Inference with Ensembled Adversarial Queries"
    Params = CanaryQueryParams
    min_runs = 4

    def check(self, field_path: str, setting: Setting) -> None:
        # each fold needs at least one run: more folds than runs would quietly be cut to the runs
        if self.params.folds > setting.runs:
            raise UserInputError(f"{field_path}.params.folds: {self.params.folds} folds of {setting.runs} membership runs; "
                                 f"allowed: 2 to {setting.runs} (membership.runs)")

    def optimise(self, experiment: MembershipExperiment, references: np.ndarray, records: np.ndarray) -> torch.Tensor:
        """Queries [records, Q, *input] optimised on the reference runs."""
        device = experiment.device
        model = experiment.model
        params = [experiment.load_params(int(r)) for r in references]
        stacked = {name: torch.stack([p[name] for p in params]).detach() for name in params[0]}
        x = experiment.features[torch.as_tensor(records)].to(device)
        y = experiment.labels[torch.as_tensor(records)].to(device)
        low, high = float(experiment.features.min()), float(experiment.features.max())
        keep = torch.as_tensor(experiment.keep[np.ix_(references, records)], device=device)  # [R, S]
        q, radius = self.params.queries, self.params.radius
        generator = torch_generator(experiment.seed, "canary-queries", "init", *references.tolist())
        start = (torch.rand((len(records), q) + tuple(x.shape[1:]), generator=generator) * 2 - 1).to(device) * radius
        start[:, 0] = 0.0  # the first query starts at the record itself
        offset = start.requires_grad_(True)
        optimiser = torch.optim.Adam([offset], lr=self.params.step)
        labels = y.repeat_interleave(q)
        was_training = model.training
        model.eval()

        def forward(p, inputs):
            return torch.func.functional_call(model, p, (inputs,))

        try:
            for _ in range(self.params.iterations):
                queries = (x[:, None] + offset).clamp(low, high).reshape((-1,) + tuple(x.shape[1:]))
                logits = torch.func.vmap(forward, in_dims=(0, None))(stacked, queries)  # [R, S·Q, C]
                log_p = F.log_softmax(logits, -1).gather(-1, labels[None, :, None].expand(len(references), -1, 1))[..., 0]
                inside = -log_p  # cross-entropy towards y
                outside = -torch.log1p(-log_p.exp().clamp(max=1 - 1e-6))  # −log(1 − p_y)
                member = keep.repeat_interleave(q, dim=1)
                loss = torch.where(member, inside, outside).mean()
                optimiser.zero_grad()
                (gradient,) = torch.autograd.grad(loss, [offset])
                offset.grad = gradient.sign()
                optimiser.step()
                with torch.no_grad():
                    offset.clamp_(-radius, radius)
        finally:
            model.train(was_training)
        return (x[:, None] + offset.detach()).clamp(low, high)

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        unit = experiment.resolve_unit(self.params.unit)
        records = attacked_records(experiment, unit, self.params.max_records)
        keep = experiment.keep.astype(bool)
        runs = experiment.runs
        folds = min(self.params.folds, runs)
        fold_of = np.arange(runs) % folds
        labels = experiment.labels[torch.as_tensor(records)].numpy()
        lira = LiRA(LiRAParams(variants=list(self.params.variants), variance=self.params.variance))
        scores = {variant: np.zeros((runs, len(records))) for variant in self.params.variants}
        for fold in range(folds):
            targets, references = np.flatnonzero(fold_of == fold), np.flatnonzero(fold_of != fold)
            queries = self.optimise(experiment, references, records)
            flat = queries.reshape((-1,) + tuple(queries.shape[2:]))
            signals = np.stack([self._signals(experiment, r, flat, labels) for r in range(runs)])  # [runs, S, Q]
            for target in targets:
                rows = np.r_[references, target]
                # leave-one-out over [references + target]: the last row is the target scored against the references
                for variant, values in lira.scores(signals[rows], keep[np.ix_(rows, records)]).items():
                    scores[variant][target] = values[-1]
            if progress is not None:
                progress(fold + 1, folds)
        notes = (f"{self.params.queries} queries per record, {self.params.iterations} sign-Adam steps in an ℓ∞ ball of "
                 f"{self.params.radius:g}; {len(records)} records attacked; references: the other {folds - 1} fold(s)")
        return [self.result(variant, experiment, values, notes, records) for variant, values in scores.items()]

    def _signals(self, experiment: MembershipExperiment, run: int, queries: torch.Tensor, labels: np.ndarray) -> np.ndarray:
        logits = logits_of(experiment.model, experiment.load_params(run), queries).cpu().numpy()
        q = self.params.queries
        return logit_scaled_confidence(logits, np.repeat(labels, q)).reshape(len(labels), q)
