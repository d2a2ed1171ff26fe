"""What every defense is: typed hyper-parameters, a training procedure and an explicit privacy claim."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from audit.errors import UserInputError
from audit.registry import Registry
from defenses.flat import ParamLayout

if TYPE_CHECKING:
    from defenses.engine import RoundContext, TrainingConfig, TrainingJob, TrainingOutcome
    from defenses.local_training import LocalObjective

UNITS = ("client", "record", "weight", "none")


@dataclass(frozen=True)
class PrivacyClaim:
    """The guarantee a defense claims: (ε, δ)-DP for neighbouring datasets that differ in one ``unit``.

    ``epsilon`` is ``math.inf`` for a non-private defense. ``accountant`` names the accountant,
    its conversion and its version; ``mechanism`` says what was accounted; ``notes`` carries the
    caveats a reader needs (e.g. that individual uploads are not covered). Where a paper's own
    accounting is unsound, ``alternatives`` holds the other labelled figures.
    """

    epsilon: float
    delta: float
    unit: str
    accountant: str
    mechanism: str = ""
    notes: str = ""
    alternatives: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit}")

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["epsilon"] = self.epsilon if self.is_private else None  # JSON has no infinity
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyClaim:
        data = dict(data)
        data["epsilon"] = math.inf if data.get("epsilon") is None else float(data["epsilon"])
        return cls(**data)

    @classmethod
    def non_private(cls, notes: str = "") -> PrivacyClaim:
        return cls(math.inf, 0.0, "none", "none", "no noise", notes)


@dataclass(frozen=True)
class NoParams:
    """A defense without hyper-parameters."""


@dataclass(frozen=True)
class AccountingSettings:
    accountant: str = "rdp"
    conversion: str = "improved"


class Defense:
    """A federated learning algorithm with its privatisation and its privacy claim.

    Round-based defenses use :class:`defenses.engine.FederatedEngine` and override its hooks
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
    #: whether canary clients with a fixed update can join (update-space audits); False where
    #: privatisation needs a client's data or the clients upload something other than updates
    update_canaries: ClassVar[bool] = True

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
        from defenses.engine import FederatedEngine

        return FederatedEngine(self, job).run(progress)

    def local_objective(self) -> LocalObjective:
        from defenses.local_training import LocalObjective

        return LocalObjective()

    def prepare(self, job: TrainingJob, model: torch.nn.Module | None = None,
                initial: dict[str, torch.Tensor] | None = None) -> None:
        """Called once before training, with the initial global model (defenses that need the
        clients' sizes, the seed, or server-side work on public data before the first round)."""

    def local_batches(self, num_records: int, training: TrainingConfig, rng) -> list:
        """A client's mini-batches for one round (local indices); default: epochs or iterations of fixed size."""
        from defenses.local_training import client_batches

        return client_batches(num_records, training.local_unit, training.local_steps, training.batch_size, rng)

    def memory_factor(self, training: TrainingConfig) -> float:
        """Parameter-sized tensors one client needs during local training (sets the batched chunk size)."""
        return 1.0

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict[str, float]]:
        """Turn the C×d matrix of raw client updates into what the clients upload."""
        return updates, {}

    def canary_norm(self, honest_norms: torch.Tensor) -> float:
        """ℓ2 norm a canary client's update is given: the clip where the defense clips updates
        (the largest contribution a client can make), else the round's median honest norm."""
        clip = getattr(self.params, "clip", None)
        if self.clips_updates and isinstance(clip, int | float) and clip > 0:
            return float(clip)
        return float(honest_norms.median()) if len(honest_norms) else 1.0

    #: whether ``params.clip`` bounds each client's update (DP-FedAvg family, DDGauss, FL-TOP-DP)
    clips_updates: ClassVar[bool] = False

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Combine uploads into the global step direction (length d)."""
        from defenses.engine import mean_update

        return mean_update(uploads, ctx)


DEFENSES: Registry[type[Defense]] = Registry("defense")
