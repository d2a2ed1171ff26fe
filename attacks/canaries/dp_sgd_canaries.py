"""Dirac gradient canaries for record-level DP-SGD (Opacus), read white box at every step.

**Design** (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4:
Dirac gradient canaries, every iterate observed; Steinke, Nasr, Jagielski 2023, "Privacy
Auditing with One (1) Training Run": independent coins counted in one run). A run carries K
canaries; canary k owns a distinct flat parameter coordinate j_k (at most one canary per
coordinate, so a run holds at most d of them) and a sign s_k, and is *inserted* by an
independent fair coin. A held-out canary is absent (record-level add/remove). An inserted
canary is sampled like a record: at every optimiser step it joins the batch independently with
the sampling rate q of the claim's Poisson sampling. When it joins, its per-example gradient
s_k·U·e_{j_k} (U = ``amplitude``·C, C the clip norm; 10·C by default) is appended to every
parameter's ``p.grad_sample`` *before* Opacus's ``DPOptimizer.pre_step`` runs, so Opacus's own
code clips it (to C: DP-SGD, Abadi et al. 2016, Alg. 1), sums it with the batch, adds its
Gaussian noise N(0, σ²C²) and divides by its expected batch size B. Nothing here clips, noises
or scales: a clip that is skipped shows as a shift of U instead of C, noise that is too small
as a reading that stands out from it.

**Reading.** After ``pre_step`` (noise and scaling done, before the wrapped optimiser's step)
the hook reads the released noisy averaged gradient ĝ_t at each canary's coordinate, for every
canary, inserted or not, at every step: ``sums[t, k]`` = ĝ_t[j_k]·B_t/C, the noisy clipped sum
in units of C. The standardised signed reading z_t = s·ĝ_t[j]·B/(σ·C) uses the σ the *claim*
accounts; it is N(0, 1) plus the real records' contribution when the canary is held out, and
shifted by μ = 1/σ in the steps it joined. The per-canary statistic is the mixture
log-likelihood ratio Σ_t log(1 − q + q·exp(μ·z_t − μ²/2)) of
:func:`audit.core.gaussian_canary_statistics.mixture_log_likelihood_ratio` — optimal against a
mechanism exactly as claimed when the observer does not know in which steps the canary took
part (the released models' observer of a Poisson-sampled DP-SGD run).

**Why canaries do not interfere with validity.** Each canary is one per-example gradient clipped
on its own, on its own coordinate; the rest is training dynamics. The one-run analyses hold for
any mechanism that is DP with respect to each canary whatever the other canaries do, because
they condition on the other coins (Steinke et al. 2023, Thm 3.1); interference can only cost
power. Any statistic gives a valid bound; this one has the most power against the claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.errors import UserInputError
from audit.core.gaussian_canary_statistics import mixture_log_likelihood_ratio
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: U / C: a canary's raw gradient is 10 clip norms long, so a clip that is skipped reads 10× the shift
AMPLITUDE = 10.0

#: the statistic, named for the reader of a result
STATISTIC = ("mixture log-likelihood ratio Σ_t log(1 − q + q·exp(μ·z_t − μ²/2)), μ = 1/σ, of the standardised signed "
             "readings z_t = s·ĝ_t[j]·B/(σ·C) of the noisy averaged gradient at the canary's coordinate in every step "
             "(participation hidden)")


@dataclass(frozen=True)
class CanaryPlan:
    """The canaries of one run: distinct flat coordinates, signs ±1 and insertion coins."""

    coords: np.ndarray  # int64 [K], distinct indices into the flat vector of the optimiser's parameters
    signs: np.ndarray  # float64 [K], ±1
    inserted: np.ndarray  # bool [K]

    def __post_init__(self) -> None:
        if len(np.unique(self.coords)) != len(self.coords):
            raise ValueError("canary coordinates must be distinct: one canary per parameter coordinate per run")
        if not (len(self.coords) == len(self.signs) == len(self.inserted)):
            raise ValueError("coords, signs and inserted must have one entry per canary")


def canaries_per_run(coins: int, parameters: int) -> tuple[int, int]:
    """(runs, canaries per run) for ``coins`` coins with at most one canary per coordinate of a
    model of ``parameters`` coordinates: the fewest runs, the canaries shared equally among them."""
    runs = math.ceil(coins / parameters)
    return runs, math.ceil(coins / runs)


def plan_run(parameters: int, canaries: int, seed: int, run: int) -> CanaryPlan:
    """Run ``run``'s canaries: ``canaries`` distinct coordinates of a uniformly random permutation,
    independent fair signs and fair insertion coins, each from its own stream keyed by the seed."""
    if not 1 <= canaries <= parameters:
        raise ValueError(f"a run holds 1..{parameters} canaries (one per coordinate), asked for {canaries}")
    coords = numpy_rng(seed, "dp-sgd-canaries", run, "coordinates").permutation(parameters)[:canaries]
    signs = np.where(numpy_rng(seed, "dp-sgd-canaries", run, "signs").random(canaries) < 0.5, -1.0, 1.0)
    inserted = numpy_rng(seed, "dp-sgd-canaries", run, "inserted").random(canaries) < 0.5
    return CanaryPlan(coords.astype(np.int64), signs, inserted)


class GradientCanaryHook:
    """Dirac gradient canaries inside one Opacus ``DPOptimizer`` (see the module docstring).

    ``attach(optimizer)`` — call it once, after ``PrivacyEngine.make_private`` — wraps the
    optimiser's ``pre_step`` (which :meth:`DPOptimizer.step` calls): the joining canaries' rows go
    into ``p.grad_sample`` before Opacus clips, and the released gradient is read after Opacus has
    noised and scaled it. The plan is ``plan`` when given, else drawn at attach time for a run of
    ``coins`` coins in all (:func:`canaries_per_run`), once the model's size is known.
    """

    def __init__(self, sample_rate: float, *, coins: int = 0, seed: int = 0, run: int = 0,
                 amplitude: float = AMPLITUDE, plan: CanaryPlan | None = None):
        if not 0.0 < sample_rate <= 1.0:
            raise UserInputError(f"sample_rate: must lie in (0, 1], got {sample_rate!r}")
        if not (math.isfinite(amplitude) and amplitude >= 1.0):
            raise UserInputError(f"amplitude: must be a finite number ≥ 1 (U = amplitude·C reaches the clip), got {amplitude!r}")
        self.sample_rate, self.coins, self.seed, self.run, self.amplitude = sample_rate, coins, seed, run, amplitude
        self.plan = plan
        self.parameters = 0
        self.runs = 1
        self.sums: list[np.ndarray] = []  # per step [K]: ĝ_t[j_k]·B_t / C
        self.joined: list[np.ndarray] = []  # per step [K] bool: the canaries that joined the batch
        self.attached = False
        self._participation = numpy_rng(seed, "dp-sgd-canaries", run, "participation")
        self._pending: np.ndarray | None = None

    def attach(self, optimizer: Any) -> None:
        """Insert the canaries into ``optimizer`` (an Opacus ``DPOptimizer`` with flat clipping)."""
        from opacus.optimizers import DPOptimizer

        # the rows are appended to p.grad_sample, which only DPOptimizer's flat clipping reads in this
        # form (per-layer, AdaClip and fast-gradient-clipping optimisers clip elsewhere or otherwise)
        if type(optimizer) is not DPOptimizer:
            raise UserInputError(f"attach: needs opacus.optimizers.DPOptimizer (flat per-example clipping), got "
                                 f"{type(optimizer).__name__}")
        if self.attached:
            raise UserInputError("attach: called twice; each training run attaches one fresh hook once")
        self.attached = True
        self.parameters = sum(p.numel() for p in optimizer.params)
        if self.plan is None:
            if self.coins < 1:
                raise UserInputError(f"coins: must be an integer ≥ 1, got {self.coins!r}")
            self.runs, per_run = canaries_per_run(self.coins, self.parameters)
            self.plan = plan_run(self.parameters, per_run, self.seed, self.run)
        elif int(self.plan.coords.max(initial=-1)) >= self.parameters:
            raise UserInputError(f"plan: coordinate {int(self.plan.coords.max())} beyond the model's {self.parameters}")
        released = optimizer.pre_step

        def pre_step(closure: Any = None) -> Any:
            # a step that only accumulates (a virtual batch split in physical ones) releases nothing:
            # the canary joins once per released step, with the last physical batch
            if not optimizer._check_skip_next_step(pop_next=False):
                self._insert(optimizer)
            done = released(closure)
            if done and self._pending is not None:
                self._read(optimizer)
            return done

        optimizer.pre_step = pre_step  # an instance attribute: DPOptimizer.step calls self.pre_step()

    @property
    def steps(self) -> int:
        return len(self.sums)

    def _insert(self, optimizer: Any) -> None:
        plan = self.plan
        assert plan is not None
        joined = plan.inserted & (self._participation.random(len(plan.coords)) < self.sample_rate)
        self._pending = joined
        chosen = np.flatnonzero(joined)
        if len(chosen) == 0:
            return
        values = plan.signs[chosen] * self.amplitude * float(optimizer.max_grad_norm)
        offset = 0
        for p in optimizer.params:
            size = p.numel()
            here = (plan.coords[chosen] >= offset) & (plan.coords[chosen] < offset + size)
            rows = torch.zeros(len(chosen), size, dtype=p.dtype, device=p.device)
            rows[torch.as_tensor(np.flatnonzero(here)), torch.as_tensor(plan.coords[chosen][here] - offset)] = (
                torch.as_tensor(values[here], dtype=p.dtype, device=p.device))
            rows = rows.view(len(chosen), *p.shape)
            if isinstance(p.grad_sample, list):  # accumulated physical batches: the rows join the last one
                p.grad_sample[-1] = torch.cat([p.grad_sample[-1], rows.to(p.grad_sample[-1].dtype)])
            else:
                p.grad_sample = torch.cat([p.grad_sample, rows.to(p.grad_sample.dtype)])
            offset += size

    def _read(self, optimizer: Any) -> None:
        plan = self.plan
        assert plan is not None and self._pending is not None
        flat = torch.cat([p.grad.detach().reshape(-1) for p in optimizer.params])
        # Opacus divided the noisy sum by B times the accumulated batches ("mean"), or by nothing ("sum")
        divisor = (float(optimizer.expected_batch_size) * optimizer.accumulated_iterations
                   if optimizer.loss_reduction == "mean" else 1.0)
        readings = flat[torch.as_tensor(plan.coords)].double().cpu().numpy()
        self.sums.append(readings * divisor / float(optimizer.max_grad_norm))
        self.joined.append(self._pending)
        self._pending = None

    def standardised(self, noise_multiplier: float) -> np.ndarray:
        """z [K, T]: the signed readings standardised by the claim's noise σ·C (N(0, 1) alone)."""
        assert self.plan is not None
        sums = np.stack(self.sums, axis=1) if self.sums else np.zeros((len(self.plan.coords), 0))
        return self.plan.signs[:, None] * sums / noise_multiplier

    def scores(self, noise_multiplier: float) -> np.ndarray:
        """Each canary's mixture log-likelihood ratio over the run's steps (:data:`STATISTIC`)."""
        return mixture_log_likelihood_ratio(self.standardised(noise_multiplier), mu=1.0 / noise_multiplier,
                                            rate=self.sample_rate)
