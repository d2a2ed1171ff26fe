"""What every defense is: typed hyper-parameters, a training procedure and an explicit privacy claim
(:class:`defenses.privacy.claims.PrivacyClaim`, re-exported here); what the audits need of it is
behind its adapter, :meth:`Defense.audit_hooks` (:mod:`defenses.audit_hooks`). How to add one:
docs/how-to/add-a-defense.md."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.registry import Registry
from defenses.audit_hooks import AuditHooks
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalObjective, client_batches
from defenses.federated.engine import FederatedEngine, mean_update
from defenses.federated.training_job import RoundContext, TrainingConfig, TrainingJob, TrainingOutcome
from defenses.privacy.accounting import AccountingSettings
from defenses.privacy.claims import UNITS, PrivacyClaim

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class NoParams:
    """A defense without hyper-parameters."""


class Defense:
    """A federated learning algorithm with its privatisation and its privacy claim.

    Round-based defenses use :class:`defenses.federated.engine.FederatedEngine` and override its hooks
    (:meth:`local_objective`, :meth:`privatize`, :meth:`aggregate`); a defense with a different
    shape (e.g. one-shot voting) overrides :meth:`train` instead.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    private: ClassVar[bool] = False
    #: what an honest-but-curious server observes each round: "uploads" or "aggregate"
    default_view: ClassVar[str] = "uploads"

    def __init__(self, params: Any = None, layout: ParamLayout | None = None):
        self.params = params if params is not None else self.Params()
        #: the model's parameter layout, bound before training (some claims depend on it)
        self.layout = layout

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
                      accounting: AccountingSettings) -> PrivacyClaim:
        return PrivacyClaim.non_private("no differential privacy")

    def epsilon_trajectory(self, training: TrainingConfig, num_clients: int, delta: float,
                           accounting: AccountingSettings) -> list[float] | None:
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
                initial: dict[str, torch.Tensor] | None = None) -> None:
        """Called once before training, with the initial global model (defenses that need the
        clients' sizes, the seed, or server-side work on public data before the first round)."""

    def test_split(self, job: TrainingJob) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out records accuracy is measured on, after :meth:`prepare` (a defense that takes
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


DEFENSES: Registry[type[Defense]] = Registry("defense")

__all__ = ["DEFENSES", "UNITS", "AccountingSettings", "AuditHooks", "Defense", "NoParams", "PrivacyClaim"]
