"""What a federated training run is given, what its hooks see each round, and what it returns.

The types of the round loop (:mod:`defenses.federated.engine`; McMahan et al. 2017, FedAvg; 2018,
DP-FedAvg Alg. 1): the federated training settings (:class:`TrainingConfig`, config section
``training``), which parts of the server view a run stores (:class:`RecordSpec`), one run's inputs
(:class:`TrainingJob`), what a defense derives from one run's data (:class:`DefenseState`, the value
its ``prepare`` returns), what a defense's hooks know about the current round
(:class:`RoundContext`, whose noise generators come from the keyed streams
``(seed, "round", t, "client", i, purpose)`` and ``(seed, "round", t, "server", purpose)``), a run's
state between rounds (:class:`RunState`), and its result: :class:`TrainingOutcome`, or
:class:`TrainingDiverged` at the first round with non-finite numbers.

A defense is a value shared by every run of an experiment (and trained alone or beside other
runs); what differs between runs — client sizes, a clip calibrated on the run's public batch, a
mask, the run's δ — lives in that run's :class:`DefenseState`, which the engine keeps per run and
hands to every hook through :attr:`RoundContext.state`, to the claim and to the audit hooks. So no
run can read another run's numbers, whatever runs it trains with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.blocks.dirac_rows import DiracRows
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalSchedule
from defenses.blocks.record_gradient_canaries import GradientCanaryLog, GradientCanaryPlan
from defenses.privacy.accounting import AccountingSettings
from defenses.privacy.claims import PrivacyClaim

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


@dataclass(frozen=True)
class TrainingConfig:
    """Federated training settings shared by all defenses (a defense may override some per entry)."""

    rounds: int = field(default=30, metadata={"min": 1, "max": 100_000, "help": "federated rounds T"})
    sampling: Literal["poisson", "fixed"] = field(
        default="poisson", metadata={"help": "client sampling: Poisson(q) or a fixed-size sample without replacement"})
    client_rate: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True, "max": 1.0,
                                                      "help": "q: Poisson rate, or m/N for fixed-size sampling"})
    clients_per_round: int | None = field(default=None, metadata={"min": 1, "max": 100_000,
                                                                  "help": "m for fixed-size sampling (overrides client_rate)"})
    local_unit: Literal["epochs", "iterations"] = field(default="epochs", metadata={"help": "what local_steps counts"})
    local_steps: int = field(default=1, metadata={"min": 1, "max": 100_000, "help": "local epochs or SGD iterations per round"})
    batch_size: int = field(default=10, metadata={"min": 1, "max": 1_000_000})
    lr: float = field(default=0.1, metadata={"min": 0.0, "min_exclusive": True, "help": "client learning rate η_l"})
    lr_decay: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True, "max": 1.0,
                                                   "help": "η_l(t) = lr · lr_decay^t"})
    optimizer: Literal["sgd", "adam"] = field(default="sgd", metadata={"help": "client optimiser (torch.optim semantics); adam "
                                                                               "uses betas (0.9, 0.999)"})
    momentum: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0, "max_exclusive": True, "help": "SGD momentum"})
    weight_decay: float = field(default=0.0, metadata={"min": 0.0})
    server_lr: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True, "help": "η_g"})
    aggregation: Literal["uniform", "weighted"] = field(
        default="uniform", metadata={"help": "mean of uploads: uniform 1/|P_t| or weighted by client size"})
    engine: Literal["batched", "loop"] = field(
        default="batched", metadata={"help": "batched torch.func clients, or the per-client reference loop"})
    client_chunk: int = field(default=0,
                              metadata={"min": 0, "max": 100_000, "help": "clients per batched computation (0: automatic)"})
    eval_every: int = field(default=1, metadata={"min": 1, "max": 100_000,
                                                 "help": "evaluate the global model every k rounds (and at the end)"})

    def round_size(self, num_clients: int) -> int:
        """m for fixed-size sampling."""
        if self.clients_per_round is not None:
            return min(self.clients_per_round, num_clients)
        return max(1, int(round(self.client_rate * num_clients)))

    def sampling_rate(self, num_clients: int) -> float:
        """q of Poisson sampling, or m/N of fixed-size sampling."""
        if self.sampling == "fixed":
            return self.round_size(num_clients) / num_clients
        return self.client_rate


@dataclass(frozen=True)
class RecordSpec:
    """Which parts of the server view a run stores: rounds are 1-based; "all", "final" or "none"."""

    global_rounds: str | tuple[int, ...] = "final"
    upload_rounds: str | tuple[int, ...] = "none"
    upload_clients: str | tuple[int, ...] = "all"

    @staticmethod
    def _wants(selection: str | tuple[int, ...], round_number: int, total: int) -> bool:
        if selection == "all":
            return True
        if selection == "none":
            return False
        if selection == "final":
            return round_number == total
        return round_number in selection

    def wants_global(self, round_number: int, total: int) -> bool:
        return self._wants(self.global_rounds, round_number, total)

    def wants_uploads(self, round_number: int, total: int) -> bool:
        return self._wants(self.upload_rounds, round_number, total)

    def wants_client(self, client: int) -> bool:
        return self.upload_clients == "all" or (isinstance(self.upload_clients, tuple) and client in self.upload_clients)


@dataclass
class TrainingJob:
    """Everything one federated training run needs."""

    model_factory: Callable[[], nn.Module]
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    clients: list[np.ndarray]  # pool indices held by each client
    test_x: torch.Tensor
    test_y: torch.Tensor
    training: TrainingConfig
    seed: int
    delta: float = 1e-5
    accounting: AccountingSettings = field(default_factory=AccountingSettings)
    record: RecordSpec = field(default_factory=RecordSpec)
    device: str = "cpu"
    #: canary clients for update-space audits (Andrew et al. 2024): unit-norm directions, one row
    #: per canary client; each round a canary joins like a client (Poisson at the sampling rate)
    #: and uploads its direction scaled to :meth:`AuditHooks.canary_norm` (:mod:`defenses.audit_hooks`) instead of training
    update_canaries: torch.Tensor | None = None
    #: the 1-based rounds (first, last) canary clients join (None: every round)
    canary_rounds: tuple[int, int] | None = None
    #: Dirac canary clients at scale (:mod:`defenses.blocks.dirac_rows`): canary k's raw update is
    #: ``values[k]`` on coordinate ``coords[k]`` (0 for a held-out canary of a zero-out design);
    #: each round a canary joins like a client; what the defense's own clipping, noise and
    #: aggregation make of it is measured on dense probe rows (:mod:`defenses.federated.dirac_passage`)
    dirac_canaries: DiracRows | None = None
    #: record-level gradient canaries inside local DP-SGD (:mod:`defenses.blocks.record_gradient_canaries`):
    #: per-example gradients clipped and noised by the objective's own step, read in every released step
    gradient_canaries: GradientCanaryPlan | None = None


@dataclass(frozen=True)
class DefenseState:
    """What one run of a defense derives from its own data, returned by the defense's ``prepare``.

    The base is empty (most defenses derive nothing); a defense that needs more subclasses it as a
    frozen dataclass (NbAFL's smallest client and δ, FL-TOP's public batch, calibrated clip and
    mask). The engine keeps one per run and hands it to the hooks as :attr:`RoundContext.state`, to
    :meth:`privacy_claim` and to the audit hooks: a defense object itself never changes after
    construction (:class:`defenses.base.Defense` refuses attribute assignment), so this is the one
    place a run's derived numbers can live — and it is that run's alone.
    """


#: the state of a defense that derives nothing from a run's data
NO_STATE = DefenseState()


@dataclass(frozen=True)
class RoundContext:
    """What a defense's hooks know about the current round.

    Besides the participants, it carries the global model the clients started from and the
    clients' data and mini-batch schedule, so that a privatisation step that needs them (e.g.
    LUS's gradient at the final local model) can compute it, and the run's :class:`DefenseState`.
    Frozen: a hook that needs another context builds one (``dataclasses.replace``).
    """

    round: int  # 0-based
    participants: np.ndarray  # client ids, ascending
    sizes: np.ndarray  # records held by each participant
    num_clients: int
    training: TrainingConfig
    seed: int
    device: str
    model: nn.Module | None = None
    layout: ParamLayout | None = None
    global_vector: torch.Tensor | None = None
    client_data: list[np.ndarray] = field(default_factory=list)  # pool indices of each participant
    pool_x: torch.Tensor | None = None
    pool_y: torch.Tensor | None = None
    schedule: LocalSchedule | None = None
    lr: float = 0.0
    chunk_size: int = 0
    #: what the defense derived from this run's data (its ``prepare``)
    state: DefenseState = NO_STATE

    @property
    def participant_count(self) -> int:
        """|P_t|: the clients taking part this round (Dirac canary clients add signal only and are
        not among them, :mod:`defenses.federated.dirac_passage`)."""
        return len(self.participants)

    def client_generator(self, client: int, purpose: str) -> torch.Generator:
        return torch_generator(self.seed, "round", self.round, "client", int(client), purpose)

    def server_generator(self, purpose: str) -> torch.Generator:
        return torch_generator(self.seed, "round", self.round, "server", purpose)

    def global_params(self) -> dict[str, torch.Tensor]:
        assert self.layout is not None and self.global_vector is not None
        return self.layout.unflatten(self.global_vector)

    def chunks(self) -> list[list[int]]:
        """Participant positions grouped for batched computations of bounded memory."""
        size = self.chunk_size or len(self.participants)
        positions = list(range(len(self.participants)))
        return [positions[i:i + size] for i in range(0, len(positions), size)]


@dataclass
class RunState:
    """A run's state between rounds: its model skeleton, global model and what it has recorded."""

    model: nn.Module
    layout: ParamLayout
    global_vector: torch.Tensor
    defense_state: DefenseState  # what the defense derived from this run's data (its prepare)
    members: torch.Tensor  # pool indices of every client's records (for the training-set metrics)
    trajectory: list[float] | None
    test_x: torch.Tensor | None = None  # the split accuracy is measured on (Defense.test_split)
    test_y: torch.Tensor | None = None
    member_x: torch.Tensor | None = None  # pool_x[members], pool_y[members]: the training-set metrics' records
    member_y: torch.Tensor | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    server_view: dict[str, torch.Tensor] = field(default_factory=dict)
    global_models: dict[str, torch.Tensor] = field(default_factory=dict)
    #: each Dirac canary's upload at its own coordinate per round [T, K] (NaN: it did not take part)
    dirac_uploads: torch.Tensor | None = None
    dirac_noise: torch.Tensor | None = None  # [T, K]: the noise in each reading (NaN: did not join)
    #: the real clients' noise-free share of each step on each Dirac canary's coordinate [T, K]
    dirac_drift: torch.Tensor | None = None
    #: whether each Dirac canary's coordinate was released in a round it joined [K] (a defense that
    #: trains a public subset of the coordinates releases no other: a canary outside it is no coin)
    dirac_exercised: torch.Tensor | None = None
    #: the run's gradient canaries at work (:class:`~defenses.blocks.record_gradient_canaries.GradientCanaryLog`)
    gradient_canaries: GradientCanaryLog | None = None


class ReleaseAnomaly(Exception):
    """What a defense released cannot be the mechanism its claim accounts for, whatever the noise:
    another number of uploads than participants, a step of another length than the model, views
    that change shape between trials, or non-finite values for finite inputs. The conformance audit
    turns it into a *violates* verdict with this message as its reason."""


class TrainingDiverged(RuntimeError):
    """A run's training produced non-finite numbers (parameters, or a loss where one is computed).

    Training stops at the round where it is detected (``round``, 1-based) instead of carrying NaN
    through the remaining rounds; ``what`` says what was non-finite and ``metrics`` holds the
    per-round metrics up to and including that round. A result, not a crash: the caller records
    the run as diverged and skips what would have used it.
    """

    def __init__(self, round_number: int, what: str, metrics: list[dict[str, Any]] | None = None):
        super().__init__(f"training diverged at round {round_number} ({what})")
        self.round = round_number
        self.what = what
        self.metrics = list(metrics or [])


@dataclass
class TrainingOutcome:
    final_params: dict[str, torch.Tensor]
    layout: ParamLayout
    metrics: list[dict[str, Any]]
    claim: PrivacyClaim
    server_view: dict[str, torch.Tensor] = field(default_factory=dict)  # flat vectors by key
    global_models: dict[str, torch.Tensor] = field(default_factory=dict)  # flat vectors by round key
