"""What the audits need from a defense, kept off the algorithm: one adapter per defense.

A defense (:class:`defenses.base.Defense`) states its algorithm — local objective, privatisation,
aggregation — and its claim. The audits need more of it: how to craft a canary client that
contributes as much as a client may (the clip S, per tensor under per-tensor clipping: Andrew et
al. 2024, §3), whether canary clients can join at all, whether Dirac canary rows (Nasr et al.
2023, §4) go through its privatisation, what the released step is divided by, the noisy
statistic the released step post-processes, and how the conformance audit drives one round
(:mod:`defenses.federated.release_probe`). :meth:`Defense.audit_hooks` returns an
:class:`AuditHooks` for these; the default is built from the algorithm's public attributes
(``params.clip``, ``params.clip_mode``, ``layout``, ``aggregate``), and a defense whose audits
differ returns a subclass defined next to it, in its own paper's file.

The engine and the release probe call only :class:`defenses.federated.round_defense.EngineAuditHooks`
(the part of this adapter they use), so they depend on a protocol, not on this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from defenses.federated.release_probe import ReleaseProbe, engine_probe
from defenses.federated.training_job import ReleaseAnomaly

if TYPE_CHECKING:
    import torch

    from defenses.blocks.record_gradient_canaries import ClaimedStep
    from defenses.federated.round_defense import RoundDefense
    from defenses.federated.training_job import DefenseState, RoundContext, TrainingConfig, TrainingJob
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

DENSE_ONLY = ("its privatisation handles dense uploads only (the dense client-canaries and gradient-canaries audits apply); "
              "to take Dirac canaries at scale, let its privatize and aggregate handle defenses.blocks.dirac_rows.DiracRows "
              "and its audit hooks' dirac_canaries_refused return None, as DP-FedAvg's do (or extend DPFedAvg)")


class AuditHooks:
    """A defense as the audits see it.

    ``update_canaries``: whether canary clients with a fixed update can join (update-space audits);
    False where privatisation needs a client's data or clients upload something other than updates.
    ``clips_updates``: whether ``params.clip`` bounds each client's update (DP-FedAvg family,
    DDGauss, FL-TOP-DP). ``engine_rounds``: whether the defense trains by the engine's rounds
    (then the default :meth:`release_probe` drives them).
    """

    def __init__(self, defense: RoundDefense, *, update_canaries: bool = True, clips_updates: bool = False,
                 engine_rounds: bool = True):
        self.defense = defense
        self.update_canaries = update_canaries
        self.clips_updates = clips_updates
        self.engine_rounds = engine_rounds

    # ---------------------------------------------------------------- canary clients

    def clip_bound(self, state: DefenseState | None = None) -> float | None:
        """The clip S of a run whose state is ``state`` (``params.clip``; a defense that calibrates
        it on the run's data reads it from the state), None where the defense has none."""
        clip = getattr(self.defense.params, "clip", None)
        return float(clip) if isinstance(clip, int | float) and clip > 0 else None

    def canary_norm(self, honest_norms: torch.Tensor, state: DefenseState | None = None) -> float:
        """ℓ2 norm a canary client's update is given: the run's clip where the defense clips updates
        (the largest contribution a client can make), else the round's median honest norm."""
        clip = self.clip_bound(state) if self.clips_updates else None
        if clip is not None:
            return clip
        return float(honest_norms.median()) if len(honest_norms) else 1.0

    def clip_slices(self) -> list[slice] | None:
        """The parameter tensors clipped separately (``params.clip_mode: per_tensor``: each to
        norm S), None where an update is clipped as one vector."""
        if getattr(self.defense.params, "clip_mode", "flat") != "per_tensor" or self.defense.layout is None:
            return None
        return list(self.defense.layout.slices().values())

    def canary_rows(self, directions: torch.Tensor, honest_norms: torch.Tensor,
                    state: DefenseState | None = None) -> torch.Tensor:
        """Canary clients' uploads before privatisation: each direction scaled to
        :meth:`canary_norm` (of the run whose state is ``state``). Under per-tensor clipping a
        client may put norm S into *every* tensor (sensitivity S√L), so each tensor's part of a
        canary is scaled to S: a canary scaled as one vector would carry only S, a 1/√L share of
        what the claim must cover."""
        norm = self.canary_norm(honest_norms, state)
        slices = self.clip_slices() if self.clips_updates else None
        if slices is None:
            return directions * norm
        rows = directions.clone()
        for part in slices:
            lengths = torch.linalg.vector_norm(rows[:, part], dim=1, dtype=torch.float64, keepdim=True)
            scale = torch.where(lengths > 0, norm / lengths.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(lengths))
            rows[:, part] = rows[:, part] * scale.to(rows.dtype)
        return rows

    def claimed_step(self, training: TrainingConfig) -> ClaimedStep | None:
        """What the record-level claim accounts for one local DP-SGD step of ``training`` (mechanism,
        Poisson rate, clip norm, steps a round): what record gradient canaries
        (:mod:`defenses.blocks.record_gradient_canaries`) are scored against; None where the defense has
        no such step (its noise is elsewhere)."""
        return None

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """Why Dirac canary clients at scale (:mod:`defenses.blocks.dirac_rows`) cannot go through this
        defense's own privatisation, None when they can. A defense takes them when its ``privatize``
        and ``aggregate`` handle :class:`~defenses.blocks.dirac_rows.DiracRows` (clip, noise and sum
        them like dense rows)."""
        return DENSE_ONLY

    def dirac_canaries_alike(self) -> bool:
        """Whether the defense's privatisation is *known* to treat alike every Dirac canary of one
        class — one tensor, one value — so that one probe row per class reads them all
        (:mod:`defenses.federated.dirac_passage`); False (the default, always sound): every canary
        is read on a probe row of its own."""
        return False

    def released_coordinates(self, ctx: RoundContext) -> torch.Tensor | None:
        """The coordinates the round can release (a public boolean mask the server fixes before any
        upload, such as a subset every client trains; None: all). A Dirac canary on another
        coordinate takes no part in the round — nothing of it, not even noise, is released — and a
        canary that takes part in no round is no coin of the audit."""
        return None

    def dirac_origin(self, ctx: RoundContext) -> torch.Tensor | None:
        """The raw update whose contribution the defense's code makes zero before its noise — the
        point a Dirac canary's spike is placed on, so that a canary is s·U on one coordinate of what
        the defense clips (None: the zero update, for a defense that clips updates). A defense that
        clips something else gives its pre-image: NbAFL clips the model w_0 + Δ, whose origin is
        Δ = −w_0."""
        return None

    def dirac_clip(self, state: DefenseState | None = None) -> float:
        """S: the most one Dirac canary's clipped value can be on its coordinate — the clip of what
        the defense clips (default: :meth:`canary_norm`, the update clip)."""
        return self.canary_norm(torch.empty(0), state)

    def divisor(self, ctx: RoundContext) -> float | None:
        """What ``aggregate`` divides the round's sum by (None: not a sum over a public divisor);
        the Dirac canary audit standardises the released steps with it."""
        return None

    # ---------------------------------------------------------------- the conformance audit

    def release_statistic(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """The noisy statistic the released step is computed from by post-processing alone (what the
        conformance audit observes for the released models); default: the step itself, which
        must have one value per model parameter."""
        step = self.defense.aggregate(uploads, ctx)
        if ctx.layout is not None and step.numel() != ctx.layout.dim:
            raise ReleaseAnomaly(f"aggregate returned a step of {step.numel()} values for a model of {ctx.layout.dim} "
                                 "parameters")
        return step

    def release_probe(self, job: TrainingJob) -> ReleaseProbe | None:
        """The defense's round as the conformance audit drives it (:mod:`defenses.federated.release_probe`):
        the engine's privatise → release path for round-based defenses; a defense that trains
        otherwise, or whose noise lives elsewhere (DP-SGD inside local training), overrides it.
        None: no probe (a private defense without one fails the audit)."""
        return engine_probe(self.defense, job) if self.engine_rounds else None


__all__ = ["DENSE_ONLY", "AuditHooks"]
