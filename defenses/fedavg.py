"""FedAvg (McMahan et al. 2017) and DP-FedAvg (McMahan et al. 2018; as in Alg. 1 of Cheng et al. 2022).

DP-FedAvg, per round t with participants P_t (Cheng et al. 2022, Alg. 1):

    Δ_i  = LocalSGD(w, D_i) − w                       # flattened over all parameters
    Δ̃_i  = Δ_i / max(1, ‖Δ_i‖₂ / S)                   # one flat ℓ2 clip
    upload_i = Δ̃_i + N(0, S²σ²/|P_t| · I_d)            # noise_placement = "client" (BLUR+LUS, DP-FedSAM, FL-TOP-DP)
    w ← w + η_g · (1/|P_t|) Σ_i upload_i

so the noise of the sum is N(0, S²σ²·I). With ``noise_placement = "aggregate"`` a trusted
aggregator adds N(0, S²σ²·I) once to the sum instead (same distribution of the global step).
Each round is a sampled Gaussian mechanism with noise multiplier σ on the sum of clipped
updates, composed over T rounds (:mod:`defenses.privacy.accounting`), client-level.

:class:`DPFedAvg` is also the base of the family that changes one step of this pipeline —
BLUR/LUS (Cheng et al. 2022), DP-FedSAM and its top-k variant (Shi et al. 2023), Fed-SMP — through the hooks
:meth:`DPFedAvg.pre_clip` (sparsify before clipping), :meth:`DPFedAvg.noise_support` (which
coordinates carry a client's noise: :class:`NoiseSupport`) and :meth:`DPFedAvg.post_noise` (mask
after the noise), and :meth:`Defense.local_objective`; what the audits need of the family is
:class:`DPFedAvgAuditHooks`.

The claim names its observers (:mod:`defenses.privacy.claims`): the released models (sampled Gaussian
with σ, amplified), the server (no amplification; the sum under secure aggregation or with a
trusted noise-adding aggregator, else each upload) and one upload alone, whose own noise
multiplier is only σ/√|P_t|: single-upload attacks (gradient inversion) meet a much weaker
guarantee, which the claim states in numbers. A variant that keeps a client's noise only on some
coordinates is accounted with the noise a coordinate kept by one client really carries, σ/√m_max;
one whose released support depends on the data makes no finite claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observer, Unit
from defenses.audit_hooks import AuditHooks
from defenses.base import DEFENSES, NO_STATE, AccountingSettings, Defense, PrivacyClaim
from defenses.blocks.clipping import clip_rows, clip_rows_per_tensor, joined_rows
from defenses.blocks.noise import gaussian_rows
from defenses.federated.training_job import RoundContext, TrainingConfig
from defenses.privacy.accounting import (
    GaussianSchedule,
    accountant_label,
    calibrate_noise,
    compute_epsilon,
    epsilon_trajectory,
)
from defenses.privacy.claims import GaussianRounds, divided_by_realised_count, gaussian_adversaries

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@DEFENSES.register
class FedAvg(Defense):
    """Non-private federated averaging: the leakage baseline every defense is compared with."""

    name = "fedavg"
    summary = "Federated averaging without privacy (baseline)"
    reference = "McMahan et al. 2017, Communication-Efficient Learning of Deep Networks from Decentralized Data"

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        return PrivacyClaim.non_private("non-private baseline: no clipping, no noise")


@dataclass(frozen=True)
class NoiseSupport:
    """Which coordinates of a client's upload carry its noise: every one (the default, sound with σ);
    only the coordinates the client keeps (``kept_only``: Fed-SMP's noise on the kept coordinates,
    Hu et al. 2022, §4; DP-FedSAM-top_k's mask after the noise, Shi et al. 2023, Eq. 12), so a
    coordinate kept by one client alone carries only its share σ/√m; or only kept coordinates
    chosen from the client's data, released with its upload (``leak`` says why that reveals the
    data: no finite claim)."""

    kept_only: bool = False
    leak: str | None = None

    def __post_init__(self) -> None:
        if self.leak is not None and not self.kept_only:
            raise ValueError("a support leak needs noise on the kept coordinates only")

    @classmethod
    def kept(cls, leak: str | None = None) -> NoiseSupport:
        return cls(True, leak)


@dataclass(frozen=True)
class DPFedAvgParams:
    clip: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                               "help": "S: ℓ2 bound on each client's update"})
    noise_multiplier: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                           "help": "σ: noise std of the sum is σS (set by calibration when "
                                                                   "'epsilons' is given)"})
    noise_placement: Literal["client", "aggregate"] = field(
        default="client",
        metadata={"help": "client: each upload gets N(0,S²σ²/|P_t|); aggregate: a trusted aggregator adds N(0,S²σ²) to the sum"})
    denominator: Literal["realized", "expected"] = field(
        default="realized", metadata={"help": "divide the sum by the realized |P_t| (paper) or the expected qN"})
    secure_aggregation: bool = field(
        default=False, metadata={"help": "simulated secure aggregation: the server sees only the sum of uploads"})
    clip_mode: Literal["flat", "per_tensor"] = field(
        default="flat",
        metadata={"help": "flat: one ℓ2 clip over all parameters; per_tensor: each tensor to S (sensitivity S√L, accounted)"})


@DEFENSES.register
class DPFedAvg(Defense):
    """DP-FedAvg with ℓ2 clipping and Gaussian noise, client-level (ε, δ)-DP."""

    name = "dp-fedavg"
    summary = "Client-level DP-FedAvg: flat ℓ2 clip of each update, Gaussian noise (client-side or on the sum)"
    reference = "McMahan, Ramage, Talwar, Zhang 2018, Learning Differentially Private Recurrent Language Models (Alg. 1)"
    Params = DPFedAvgParams
    private = True
    #: the privatisation below treats alike every one-coordinate update of one tensor and value
    #: (:meth:`DPFedAvgAuditHooks.dirac_canaries_alike`); a subclass that changes it declares its own
    canaries_alike: ClassVar[bool] = True

    # ---------------------------------------------------------------- configuration

    @property
    def observes(self) -> str:
        private_sum = self.params.noise_placement == "aggregate" or self.params.secure_aggregation
        return "aggregate" if private_sum else "uploads"

    def noise_support(self) -> NoiseSupport:
        """Which coordinates carry a client's noise (every one, but for the papers' variants)."""
        return NoiseSupport()

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError(f"training.aggregation: {self.name} needs 'uniform' (size weights change the sensitivity)")
        if self.noise_support().kept_only and self.params.noise_placement != "client":
            raise UserInputError(f"params.noise_placement: {self.name} masks each client's noise, which needs 'client'")

    def effective_noise_multiplier(self) -> float:
        """Noise std of the sum divided by its ℓ2 sensitivity: σ, or σ/√L with per-tensor clipping."""
        if self.params.clip_mode == "flat":
            return self.params.noise_multiplier
        if self.layout is None:
            raise UserInputError("params.clip_mode: 'per_tensor' needs the model's layout to account (bind the defense first)")
        return self.params.noise_multiplier / math.sqrt(len(self.layout.names))

    def noise_reach(self, training: TrainingConfig, num_clients: int, rounds: int | None = None) -> GaussianRounds:
        """How the noise reaches each observer (:mod:`defenses.privacy.claims`).

        The sum of the uploads carries N(0, S²σ²) on every coordinate, one upload N(0, S²σ²/|P_t|)
        (client placement), and |P_t| ≤ m_max: the whole population under Poisson sampling, m under
        fixed-size sampling. Where clients keep their noise only on their own coordinates, a
        coordinate kept by the target alone carries only the target's share, so the sum is no
        better than one upload: σ/√m_max.
        """
        sigma = self.effective_noise_multiplier()
        largest = training.round_size(num_clients) if training.sampling == "fixed" else num_clients
        client_noise = self.params.noise_placement == "client"
        upload = sigma / math.sqrt(largest) if client_noise else None
        aggregate: float | None = sigma
        why = ""
        support = self.noise_support()
        if support.leak:
            aggregate = upload = None
            why = support.leak
        elif support.kept_only:
            aggregate = upload
            why = "noise only on kept coordinates"
        if client_noise:
            server_sees = "aggregate" if self.params.secure_aggregation else "uploads"
            server_note = "" if self.params.secure_aggregation else "no secure aggregation: the server sees every upload"
        else:
            server_sees = "aggregate"
            server_note = "assumes the aggregator that adds the noise to the sum is trusted and is not the server"
        return GaussianRounds(aggregate, upload, server_sees, training.rounds if rounds is None else rounds,
                              training.sampling_rate(num_clients), training.sampling, num_clients, server_note, why)

    def schedule(self, training: TrainingConfig, num_clients: int, rounds: int | None = None) -> GaussianSchedule:
        """The headline's schedule: the sampled Gaussian on the aggregate (as the released models see it)."""
        multiplier = self.noise_reach(training, num_clients, rounds).aggregate
        if multiplier is None:
            raise UserInputError(f"defenses: {self.name} with these params makes no finite claim ({self.noise_support().leak}); "
                                 "remove its 'epsilons' or choose its sound variant")
        return GaussianSchedule(multiplier, training.sampling_rate(num_clients),
                                training.rounds if rounds is None else rounds, training.sampling, num_clients)

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> DPFedAvg:
        schedule = self.schedule(training, num_clients)
        effective = calibrate_noise(target_epsilon, schedule, delta, accounting.accountant, accounting.conversion)
        # the accounted multiplier is proportional to σ (σ/√L per tensor, σ/√m_max for masked noise)
        return self.with_params(noise_multiplier=effective * self.params.noise_multiplier / schedule.noise_multiplier)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        reach = self.noise_reach(training, num_clients, rounds)
        adversaries = gaussian_adversaries(reach, delta, accounting.accountant, accounting.conversion)
        notes = ["client-level: neighbouring datasets differ in one client's data"]
        if self.params.denominator == "realized":
            # dividing by the realized |P_t| releases it: zero-out neighbours (Kairouz et al. 2021, §2)
            adversaries, relabelled = divided_by_realised_count(adversaries)
            if relabelled:
                notes.append(f"{relabelled}; denominator: expected gives add/remove")
        released = adversaries[0]
        if self.params.clip_mode == "per_tensor":
            notes.append(f"per-tensor clipping: sensitivity S√L with L={len(self.layout.names)} tensors, "
                         f"accounted with noise multiplier σ/√L = {self.effective_noise_multiplier():.4g}")
        support = self.noise_support()
        if support.leak:
            notes.append(f"no finite guarantee: {support.leak}")
        elif support.kept_only:
            notes.append(f"noise only on kept coordinates (the paper's variant): a coordinate kept by one client carries only "
                         f"its share σ/√m, so the claim is accounted with σ/√m_max = {reach.aggregate:.4g} instead of σ")
        notes.extend(self.claim_notes())
        mechanism = released.notes if released.covered else "no finite bound"
        return PrivacyClaim(released.epsilon if released.covered else math.inf, delta, Unit.CLIENT,
                            released.accountant or accountant_label(accounting.accountant, accounting.conversion),
                            mechanism, "; ".join(notes), relation=released.relation, adversary=Observer.RELEASED,
                            adversaries=adversaries)

    def claim_notes(self) -> list[str]:
        """Caveats specific to a variant."""
        return []

    def epsilon_trajectory(self, training, num_clients, delta, accounting, state=NO_STATE) -> list[float]:
        if self.noise_reach(training, num_clients).aggregate is None:
            return [math.inf] * training.rounds
        schedule = self.schedule(training, num_clients)
        if accounting.accountant == "rdp":
            return [float(e) for e in epsilon_trajectory(schedule, delta, accounting.conversion)]
        return [compute_epsilon(schedule.with_steps(t), delta, "pld").epsilon for t in range(1, training.rounds + 1)]

    # ---------------------------------------------------------------- the privatisation pipeline

    def pre_clip(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sparsify the raw updates before clipping; returns (updates, kept mask or None)."""
        return updates, None

    def post_noise(self, clipped: torch.Tensor, noisy: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Transform the noisy uploads (e.g. keep only a top-k support)."""
        return noisy

    def clip(self, updates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.params.clip_mode == "flat":
            return clip_rows(updates, self.params.clip)
        return clip_rows_per_tensor(updates, self.params.clip, list(self.layout.slices().values()))

    def upload_noise_std(self, ctx: RoundContext) -> float:
        """The std of each upload's noise under client placement: S·σ/√|P_t|, so that the sum of
        the |P_t| uploads carries N(0, S²σ²)."""
        return self.params.clip * self.params.noise_multiplier / math.sqrt(ctx.participant_count)

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        return self._privatize_rows([(self, updates, ctx)])[0]

    def privatize_together(self, runs: list[tuple[Any, torch.Tensor, RoundContext]]) -> list[tuple[torch.Tensor, dict]]:
        """All runs' rows clipped in one computation and noised in one matrix (each row from its own
        client's stream, at its own run's share σS/√|P_t|): every run's uploads are what
        :meth:`privatize` gives it alone, which runs the same code for one run. A variant that
        privatises otherwise (its own :meth:`privatize`), or runs with other parameters, go one by one."""
        if type(self).privatize is not DPFedAvg.privatize or \
                any(type(defense) is not type(self) or defense.params != self.params for defense, _, _ in runs):
            return super().privatize_together(runs)
        return self._privatize_rows(runs)

    def _privatize_rows(self, runs: list[tuple[Any, torch.Tensor, RoundContext]]) -> list[tuple[torch.Tensor, dict]]:
        sparse = [defense.pre_clip(updates, ctx) for defense, updates, ctx in runs]
        sizes = [len(rows) for rows, _ in sparse]
        if self.params.clip_mode == "flat" and type(self).clip is DPFedAvg.clip:  # a row's norm and scale ignore other rows
            clipped, norms, was_clipped = clip_rows(joined_rows([rows for rows, _ in sparse]), self.params.clip)
            parts = list(zip(clipped.split(sizes), norms.split(sizes), was_clipped.split(sizes)))
        else:
            parts = [self.clip(rows) for rows, _ in sparse]
        fractions = torch.stack([fraction.double().mean() for _, _, fraction in parts]).tolist()  # one host sync
        noises: list[torch.Tensor | None] = [None] * len(runs)
        if self.params.noise_placement == "client":
            stds = [defense.upload_noise_std(ctx) for defense, _, ctx in runs]
            generators = [ctx.client_generator(int(c), "noise") for _, _, ctx in runs for c in ctx.participants]
            rows = [len(ctx.participants) for _, _, ctx in runs]
            noise = gaussian_rows(sum(rows), parts[0][0].shape[1], np.repeat(stds, rows).tolist(), generators,
                                  parts[0][0].device)
            noises = list(noise.split(rows))
        out = []
        for (defense, _, ctx), (_, kept), (clipped_k, norms_k, _), fraction, noise_k in zip(runs, sparse, parts, fractions,
                                                                                             noises):
            noisy = clipped_k
            if noise_k is not None:
                if kept is not None and defense.noise_support().kept_only:
                    noise_k = noise_k * kept
                noisy = clipped_k + noise_k
            out.append((defense.post_noise(clipped_k, noisy, ctx), {"clip_fraction": fraction, "clip_input_norms": norms_k}))
        return out

    def divisor(self, ctx: RoundContext) -> float:
        """What :meth:`aggregate` divides the sum by: |P_t| as realised, or the expected qN."""
        if self.params.denominator == "expected":
            return ctx.training.sampling_rate(ctx.num_clients) * ctx.num_clients
        return float(ctx.participant_count)

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        total = uploads.sum(0)
        if self.params.noise_placement == "aggregate":
            std = self.params.clip * self.params.noise_multiplier
            total = total + gaussian_rows(1, uploads.shape[1], std, [ctx.server_generator("noise")], uploads.device)[0]
        return total / self.divisor(ctx)

    def audit_hooks(self) -> DPFedAvgAuditHooks:
        return DPFedAvgAuditHooks(self)


#: the members whose code a Dirac canary's upload goes through (:meth:`DPFedAvgAuditHooks.dirac_canaries_alike`)
_PRIVATISATION = ("privatize", "privatize_together", "_privatize_rows", "pre_clip", "clip", "upload_noise_std",
                  "post_noise")


class DPFedAvgAuditHooks(AuditHooks):
    """DP-FedAvg's family as the audits see it: canaries carry the clip S, Dirac canary clients are
    measured through the family's own privatisation (:mod:`defenses.federated.dirac_passage`) where
    it keeps each coordinate apart, the released step divides by :meth:`DPFedAvg.divisor`."""

    defense: DPFedAvg

    def __init__(self, defense: DPFedAvg, *, update_canaries: bool = True):
        super().__init__(defense, update_canaries=update_canaries, clips_updates=True)

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """DP-FedAvg and its subclasses — their sparsifiers and masks and a user's override of
        ``privatize`` included — take Dirac canary clients: every canary's value is read off the
        defense's own code (:mod:`defenses.federated.dirac_passage`), and what cannot be read
        there (a one-coordinate input whose upload spreads over coordinates, a mask chosen on the
        noisy upload) stops the audit with the reason. Under fixed-size sampling the canaries join
        each round at the clients' rate m/N, a mechanism the claim's dominates
        (:func:`attacks.canaries.dirac_canaries.per_canary_multiplier`)."""
        return None

    def dirac_canaries_alike(self) -> bool:
        """Whether one probe per class (tensor, value) reads every Dirac canary: the nearest class
        of the defense that declares ``canaries_alike`` (DP-FedAvg: its clip and noise treat every
        coordinate alike, per tensor under per-tensor clipping; a top-k sparsifier, which keeps a
        one-coordinate update whole) must own every member on the canaries' path, so a variant's
        sparsifier or mask, or a user's override of one of these members, is read canary by canary."""
        kind = type(self.defense)
        owner = next((k for k in kind.__mro__ if k.__dict__.get("canaries_alike")), None)
        return owner is not None and not self.defense.noise_support().kept_only and \
            all(getattr(kind, member) is getattr(owner, member) for member in _PRIVATISATION)

    def divisor(self, ctx: RoundContext) -> float:
        return self.defense.divisor(ctx)
