"""The frame that Kerkouche, Ács, Castelluccia, Genevès, "Constrained Differentially Private
Federated Learning for Low-bandwidth Devices" (UAI 2021; §3) builds all its algorithms
on: clients train a subset of the coordinates and exchange only what the algorithm says.

* **Top_k-SGD** (Alg. 2): :class:`MaskedObjective` zeroes the gradients outside the trainable
  coordinates, so (plain SGD, no weight decay) the frozen weights keep their bits.
* **The round** (Alg. 1, 3): each client's update restricted to the trainable coordinates; the
  DP variants clip it to S and add N(0, (Sσ)²/|𝕂|) on the exchanged coordinates, and secure
  aggregation gives the server only the sum (§3.2.2). :func:`masked_public_update` is the one
  server-side round on the public batch that calibrates S (§4).
* **Bandwidth** (§4.1): every round logs the exact bits each participating client sends and
  receives (32-bit floats), and the claim states the paper's table formula
  KB = ⌊r·n⌋·32·Round·C/8000 (:func:`table_kilobytes`, K = :func:`kept_count`).
* **Accounting**: each round is a sampled Gaussian (Poisson rate C, multiplier σ) on the client
  level; the observers of the released models get the amplified ε, the server, which picks 𝕂,
  none of the amplification. The mean divides by the realised |𝕂| (Alg. 1, 3), which reveals
  it, so the figures are for zero-out neighbours (a client's contribution zeroed, its
  participation known; Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021, §2), as DP-FedAvg's.

The algorithms: FL-TOP(-DP) in ``fl_top.py``, FL-BASIC(-DP) in ``fl_basic.py``, FL-STD(-DP) in
``fl_std.py``, FL-CS(-DP) in ``fl_cs.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Observer, Unit
from defenses.base import AccountingSettings, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.clipping import clip_rows
from defenses.blocks.local_training import (
    LocalObjective,
    LocalSchedule,
    OptimizerSettings,
    client_batches,
    train_batched,
)
from defenses.blocks.noise import gaussian_rows
from defenses.blocks.sparsify import exact_count
from defenses.federated.training_job import NO_STATE, DefenseState, RoundContext, TrainingConfig
from defenses.privacy.accounting import (
    GaussianSchedule,
    calibrate_noise,
    epsilon_trajectory,
)
from defenses.privacy.claims import GaussianRounds, divided_by_realised_count, gaussian_adversaries

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

BITS_PER_FLOAT = 32


def table_kilobytes(floats: int, rounds: int, client_rate: float) -> float:
    """The paper's bandwidth cell (§4.1): floats·32·Round·C/8000, in KB of 1000 bytes (this reproduces Table 1)."""
    return floats * BITS_PER_FLOAT * rounds * client_rate / 8000.0


def kept_count(fraction: float, dim: int) -> int:
    """K = ⌊r·n⌋ in exact arithmetic (the floor reproduces the paper's byte counts exactly)."""
    return exact_count(fraction, dim, "floor")


# --------------------------------------------------------------------------- the masked local step


class MaskedObjective(LocalObjective):
    """Top_k-SGD (Alg. 2): gradients outside the trainable coordinates are zero, so with plain SGD
    (no weight decay) those weights stay bit-identical; a defense sets the mask every round."""

    #: the mask is chosen per run and round (:meth:`begin_round`): runs train their own clients
    joins_runs = False

    def __init__(self, defense):
        self.defense = defense
        self.mask: dict[str, torch.Tensor] | None = None

    def set_mask(self, flat_mask: torch.Tensor | None, like: dict[str, torch.Tensor]) -> None:
        if flat_mask is None:
            self.mask = None
            return
        out, start = {}, 0
        for name, p in like.items():
            out[name] = flat_mask[start:start + p.numel()].view(p.shape).to(p.dtype)
            start += p.numel()
        self.mask = out

    def begin_round(self, ctx) -> None:
        self.set_mask(self.defense.trainable(ctx), ctx.global_params())

    def batched_gradient(self, model, params, anchor, x, y, mask):
        gradients = super().batched_gradient(model, params, anchor, x, y, mask)
        return gradients if self.mask is None else {n: g * self.mask[n] for n, g in gradients.items()}

    def module_backward(self, model, anchor, x, y):
        super().module_backward(model, anchor, x, y)
        if self.mask is not None:
            for name, p in model.named_parameters():
                p.grad.mul_(self.mask[name])


def masked_public_update(model, initial, mask: torch.Tensor, x, y, training: TrainingConfig, seed: int) -> torch.Tensor:
    """One client-like local round on the public batch with only ``mask`` trainable (§4): the update vector."""
    batches = client_batches(len(y), training.local_unit, training.local_steps, training.batch_size,
                             numpy_rng(seed, "public", "calibration"))
    schedule = LocalSchedule.build([batches], [np.arange(len(y))])
    objective = MaskedObjective(None)
    objective.set_mask(mask, initial)
    local = train_batched(model, objective, initial, schedule, x, y, OptimizerSettings(training.lr))
    names = list(initial)
    return torch.cat([(local[n][0] - initial[n]).reshape(-1) for n in names])


# --------------------------------------------------------------------------- the frame


@dataclass(frozen=True)
class SubsetState(DefenseState):
    """What a run of the frame derives from its data (§4): the server's public batch (drawn from
    the run's held-out split), the held-out records left to measure accuracy on, the clip S
    (given, or calibrated on the public batch) and the trainable mask 𝕋 (FL-TOP; None: each round
    chooses its own, or every coordinate)."""

    public_x: torch.Tensor
    public_y: torch.Tensor
    evaluation: torch.Tensor  # held-out indices accuracy is measured on
    clip: float = 0.0
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class SubsetParams:
    keep_fraction: float = field(default=0.05, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                         "help": "r: share of the n coordinates exchanged (K = ⌊r·n⌋)"})
    public_size: int = field(default=10, metadata={"min": 1, "help": "server's public batch, drawn from the held-out split"})


@dataclass(frozen=True)
class SubsetDPParams(SubsetParams):
    clip: float = field(default=0.0, metadata={"min": 0.0, "help": "S (0: calibrate on the public batch, §4)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True,
                                                              "help": "σ: noise of the sum is Sσ (set from 'epsilons')"})


class SubsetFL(Defense):
    """Shared round logic: a trainable-coordinate mask, what is exchanged, optional clip and noise."""

    downstream_full: ClassVar[bool] = False  # the full model goes down (FL-BASIC, FL-STD, FL-CS)
    extra_rounds: ClassVar[int] = 0

    @property
    def observes(self) -> str:
        return "aggregate" if self.private else "uploads"

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.weight_decay:
            raise UserInputError(f"training.weight_decay: {self.name} freezes coordinates, which weight decay would move; use 0")
        if training.aggregation != "uniform":
            raise UserInputError(f"training.aggregation: {self.name} averages uniformly (Alg. 1); use 'uniform'")

    # ---------------------------------------------------------------- round structure

    def trainable(self, ctx: RoundContext) -> torch.Tensor | None:
        """Boolean mask of the coordinates clients train this round (None: all); the run's own
        (``ctx.state.mask``) where it was chosen before the first round."""
        state = ctx.state
        return state.mask if isinstance(state, SubsetState) else None

    def local_objective(self) -> LocalObjective:
        return MaskedObjective(self)

    def upload_floats(self, dim: int) -> int:
        return kept_count(self.params.keep_fraction, dim)

    def download_floats(self, dim: int) -> int:
        return dim if self.downstream_full else kept_count(self.params.keep_fraction, dim)

    def prepare(self, job, model=None, initial=None) -> SubsetState:
        """The run's public batch and evaluation split; the clip S (given, or :meth:`calibrated_clip`
        on the public batch) and the mask (:meth:`trainable_mask`)."""
        # the server's public batch comes from the held-out split, and those records then leave the
        # split that measures accuracy (:meth:`test_split`): a model must not be scored on its own data
        choice = numpy_rng(job.seed, "public").choice(len(job.test_y), size=min(self.params.public_size, len(job.test_y) - 1),
                                                      replace=False)
        public = np.zeros(len(job.test_y), dtype=bool)
        public[choice] = True
        index = torch.as_tensor(np.flatnonzero(public), device=job.test_x.device)
        state = SubsetState(job.test_x[index], job.test_y[index],
                            torch.as_tensor(np.flatnonzero(~public), device=job.test_x.device),
                            float(getattr(self.params, "clip", 0.0)))
        mask, clip = self.trainable_mask(job, model, initial, state)
        if self.private and not state.clip and clip is None:
            clip = self.calibrated_clip(job, model, initial, state, mask)
        return replace(state, mask=mask, clip=state.clip if clip is None else clip)

    def trainable_mask(self, job, model, initial, state: SubsetState) -> tuple[torch.Tensor | None, float | None]:
        """The coordinates every round of the run trains (None: chosen per round, or all), and the clip S
        if choosing them calibrated it (None: :meth:`calibrated_clip` does, where S is not given)."""
        return None, None

    def calibrated_clip(self, job, model, initial, state: SubsetState, mask: torch.Tensor | None) -> float:
        """S from one server-side round on the public batch (§4): the norm of its update, with the
        run's mask (every coordinate when it has none)."""
        dim = sum(p.numel() for p in initial.values())
        trained = mask if mask is not None else torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
        update = masked_public_update(model, initial, trained, state.public_x, state.public_y, job.training, job.seed)
        return float(torch.linalg.vector_norm(update.double()))

    def test_split(self, job, state: DefenseState = NO_STATE) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(state, SubsetState):
            raise ValueError(f"{self.name}: the test split of a run is known once the run is prepared (its public batch "
                             "leaves it)")
        return job.test_x[state.evaluation], job.test_y[state.evaluation]

    def bandwidth(self, dim: int) -> dict[str, float]:
        return {"bits_up_per_client": BITS_PER_FLOAT * self.upload_floats(dim),
                "bits_down_per_client": BITS_PER_FLOAT * self.download_floats(dim)}

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        mask = self.trainable(ctx)
        sparse = updates if mask is None else updates * mask.to(updates.dtype)
        diagnostics = {**self.bandwidth(updates.shape[1]),
                       "clip_input_norms": torch.linalg.vector_norm(sparse.to(torch.float64), dim=1)}
        if not self.private:
            return sparse, diagnostics
        clip = run_clip(ctx)
        clipped, _, was_clipped = clip_rows(sparse, clip)
        std = clip * self.params.noise_multiplier / math.sqrt(len(ctx.participants))
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noise = gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
        if mask is not None:
            noise = noise * mask.to(noise.dtype)  # noise only on the exchanged coordinates
        diagnostics.update(clip_fraction=float(was_clipped.double().mean()), clip=clip)
        return clipped + noise, diagnostics

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return uploads.sum(0) / len(ctx.participants)  # with SecAgg the server only ever forms this sum

    # ---------------------------------------------------------------- accounting

    def schedule(self, training: TrainingConfig, num_clients: int, rounds: int | None = None) -> GaussianSchedule:
        steps = (training.rounds if rounds is None else rounds) + self.extra_rounds
        return GaussianSchedule(self.params.noise_multiplier, training.sampling_rate(num_clients), steps,
                                training.sampling, num_clients)

    def calibrate(self, target_epsilon, delta, training, num_clients, accounting) -> Defense:
        if not self.private:
            return super().calibrate(target_epsilon, delta, training, num_clients, accounting)
        sigma = calibrate_noise(target_epsilon, self.schedule(training, num_clients), delta,
                                accounting.accountant, accounting.conversion)
        return self.with_params(noise_multiplier=sigma)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting: AccountingSettings,
                      state: DefenseState = NO_STATE) -> PrivacyClaim:
        dim = self.layout.dim if self.layout is not None else 0
        kilobytes = {"table_kb_up": table_kilobytes(self.upload_floats(dim), rounds, training.sampling_rate(num_clients)),
                     "table_kb_down": table_kilobytes(self.download_floats(dim), rounds, training.sampling_rate(num_clients))}
        if not self.private:
            claim = PrivacyClaim.non_private("non-private; bandwidth per client (paper's formula): "
                                             f"{kilobytes['table_kb_up']:.2f} KB up, {kilobytes['table_kb_down']:.2f} KB down")
            return replace(claim, alternatives=kilobytes)
        schedule = self.schedule(training, num_clients, rounds)
        largest = training.round_size(num_clients) if training.sampling == "fixed" else num_clients
        sigma = self.params.noise_multiplier
        # Alg. 3: client noise Sσ/√|𝕂| under secure aggregation, so the server sees the sum (σ) and
        # knows 𝕂 (no amplification); one upload alone carries σ/√|𝕂| ≥ σ/√m_max
        reach = GaussianRounds(sigma, sigma / math.sqrt(largest), "aggregate", schedule.steps,
                               training.sampling_rate(num_clients), training.sampling, num_clients,
                               "secure aggregation: the server sees only the sum, but it picks the participants 𝕂")
        adversaries = gaussian_adversaries(reach, delta, accounting.accountant, accounting.conversion)
        # Alg. 1 and 3 average over the realised |𝕂| (:meth:`aggregate`), which reveals it: zero-out
        adversaries, relabelled = divided_by_realised_count(adversaries)
        released = adversaries[0]
        notes = ["client-level; requires secure aggregation (each client's own noise is only Sσ/√|𝕂|)",
                 *([relabelled] if relabelled else []),
                 "the amplified ε holds against observers of the released models; the server, which picks 𝕂, "
                 f"gets ε = {adversaries[1].epsilon:.4g}",
                 "the clip S is calibrated on public data" if not getattr(self.params, "clip", 0.0) else "fixed clip S",
                 f"bandwidth per client (paper's formula): {kilobytes['table_kb_up']:.2f} KB up, "
                 f"{kilobytes['table_kb_down']:.2f} KB down"]
        if self.extra_rounds:
            notes.append("private Top-K selection costs one extra noisy round, accounted")
        return PrivacyClaim(released.epsilon, delta, Unit.CLIENT, released.accountant, schedule.describe(), "; ".join(notes),
                            kilobytes, relation=released.relation, adversary=Observer.RELEASED, adversaries=adversaries)

    def epsilon_trajectory(self, training, num_clients, delta, accounting, state: DefenseState = NO_STATE) -> list[float] | None:
        if not self.private:
            return None
        schedule = self.schedule(training, num_clients, training.rounds)
        trajectory = epsilon_trajectory(schedule, delta, accounting.conversion)
        return [float(e) for e in trajectory[self.extra_rounds:]]

    def audit_hooks(self) -> SubsetAuditHooks:
        return SubsetAuditHooks(self)


def run_clip(ctx: RoundContext) -> float:
    """The clip S of the run ``ctx`` belongs to (given, or calibrated when it was prepared)."""
    state = ctx.state
    if not isinstance(state, SubsetState):
        raise ValueError("the clip of a run is known once the run is prepared (SubsetFL.prepare)")
    return state.clip


class SubsetAuditHooks(AuditHooks):
    """Canary clients of the DP variants carry the run's S, once calibrated on its public batch (they
    clip the exchanged vector to S); the rest as by default."""

    defense: SubsetFL

    def __init__(self, defense: SubsetFL):
        super().__init__(defense, clips_updates=defense.private)

    def clip_bound(self, state: DefenseState | None = None) -> float | None:
        clip = state.clip if isinstance(state, SubsetState) else getattr(self.defense.params, "clip", 0.0)
        return float(clip) if self.defense.private and clip > 0 else None

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """The DP variants take Dirac canary clients, each read off the defense's own round
        (:mod:`defenses.federated.dirac_passage`): restricted to the trainable coordinates, clipped to
        the run's S, noised only where clients exchange. A canary on a coordinate the round does
        not train contributes nothing there, as a client would: its coin is read all the same."""
        return None if self.defense.private else "it makes no DP claim"

    def released_coordinates(self, ctx: RoundContext) -> torch.Tensor | None:
        """The round's trainable coordinates 𝕋 (public: chosen on public data or by the server's
        draw): the others stay as they were, noise-free."""
        return self.defense.trainable(ctx)
