"""Constrained DP federated learning for low-bandwidth devices: Kerkouche, Ács, Castelluccia,
Genevès, "Constrained Differentially Private Federated Learning for Low-bandwidth Devices"
(UAI 2021; spec 003 §2) — FL-TOP(-DP) and the baselines it is compared with.

* **FL-TOP** (Alg. 1, 2): before training the server runs T_init SGD steps on a small public
  batch and keeps the K = ⌊r·n⌋ coordinates with the largest accumulated |gradient| (§2.1).
  Clients train only those K weights (Top_k-SGD: the others stay at w0 bit for bit) and
  exchange only K values each way. **FL-TOP-DP** (Alg. 3): each client clips its K-dim update to
  S and adds N(0, (Sσ)²/|𝕂|); secure aggregation gives the server only the sum (§2.4). The clip
  S is calibrated on the public batch: one server-side round, S = ‖(w − w0)[𝕋]‖₂. Optional
  ``topk_selection: private`` (§2.8) chooses 𝕋 from the clients' noisy local top-K indicators in
  one extra round instead of public data, and accounts for that round.
* **FL-BASIC(-DP)** (§4): a fresh random K-subset per round, shared by all clients; the others
  stay at the previous global model; full model down, K values up; S = the median over 100
  random subsets of the public round's norm (§2.6).
* **FL-STD(-DP)**: FedAvg with the full model each way; DP as FL-TOP-DP with 𝕋 = everything.
* **FL-CS(-DP)** (§2.7, Kerkouche et al. 2021 "Compression boosts DP FL", as the spec proposes
  it — the original paper was not available offline to check the operator or the solver): per
  chunk of 10⁴ coordinates, m = ⌊r·b⌋ rows of the orthonormal DCT-II chosen by a per-round
  shared seed compress the update, y = A·Δ (linear, so secure aggregation works); DP clips y to
  S and adds noise; the server reconstructs Δ̂ = argmin ½‖A x − ȳ‖² + λ‖x‖₁ with FISTA.

Bandwidth (§2.9): every round logs the exact bits each participating client sends and receives
(32-bit floats), and the claim states the paper's table formula KB = ⌊r·n⌋·32·Round·C/8000.
Accounting: each round is a sampled Gaussian (Poisson rate C, multiplier σ) on the client level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from scipy import fft
from torch.func import functional_call, grad

from audit.core.errors import UserInputError
from audit.core.seeding import numpy_rng, torch_generator
from defenses.accounting import (
    GaussianSchedule,
    calibrate_noise,
    epsilon_trajectory,
)
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.claims import GaussianRounds, gaussian_adversaries
from defenses.clipping import clip_rows
from defenses.engine import RoundContext, TrainingConfig
from defenses.local_training import (
    LocalObjective,
    LocalSchedule,
    OptimizerSettings,
    client_batches,
    train_batched,
)
from defenses.noise import gaussian_rows
from defenses.sparsify import exact_count

BITS_PER_FLOAT = 32


def table_kilobytes(floats: int, rounds: int, client_rate: float) -> float:
    """The paper's bandwidth cell (spec 003 §2.9): floats·32·Round·C/8000, in KB of 1000 bytes."""
    return floats * BITS_PER_FLOAT * rounds * client_rate / 8000.0


def kept_count(fraction: float, dim: int) -> int:
    """K = ⌊r·n⌋ in exact arithmetic (the floor reproduces the paper's byte counts exactly)."""
    return exact_count(fraction, dim, "floor")


# --------------------------------------------------------------------------- server-side work on public data


def select_top_k(model: torch.nn.Module, initial: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, steps: int,
                 lr: float, keep: int, score: str) -> torch.Tensor:
    """§2.1: T_init SGD steps on one public batch; the K coordinates with the largest Σ|g|
    (``score: abs_gradient``) or the largest |w_T − w0| (``change``), sorted; ties by lower index."""
    params = {n: p.detach().clone() for n, p in initial.items()}
    names = list(params)
    accumulated = torch.zeros(sum(p.numel() for p in params.values()), dtype=torch.float64)

    def loss(p):
        return F.cross_entropy(functional_call(model, p, (x,)), y)

    for _ in range(steps):
        gradients = grad(loss)(params)
        accumulated += torch.cat([gradients[n].reshape(-1) for n in names]).abs().double().cpu()
        params = {n: params[n] - lr * gradients[n] for n in names}
    if score == "change":
        accumulated = torch.cat([(params[n] - initial[n]).reshape(-1) for n in names]).abs().double().cpu()
    order = torch.sort(accumulated, descending=True, stable=True).indices[:keep]
    return torch.sort(order).values


def masked_public_update(model, initial, mask: torch.Tensor, x, y, training: TrainingConfig, seed: int) -> torch.Tensor:
    """One client-like local round on the public batch with only ``mask`` trainable (§2.4): the update vector."""
    batches = client_batches(len(y), training.local_unit, training.local_steps, training.batch_size,
                             numpy_rng(seed, "public", "calibration"))
    schedule = LocalSchedule.build([batches], [np.arange(len(y))])
    objective = MaskedObjective(None)
    objective.set_mask(mask, initial)
    local = train_batched(model, objective, initial, schedule, x, y, OptimizerSettings(training.lr))
    names = list(initial)
    return torch.cat([(local[n][0] - initial[n]).reshape(-1) for n in names])


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


# --------------------------------------------------------------------------- the family


@dataclass(frozen=True)
class SubsetParams:
    keep_fraction: float = field(default=0.05, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                         "help": "r: share of the n coordinates exchanged (K = ⌊r·n⌋)"})
    public_size: int = field(default=10, metadata={"min": 1, "help": "server's public batch, drawn from the held-out split"})


@dataclass(frozen=True)
class SubsetDPParams(SubsetParams):
    clip: float = field(default=0.0, metadata={"min": 0.0, "help": "S (0: calibrate on the public batch, §2.4/§2.6)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True,
                                                              "help": "σ: noise of the sum is Sσ (set from 'epsilons')"})


class _SubsetFL(Defense):
    """Shared round logic: a trainable-coordinate mask, what is exchanged, optional clip and noise."""

    downstream_full: ClassVar[bool] = False  # the full model goes down (FL-BASIC, FL-STD, FL-CS)
    extra_rounds: ClassVar[int] = 0

    def __init__(self, params=None, layout=None):
        super().__init__(params, layout)
        self._clip = getattr(self.params, "clip", 0.0)
        self._public: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def observes(self) -> str:
        return "aggregate" if self.private else "uploads"

    def canary_norm(self, honest_norms: torch.Tensor) -> float:
        # S, once calibrated on the public batch (the DP variants clip the exchanged vector to S)
        return float(self._clip) if self.private and self._clip > 0 else super().canary_norm(honest_norms)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.weight_decay:
            raise UserInputError(f"training.weight_decay: {self.name} freezes coordinates, which weight decay would move; use 0")
        if training.aggregation != "uniform":
            raise UserInputError(f"training.aggregation: {self.name} averages uniformly (Alg. 1); use 'uniform'")

    # ---------------------------------------------------------------- round structure

    def trainable(self, ctx: RoundContext) -> torch.Tensor | None:
        """Boolean mask of the coordinates clients train this round (None: all)."""
        return None

    def local_objective(self) -> LocalObjective:
        return MaskedObjective(self)

    def upload_floats(self, dim: int) -> int:
        return kept_count(self.params.keep_fraction, dim)

    def download_floats(self, dim: int) -> int:
        return dim if self.downstream_full else kept_count(self.params.keep_fraction, dim)

    def prepare(self, job, model=None, initial=None) -> None:
        # the server's public batch comes from the held-out split, and those records then leave the
        # split that measures accuracy (:meth:`test_split`): a model must not be scored on its own data
        choice = numpy_rng(job.seed, "public").choice(len(job.test_y), size=min(self.params.public_size, len(job.test_y) - 1),
                                                      replace=False)
        public = np.zeros(len(job.test_y), dtype=bool)
        public[choice] = True
        index = torch.as_tensor(np.flatnonzero(public), device=job.test_x.device)
        self._public = (job.test_x[index], job.test_y[index])
        self._evaluation = torch.as_tensor(np.flatnonzero(~public), device=job.test_x.device)
        self._seed = job.seed

    def test_split(self, job) -> tuple[torch.Tensor, torch.Tensor]:
        return job.test_x[self._evaluation], job.test_y[self._evaluation]

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
        clipped, _, was_clipped = clip_rows(sparse, self._clip)
        std = self._clip * self.params.noise_multiplier / math.sqrt(len(ctx.participants))
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noise = gaussian_rows(len(ctx.participants), updates.shape[1], std, generators, updates.device)
        if mask is not None:
            noise = noise * mask.to(noise.dtype)  # noise only on the exchanged coordinates
        diagnostics.update(clip_fraction=float(was_clipped.double().mean()), clip=self._clip)
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

    def privacy_claim(self, training, num_clients, rounds, delta, accounting: AccountingSettings) -> PrivacyClaim:
        dim = self.layout.dim if self.layout is not None else 0
        kilobytes = {"table_kb_up": table_kilobytes(self.upload_floats(dim), rounds, training.sampling_rate(num_clients)),
                     "table_kb_down": table_kilobytes(self.download_floats(dim), rounds, training.sampling_rate(num_clients))}
        if not self.private:
            claim = PrivacyClaim.non_private(f"non-private; bandwidth per client (paper's formula): {kilobytes['table_kb_up']:.2f} KB up, "
                                             f"{kilobytes['table_kb_down']:.2f} KB down")
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
        released = adversaries[0]
        notes = ["client-level; requires secure aggregation (each client's own noise is only Sσ/√|𝕂|)",
                 "the amplified ε holds against observers of the released models; the server, which picks 𝕂, "
                 f"gets ε = {adversaries[1].epsilon:.4g}",
                 "the clip S is calibrated on public data" if not getattr(self.params, "clip", 0.0) else "fixed clip S",
                 f"bandwidth per client (paper's formula): {kilobytes['table_kb_up']:.2f} KB up, {kilobytes['table_kb_down']:.2f} KB down"]
        if self.extra_rounds:
            notes.append("private Top-K selection costs one extra noisy round, accounted")
        return PrivacyClaim(released.epsilon, delta, "client", released.accountant, schedule.describe(), "; ".join(notes),
                            kilobytes, relation=released.relation, adversary="released", adversaries=adversaries)

    def epsilon_trajectory(self, training, num_clients, delta, accounting) -> list[float] | None:
        if not self.private:
            return None
        schedule = self.schedule(training, num_clients, training.rounds)
        trajectory = epsilon_trajectory(schedule, delta, accounting.conversion)
        return [float(e) for e in trajectory[self.extra_rounds:]]


# --------------------------------------------------------------------------- FL-TOP


@dataclass(frozen=True)
class FLTopParams(SubsetParams):
    init_steps: int = field(default=10, metadata={"min": 1, "help": "T_init: SGD steps on the public batch"})
    topk_score: Literal["abs_gradient", "change"] = field(default="abs_gradient", metadata={"help": "Σ|g| (default) or |w_T − w0|"})


@dataclass(frozen=True)
class FLTopDPParams(SubsetDPParams):
    init_steps: int = field(default=10, metadata={"min": 1, "help": "T_init: SGD steps on the public batch"})
    topk_score: Literal["abs_gradient", "change"] = field(default="abs_gradient", metadata={"help": "Σ|g| (default) or |w_T − w0|"})
    topk_selection: Literal["public", "private"] = field(
        default="public", metadata={"help": "choose the Top-K on public data, or from the clients' noisy local top-K (§2.8)"})


class _TopK(_SubsetFL):
    def prepare(self, job, model=None, initial=None) -> None:
        super().prepare(job, model, initial)
        dim = sum(p.numel() for p in initial.values())
        keep = kept_count(self.params.keep_fraction, dim)
        if getattr(self.params, "topk_selection", "public") == "private":
            indices = self._private_selection(job, model, initial, keep)
        else:
            x, y = self._public
            indices = select_top_k(model, initial, x, y, self.params.init_steps, job.training.lr, keep, self.params.topk_score)
        self._mask = torch.zeros(dim, dtype=torch.bool, device=job.pool_x.device)
        self._mask[indices.to(self._mask.device)] = True
        if self.private and not self.params.clip:
            update = masked_public_update(model, initial, self._mask, *self._public, job.training, job.seed)
            self._clip = float(torch.linalg.vector_norm(update.double()))

    def _private_selection(self, job, model, initial, keep: int) -> torch.Tensor:
        """§2.8: sampled clients train from w0, send their local top-K indicator (scaled to norm S
        and noised as in FL-TOP-DP), the server keeps the K largest of the noisy sum."""
        dim = sum(p.numel() for p in initial.values())
        if not self.params.clip:  # calibrate S on the public batch with every coordinate trainable
            full = torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
            self._clip = float(torch.linalg.vector_norm(masked_public_update(model, initial, full, *self._public,
                                                                            job.training, job.seed).double()))
        rng = numpy_rng(job.seed, "private-topk", "sampling")
        chosen = np.flatnonzero(rng.random(len(job.clients)) < job.training.sampling_rate(len(job.clients)))
        if len(chosen) == 0:
            # the accounted round is a Poisson-sampled Gaussian, which releases N(0, S²σ²) even when
            # nobody is sampled: the server draws the noise itself (forcing a client in would not be)
            noise = gaussian_rows(1, dim, self._clip * self.params.noise_multiplier,
                                  [torch_generator(job.seed, "private-topk", "server", "noise")], job.pool_x.device)[0]
            return torch.sort(torch.sort(noise, descending=True, stable=True).indices[:keep]).values
        batches = [client_batches(len(job.clients[c]), job.training.local_unit, job.training.local_steps, job.training.batch_size,
                                  numpy_rng(job.seed, "private-topk", "client", int(c))) for c in chosen]
        schedule = LocalSchedule.build(batches, [job.clients[c] for c in chosen], chosen)
        local = train_batched(model, LocalObjective(), initial, schedule, job.pool_x, job.pool_y, OptimizerSettings(job.training.lr))
        start = torch.cat([p.reshape(-1) for p in initial.values()])
        changes = torch.cat([local[n].reshape(len(chosen), -1) for n in initial], dim=1) - start
        indicators = torch.zeros_like(changes)
        top = torch.sort(changes.abs(), dim=1, descending=True, stable=True).indices[:, :keep]
        indicators.scatter_(1, top, self._clip / math.sqrt(keep))  # ℓ2 norm S
        std = self._clip * self.params.noise_multiplier / math.sqrt(len(chosen))
        generators = [torch_generator(job.seed, "private-topk", "client", int(c), "noise") for c in chosen]
        noisy = (indicators + gaussian_rows(len(chosen), dim, std, generators, indicators.device)).sum(0)
        return torch.sort(torch.sort(noisy, descending=True, stable=True).indices[:keep]).values

    @property
    def extra_rounds(self) -> int:  # type: ignore[override]
        return 1 if getattr(self.params, "topk_selection", "public") == "private" else 0

    def trainable(self, ctx: RoundContext) -> torch.Tensor:
        return self._mask


@DEFENSES.register("fl-top")
class FLTop(_TopK):
    name = "fl-top"
    summary = "Clients train and exchange only a Top-K set of coordinates chosen on public data (non-private)"
    reference = "Kerkouche et al. 2021, Constrained Differentially Private FL for Low-bandwidth Devices (Alg. 1, 2)"
    Params = FLTopParams


@DEFENSES.register("fl-top-dp")
class FLTopDP(_TopK):
    name = "fl-top-dp"
    summary = "FL-TOP with client clipping and noise Sσ/√|𝕂| under secure aggregation (client-level DP)"
    reference = "Kerkouche et al. 2021, Constrained Differentially Private FL for Low-bandwidth Devices (Alg. 3)"
    Params = FLTopDPParams
    private = True


# --------------------------------------------------------------------------- FL-BASIC


@dataclass(frozen=True)
class FLBasicDPParams(SubsetDPParams):
    calibration_subsets: int = field(default=100, metadata={"min": 1, "help": "random subsets for the median clip (§2.6)"})


class _Basic(_SubsetFL):
    downstream_full = True

    def trainable(self, ctx: RoundContext) -> torch.Tensor:
        dim = ctx.layout.dim
        order = torch.randperm(dim, generator=ctx.server_generator("random-subset"))
        mask = torch.zeros(dim, dtype=torch.bool)
        mask[order[:kept_count(self.params.keep_fraction, dim)]] = True
        return mask.to(ctx.global_vector.device)

    def prepare(self, job, model=None, initial=None) -> None:
        super().prepare(job, model, initial)
        if self.private and not self.params.clip:
            dim = sum(p.numel() for p in initial.values())
            keep = kept_count(self.params.keep_fraction, dim)
            norms = []
            for k in range(self.params.calibration_subsets):
                order = torch.randperm(dim, generator=torch_generator(job.seed, "basic-calibration", k))
                mask = torch.zeros(dim, dtype=torch.bool)
                mask[order[:keep]] = True
                update = masked_public_update(model, initial, mask.to(job.pool_x.device), *self._public, job.training, job.seed)
                norms.append(float(torch.linalg.vector_norm(update.double())))
            self._clip = float(np.median(norms))


@DEFENSES.register("fl-basic")
class FLBasic(_Basic):
    name = "fl-basic"
    summary = "Clients train and upload a fresh random K-subset each round; the full model goes down (non-private)"
    reference = "Kerkouche et al. 2021 (§4 baseline FL-BASIC)"
    Params = SubsetParams


@DEFENSES.register("fl-basic-dp")
class FLBasicDP(_Basic):
    name = "fl-basic-dp"
    summary = "FL-BASIC with clipping and noise under secure aggregation"
    reference = "Kerkouche et al. 2021 (§4 baseline FL-BASIC-DP)"
    Params = FLBasicDPParams
    private = True


# --------------------------------------------------------------------------- FL-STD


@dataclass(frozen=True)
class FLStdParams:
    public_size: int = field(default=10, metadata={"min": 1, "help": "public batch for the clip calibration"})
    keep_fraction: float = field(default=1.0, metadata={"min": 1.0, "max": 1.0, "help": "always 1: the full model"})


@dataclass(frozen=True)
class FLStdDPParams(FLStdParams):
    clip: float = field(default=0.0, metadata={"min": 0.0, "help": "S (0: calibrate on the public batch)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True, "help": "σ"})


class _Std(_SubsetFL):
    downstream_full = True

    def prepare(self, job, model=None, initial=None) -> None:
        super().prepare(job, model, initial)
        if self.private and not self.params.clip:
            dim = sum(p.numel() for p in initial.values())
            full = torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
            self._clip = float(torch.linalg.vector_norm(masked_public_update(model, initial, full, *self._public,
                                                                            job.training, job.seed).double()))


@DEFENSES.register("fl-std")
class FLStd(_Std):
    name = "fl-std"
    summary = "Standard FedAvg with uniform averaging, the full model each way (the paper's reference)"
    reference = "Kerkouche et al. 2021 (FL-STD baseline)"
    Params = FLStdParams


@DEFENSES.register("fl-std-dp")
class FLStdDP(_Std):
    name = "fl-std-dp"
    summary = "FL-STD with clipping and client noise under secure aggregation (S calibrated on public data)"
    reference = "Kerkouche et al. 2021 (FL-STD-DP baseline)"
    Params = FLStdDPParams
    private = True


# --------------------------------------------------------------------------- FL-CS


@dataclass(frozen=True)
class FLCSParams(SubsetParams):
    chunk: int = field(default=10_000, metadata={"min": 16, "help": "coordinates per compressed chunk"})
    solver_iterations: int = field(default=50, metadata={"min": 1, "help": "FISTA iterations of the server's reconstruction"})
    sparsity_weight: float = field(default=0.05, metadata={"min": 0.0, "help": "λ relative to max|Aᵀȳ| in the ℓ1 reconstruction"})


@dataclass(frozen=True)
class FLCSDPParams(FLCSParams):
    clip: float = field(default=0.0, metadata={"min": 0.0, "help": "S on the compressed update (0: calibrate on the public batch)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True, "help": "σ"})


class PartialDCT:
    """m_j rows of the orthonormal DCT-II of each chunk j: A Aᵀ = I, so the least-squares step of
    FISTA has step size 1 and Aᵀ is the exact adjoint."""

    def __init__(self, dim: int, chunk: int, fraction: float, generator: torch.Generator):
        self.bounds = [(s, min(dim, s + chunk)) for s in range(0, dim, chunk)]
        self.rows = []
        for start, stop in self.bounds:
            width = stop - start
            kept = exact_count(fraction, width, "floor")
            self.rows.append(np.sort(torch.randperm(width, generator=generator)[:kept].numpy()))
        self.measurements = sum(len(r) for r in self.rows)

    def compress(self, x: np.ndarray) -> np.ndarray:
        """[C, d] → [C, M]."""
        return np.concatenate([fft.dct(x[:, s:e], norm="ortho", axis=1)[:, rows] for (s, e), rows in zip(self.bounds, self.rows)], axis=1)

    def adjoint(self, y: np.ndarray) -> np.ndarray:
        """[M] → [d]."""
        out, offset = [], 0
        for (start, stop), rows in zip(self.bounds, self.rows):
            full = np.zeros(stop - start)
            full[rows] = y[offset:offset + len(rows)]
            offset += len(rows)
            out.append(fft.idct(full, norm="ortho"))
        return np.concatenate(out)

    def reconstruct(self, y: np.ndarray, iterations: int, weight: float) -> np.ndarray:
        """FISTA for argmin ½‖Ax − y‖² + λ‖x‖₁, λ = weight·max|Aᵀy| (Beck & Teboulle 2009)."""
        start = self.adjoint(y)
        threshold = weight * float(np.abs(start).max()) if len(start) else 0.0
        x = previous = np.zeros_like(start)
        momentum, z = 1.0, x
        for _ in range(iterations):
            residual = self.compress(z[None, :])[0] - y
            step = z - self.adjoint(residual)
            x = np.sign(step) * np.maximum(np.abs(step) - threshold, 0.0)
            following = (1 + math.sqrt(1 + 4 * momentum ** 2)) / 2
            z = x + ((momentum - 1) / following) * (x - previous)
            previous, momentum = x, following
        return x


class _CS(_SubsetFL):
    downstream_full = True

    def sketch(self, ctx: RoundContext) -> PartialDCT:
        return PartialDCT(ctx.layout.dim, self.params.chunk, self.params.keep_fraction, ctx.server_generator("sketch"))

    def upload_floats(self, dim: int) -> int:
        return sum(exact_count(self.params.keep_fraction, min(self.params.chunk, dim - s), "floor")
                   for s in range(0, dim, self.params.chunk))

    def prepare(self, job, model=None, initial=None) -> None:
        super().prepare(job, model, initial)
        if self.private and not self.params.clip:
            dim = sum(p.numel() for p in initial.values())
            full = torch.ones(dim, dtype=torch.bool, device=job.pool_x.device)
            update = masked_public_update(model, initial, full, *self._public, job.training, job.seed)
            sketch = PartialDCT(dim, self.params.chunk, self.params.keep_fraction, torch_generator(job.seed, "cs-calibration"))
            self._clip = float(np.linalg.norm(sketch.compress(update.double().cpu().numpy()[None, :])))

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        measured = torch.as_tensor(self.sketch(ctx).compress(updates.double().cpu().numpy()), device=updates.device)
        diagnostics = {**self.bandwidth(updates.shape[1]), "clip_input_norms": torch.linalg.vector_norm(measured, dim=1)}
        if not self.private:
            return measured, diagnostics
        clipped, _, was_clipped = clip_rows(measured, self._clip)
        std = self._clip * self.params.noise_multiplier / math.sqrt(len(ctx.participants))
        generators = [ctx.client_generator(int(c), "noise") for c in ctx.participants]
        noisy = clipped + gaussian_rows(len(ctx.participants), measured.shape[1], std, generators, updates.device).double()
        diagnostics.update(clip_fraction=float(was_clipped.double().mean()), clip=self._clip)
        return noisy, diagnostics

    def release_statistic(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """The mean of the (noisy) compressed uploads; the ℓ1 reconstruction is post-processing of it."""
        return uploads.sum(0) / len(ctx.participants)

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        mean = self.release_statistic(uploads, ctx).cpu().numpy()
        estimate = self.sketch(ctx).reconstruct(mean, self.params.solver_iterations, self.params.sparsity_weight)
        return torch.as_tensor(estimate, dtype=ctx.global_vector.dtype, device=ctx.global_vector.device)


@DEFENSES.register("fl-cs")
class FLCS(_CS):
    name = "fl-cs"
    summary = "Compressive sensing of updates (partial DCT up, ℓ1 reconstruction at the server; non-private)"
    reference = "Kerkouche et al. 2021, Compression Boosts Differentially Private Federated Learning (as spec 003 §2.7 proposes)"
    Params = FLCSParams


@DEFENSES.register("fl-cs-dp")
class FLCSDP(_CS):
    name = "fl-cs-dp"
    summary = "FL-CS with the compressed update clipped and noised under secure aggregation"
    reference = "Kerkouche et al. 2021, Compression Boosts Differentially Private Federated Learning (as spec 003 §2.7 proposes)"
    Params = FLCSDPParams
    private = True
