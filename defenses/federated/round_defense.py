"""What the federated engine needs from a defense: the round-based part of its interface.

:class:`~defenses.federated.engine.FederatedEngine` and :mod:`defenses.federated.release_probe` drive a defense
through its rounds — the local work of each client, privatisation, aggregation, the claim — and,
for the canary audits and the conformance audit, the part of its audit adapter they call
(:class:`EngineAuditHooks`). They name these protocols rather than :class:`defenses.base.Defense`
and :class:`defenses.audit_hooks.AuditHooks`, which build on the engine: the engine then depends
on no defense module, not even for its type annotations, and every :class:`~defenses.base.Defense`
satisfies the protocol by its methods (mypy checks it where a defense is handed to the engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from defenses.blocks.flat import ParamLayout
    from defenses.blocks.local_training import LocalObjective
    from defenses.federated.training_job import DefenseState, RoundContext, TrainingConfig, TrainingJob
    from defenses.privacy.accounting import AccountingSettings
    from defenses.privacy.claims import PrivacyClaim


class EngineAuditHooks(Protocol):
    """What the engine and the release probe call of a defense's audit adapter (see
    :class:`defenses.audit_hooks.AuditHooks` for what each member does and its defaults)."""

    def canary_rows(self, directions: torch.Tensor, honest_norms: torch.Tensor, state: DefenseState) -> torch.Tensor: ...

    def clip_bound(self, state: DefenseState) -> float | None: ...

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None: ...

    def dirac_canaries_alike(self) -> bool: ...

    def released_coordinates(self, ctx: RoundContext) -> torch.Tensor | None: ...

    def dirac_origin(self, ctx: RoundContext) -> torch.Tensor | None: ...

    def divisor(self, ctx: RoundContext) -> float | None: ...

    def release_statistic(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor: ...


@runtime_checkable
class RoundDefense(Protocol):
    """A defense as the engine runs it, round by round (see :class:`defenses.base.Defense` for
    what each member does and its defaults)."""

    params: Any
    layout: ParamLayout | None

    # read-only here: a defense states them as class variables
    @property
    def name(self) -> str: ...

    @property
    def reference(self) -> str: ...

    @property
    def observes(self) -> str: ...

    def bind(self, layout: ParamLayout) -> RoundDefense: ...

    def validate(self, training: TrainingConfig, num_clients: int) -> None: ...

    def prepare(self, job: TrainingJob, model: torch.nn.Module | None = None,
                initial: dict[str, torch.Tensor] | None = None) -> DefenseState: ...

    def test_split(self, job: TrainingJob, state: DefenseState) -> tuple[torch.Tensor, torch.Tensor]: ...

    def local_objective(self) -> LocalObjective: ...

    def local_batches(self, num_records: int, training: TrainingConfig, rng: Any) -> list: ...

    def memory_factor(self, training: TrainingConfig) -> float: ...

    # a tensor of updates, or DiracRows where the defense takes Dirac canary clients
    def privatize(self, updates: Any, ctx: RoundContext) -> tuple[Any, dict[str, float]]: ...

    def privatize_together(self, runs: list[tuple[Any, torch.Tensor, RoundContext]]) -> list[tuple[torch.Tensor, dict]]: ...

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor: ...

    def privacy_claim(self, training: TrainingConfig, num_clients: int, rounds: int, delta: float,
                      accounting: AccountingSettings, state: DefenseState = ...) -> PrivacyClaim: ...

    def epsilon_trajectory(self, training: TrainingConfig, num_clients: int, delta: float,
                           accounting: AccountingSettings, state: DefenseState = ...) -> list[float] | None: ...

    def audit_hooks(self) -> EngineAuditHooks: ...
