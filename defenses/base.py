"""What every defense is: typed hyper-parameters, a training procedure and an explicit privacy claim
(:class:`defenses.privacy.claims.PrivacyClaim`, re-exported here); what the audits need of it is
behind its adapter, :meth:`Defense.audit_hooks` (:mod:`defenses.audit_hooks`). How to add one:
docs/how-to/add-a-defense.md."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.registry import Registry
from defenses.audit_hooks import AuditHooks
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalObjective, client_batches
from defenses.federated.engine import FederatedEngine, mean_update
from defenses.federated.training_job import (
    NO_STATE,
    DefenseState,
    RoundContext,
    TrainingConfig,
    TrainingJob,
    TrainingOutcome,
)
from defenses.privacy.accounting import AccountingSettings
from defenses.privacy.claims import UNITS, PrivacyClaim

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class NoParams:
    """A defense without hyper-parameters."""


def _frozen_params(params: Any, owner: str) -> Any:
    """``params`` as a defense keeps it: a frozen dataclass whose list values become tuples, so that
    nothing reachable from a defense can change after construction."""
    if not is_dataclass(params) or isinstance(params, type):
        raise TypeError(f"{owner}: params must be an instance of a frozen dataclass (the class's Params), "
                        f"got {type(params).__name__}")
    if not params.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{owner}: {type(params).__name__} must be declared @dataclass(frozen=True): a defense is a value")
    lists = {f.name: tuple(getattr(params, f.name)) for f in fields(params) if isinstance(getattr(params, f.name), list)}
    return replace(params, **lists) if lists else params


class Defense:
    """A federated learning algorithm with its privatisation and its privacy claim.

    Round-based defenses use :class:`defenses.federated.engine.FederatedEngine` and override its hooks
    (:meth:`local_objective`, :meth:`privatize`, :meth:`aggregate`); a defense with a different
    shape (e.g. one-shot voting) overrides :meth:`train` instead.

    A defense is an immutable value — its hyper-parameters (a frozen dataclass) and the model's
    layout — shared by every run of an experiment, alone or trained together. Assigning an
    attribute after construction raises: whatever a run derives from its data belongs in the
    :class:`~defenses.federated.training_job.DefenseState` that :meth:`prepare` returns, which the
    engine keeps per run and hands to every hook as ``ctx.state``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    private: ClassVar[bool] = False
    #: what an honest-but-curious server observes each round: "uploads" or "aggregate"
    default_view: ClassVar[str] = "uploads"

    params: Any
    #: the model's parameter layout, bound before training (some claims depend on it)
    layout: ParamLayout | None

    def __init__(self, params: Any = None, layout: ParamLayout | None = None):
        owner = f"defense '{self.name or type(self).__name__}'"
        object.__setattr__(self, "params", _frozen_params(params if params is not None else self.Params(), owner))
        object.__setattr__(self, "layout", layout)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"{type(self).__name__}.{name}: a defense is an immutable value shared by every run of an "
                             "experiment; return what a run derives from its data from prepare() (a DefenseState) and "
                             "read it as ctx.state")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__}.{name}: a defense is an immutable value")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params == self.params and other.layout == self.layout  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.params, self.layout))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"

    # ---------------------------------------------------------------- configuration

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        """Reject training settings the defense's analysis does not cover (raise UserInputError)."""

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig,
                  num_clients: int, accounting: AccountingSettings) -> Defense:
        """A copy whose noise meets ``target_epsilon``; only private defenses support it."""
        raise UserInputError(f"defenses: '{self.name}' is not a DP defense; remove its 'epsilons'")

    def with_params(self, **changes: Any) -> Defense:
        return type(self)(replace(self.params, **changes), self.layout)

    def bind(self, layout: ParamLayout) -> Defense:
        """A copy that knows the model's parameter layout."""
        return type(self)(self.params, layout)

    def privacy_claim(self, training: TrainingConfig, num_clients: int, rounds: int, delta: float,
                      accounting: AccountingSettings, state: DefenseState = NO_STATE) -> PrivacyClaim:
        """The claim of a run with these settings; ``state`` is the run's (:meth:`prepare`), or
        :data:`NO_STATE` before any run's data is known (planning), for defenses whose claim
        depends on it (NbAFL's smallest client)."""
        return PrivacyClaim.non_private("no differential privacy")

    def epsilon_trajectory(self, training: TrainingConfig, num_clients: int, delta: float,
                           accounting: AccountingSettings, state: DefenseState = NO_STATE) -> list[float] | None:
        """ε after each round, for the per-round metrics (None for non-private defenses)."""
        return None

    @property
    def observes(self) -> str:
        return self.default_view

    # ---------------------------------------------------------------- training

    def train(self, job: TrainingJob, progress: Any = None) -> TrainingOutcome:

        return FederatedEngine(self, job).run(progress)

    def local_objective(self) -> LocalObjective:

        return LocalObjective()

    def prepare(self, job: TrainingJob, model: torch.nn.Module | None = None,
                initial: dict[str, torch.Tensor] | None = None) -> DefenseState:
        """What this run derives from its data, before its first round, with the initial global model
        (the clients' sizes, the seed, server-side work on public data): a frozen
        :class:`~defenses.federated.training_job.DefenseState` the engine keeps for this run only."""
        return NO_STATE

    def test_split(self, job: TrainingJob, state: DefenseState = NO_STATE) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out records accuracy is measured on, given the run's ``state`` (a defense that takes
        server-side data from the held-out split removes it here)."""
        return job.test_x, job.test_y

    def local_batches(self, num_records: int, training: TrainingConfig, rng) -> list:
        """A client's mini-batches for one round (local indices); default: epochs or iterations of fixed size."""

        return client_batches(num_records, training.local_unit, training.local_steps, training.batch_size, rng)

    def memory_factor(self, training: TrainingConfig) -> float:
        """Parameter-sized tensors one client needs during local training (sets the batched chunk size)."""
        return 1.0

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict[str, float]]:
        """Turn the C×d matrix of raw client updates into what the clients upload."""
        return updates, {}

    def privatize_together(self, runs: list[tuple[Any, torch.Tensor, RoundContext]]) -> list[tuple[torch.Tensor, dict]]:
        """:meth:`privatize` of one round of several runs of this defense, given as (the run's bound
        defense, its raw updates, its context); results in that order. Runs trained together
        (:mod:`defenses.run_batch`) call it on the first run's defense, so that a defense may clip
        and noise all runs' rows in shared computations — each run's uploads exactly as its own
        :meth:`privatize` gives them. By default, each run's own :meth:`privatize`."""
        return [defense.privatize(updates, ctx) for defense, updates, ctx in runs]

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Combine uploads into the global step direction (length d)."""

        return mean_update(uploads, ctx)

    # ---------------------------------------------------------------- audits

    def audit_hooks(self) -> AuditHooks:
        """What the audits need of this defense beyond the algorithm (canary clients, the release
        probe, ...: :mod:`defenses.audit_hooks`); the default reads the public attributes — a
        defense whose audits differ returns a subclass of :class:`AuditHooks`."""
        return AuditHooks(self, engine_rounds=type(self).train is Defense.train)


DEFENSES: Registry[type[Defense]] = Registry("defense", base=Defense)

__all__ = ["DEFENSES", "NO_STATE", "UNITS", "AccountingSettings", "AuditHooks", "Defense", "DefenseState", "NoParams",
           "PrivacyClaim"]
