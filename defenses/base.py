"""What every defense is: typed hyper-parameters, a training procedure and an explicit privacy claim
(:class:`defenses.privacy.claims.PrivacyClaim`, re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.registry import Registry
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalObjective, client_batches
from defenses.federated.engine import FederatedEngine, mean_update
from defenses.federated.release_probe import ReleaseProbe, engine_probe
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

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """Why Dirac canary clients at scale (:mod:`defenses.blocks.dirac_rows`) cannot go through this
        defense's own privatisation, None when they can. A defense takes them when its
        :meth:`privatize` and :meth:`aggregate` handle :class:`~defenses.blocks.dirac_rows.DiracRows`
        (clip, noise and sum them like dense rows)."""
        return "its privatisation handles dense uploads only (the dense client-canaries and gradient-canaries audits apply)"

    def divisor(self, ctx: RoundContext) -> float | None:
        """What :meth:`aggregate` divides the round's sum by (None: not a sum over a public
        divisor); the Dirac canary audit standardises the released steps with it."""
        return None

    def release_probe(self, job: TrainingJob) -> ReleaseProbe | None:
        """This defense's round as the conformance audit drives it (:mod:`defenses.federated.release_probe`):
        the engine's privatise → release path for round-based defenses; a defense that trains
        otherwise, or whose noise lives elsewhere (DP-SGD inside local training), overrides it.
        None: no probe (a private defense without one fails the audit)."""

        return engine_probe(self, job) if type(self).train is Defense.train else None

    def canary_norm(self, honest_norms: torch.Tensor) -> float:
        """ℓ2 norm a canary client's update is given: the clip where the defense clips updates
        (the largest contribution a client can make), else the round's median honest norm."""
        clip = getattr(self.params, "clip", None)
        if self.clips_updates and isinstance(clip, int | float) and clip > 0:
            return float(clip)
        return float(honest_norms.median()) if len(honest_norms) else 1.0

    #: whether ``params.clip`` bounds each client's update (DP-FedAvg family, DDGauss, FL-TOP-DP)
    clips_updates: ClassVar[bool] = False

    def clip_slices(self) -> list[slice] | None:
        """The parameter tensors clipped separately (``params.clip_mode: per_tensor``: each to
        norm S), None where an update is clipped as one vector."""
        if getattr(self.params, "clip_mode", "flat") != "per_tensor" or self.layout is None:
            return None
        return list(self.layout.slices().values())

    def canary_rows(self, directions: torch.Tensor, honest_norms: torch.Tensor) -> torch.Tensor:
        """Canary clients' uploads before privatisation: each direction scaled to
        :meth:`canary_norm`. Under per-tensor clipping a client may put norm S into *every*
        tensor (sensitivity S√L), so each tensor's part of a canary is scaled to S: a canary
        scaled as one vector would carry only S, a 1/√L share of what the claim must cover."""
        norm = self.canary_norm(honest_norms)
        slices = self.clip_slices() if self.clips_updates else None
        if slices is None:
            return directions * norm
        rows = directions.clone()
        for part in slices:
            lengths = torch.linalg.vector_norm(rows[:, part], dim=1, dtype=torch.float64, keepdim=True)
            scale = torch.where(lengths > 0, norm / lengths.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(lengths))
            rows[:, part] = rows[:, part] * scale.to(rows.dtype)
        return rows

    def release_statistic(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """The noisy statistic the released step is computed from by post-processing alone (what the
        conformance audit observes for the released models); default: the step itself."""
        return self.aggregate(uploads, ctx)

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Combine uploads into the global step direction (length d)."""

        return mean_update(uploads, ctx)


DEFENSES: Registry[type[Defense]] = Registry("defense")

__all__ = ["DEFENSES", "UNITS", "AccountingSettings", "Defense", "NoParams", "PrivacyClaim"]
