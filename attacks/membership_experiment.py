"""What a membership attack is given: trained runs over a shared pool of candidate units.

A :class:`MembershipExperiment` is N trained runs of one defense configuration over a shared
pool of candidate units — records, or whole clients when the runs include clients at random
(``membership.unit: client``): run r trained on the units with ``truth(unit)[r] == True``.
Each run serves in turn as the target, the others as reference runs (leave-one-out, as in
LiRA's own evaluation), so an attack scores every (target run, unit) pair. Client-level
scores are the mean of the client's record scores. The logits of every run's global model on
the pool — of the final round, or of any round the runs stored — are computed once and shared
by the attacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.signals import view_inputs
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Relation, Unit
from defenses.federated.evaluation import logits_of

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


@dataclass(frozen=True)
class TargetParams:
    """What every membership attack can be pointed at: the unit and the rounds it scores."""

    unit: Literal["auto", "record", "client"] = field(default="auto", metadata={
        "help": "score records or whole clients (auto: the membership unit of the runs)"})
    rounds: Literal["final", "all"] | list[int] = field(default="final", metadata={
        "min": 1, "help": "global models scored: the final one, every round's, or a list of rounds (the server holds them all)"})


@dataclass
class MembershipExperiment:
    """N trained runs over one candidate pool, their membership and the models the server holds."""

    key: str
    keep: np.ndarray  # bool [runs, records]
    features: torch.Tensor  # the candidate pool
    labels: torch.Tensor
    kind: str  # "image" or "tabular"
    model: nn.Module  # architecture template (parameters come from the runs)
    load_params: Callable[[int], dict[str, torch.Tensor]]  # final global model of run r
    seed: int
    device: str = "cpu"
    unit: str = Unit.RECORD  # what the runs include at random
    relation: str = Relation.ADD_REMOVE  # what one inclusion coin changes (audit.tasks): add/remove or replace-one
    inclusion: float = 0.5  # probability of each coin
    owners: np.ndarray | None = None  # candidate client of each record (client unit)
    client_keep: np.ndarray | None = None  # bool [runs, candidate clients] (client unit)
    load_round: Callable[[int, int], dict[str, torch.Tensor]] | None = None  # run r's global model after round t
    rounds: int = 0  # training rounds of the runs
    #: unit → δ at which ε lower bounds are computed (what the claim allows per unit; 0 when unset)
    deltas: dict[str, float] = field(default_factory=dict)
    _logits: dict = field(default_factory=dict, repr=False)

    @property
    def runs(self) -> int:
        return int(self.keep.shape[0])

    # ---------------------------------------------------------------- units

    def resolve_unit(self, unit: str) -> str:
        if unit == "auto":
            return self.unit
        if unit == Unit.CLIENT and self.owners is None:
            raise UserInputError("attacks: unit 'client' needs runs that include whole clients; set membership.unit: client")
        return unit

    def truth(self, unit: str) -> np.ndarray:
        """bool [runs, units]: was the unit in the run."""
        return self.keep.astype(bool) if self.resolve_unit(unit) == Unit.RECORD else self.client_keep.astype(bool)

    def to_unit(self, record_scores: np.ndarray, unit: str) -> np.ndarray:
        """Record scores [targets, records] → unit scores: a client's is the mean of its records'."""
        if self.resolve_unit(unit) == Unit.RECORD:
            return record_scores
        clients = self.client_keep.shape[1]
        counts = np.bincount(self.owners, minlength=clients).astype(np.float64)
        sums = np.zeros((record_scores.shape[0], clients))
        for row, scores in enumerate(record_scores):
            sums[row] = np.bincount(self.owners, weights=scores, minlength=clients)
        return sums / np.maximum(counts, 1.0)

    # ---------------------------------------------------------------- what the server holds

    def round_list(self, rounds: str | list[int]) -> list[int | None]:
        """Rounds to score (None = the final model)."""
        if rounds == "final":
            return [None]
        if rounds == "all":
            return list(range(1, self.rounds + 1))
        return [int(r) if int(r) != self.rounds else None for r in rounds]

    def params_of(self, run: int, round_number: int | None) -> dict[str, torch.Tensor]:
        if round_number is None:
            return self.load_params(run)
        if self.load_round is None:
            raise UserInputError("attacks: scoring earlier rounds needs the runs' global models; set record.global_rounds")
        return self.load_round(run, round_number)

    def logits(self, round_number: int | None, views: tuple[str, ...] = ("identity",)) -> np.ndarray:
        """Logits of every run's global model on the pool: float32 [runs, views, records, classes].

        Cached per (round, views), so LiRA, Shokri and the threshold attacks query each model once.
        """
        key = (round_number, views)
        if key not in self._logits:
            x = self.features.to(self.device)
            out = []
            for r in range(self.runs):
                params = self.params_of(r, round_number)
                out.append(torch.stack([logits_of(self.model, params, view) for view in view_inputs(x, views)]).cpu().numpy())
            self._logits[key] = np.stack(out).astype(np.float32)
        return self._logits[key]


def rounds_note(experiment: MembershipExperiment, rounds: str | list[int]) -> str:
    chosen = experiment.round_list(rounds)
    if chosen == [None]:
        return "final global model"
    return f"global models of {len(chosen)} rounds" if rounds == "all" else \
        "global models of rounds " + ", ".join(str(r or experiment.rounds) for r in chosen)
