"""The trade-off curve of an accounted mechanism — Poisson-subsampled Gaussian or Laplace noise
composed over T steps — for the f-DP one-run test (:mod:`audit.core.fdp_one_run`).

**From the privacy profile.** A mechanism whose privacy profile is δ(ε) (the least δ for which it
is (ε, δ)-DP, for every ε ≥ 0) is f-DP for f = sup_ε f_{ε, δ(ε)}, with
f_{ε,δ}(x) = max(0, 1 − δ − e^ε·x, e^−ε·(1 − δ − x)) (Dong, Roth & Su 2022, "Gaussian differential
privacy", Prop. 2.12). The supremum over a finite grid of ε is a smaller curve, and an upper bound
on δ(ε) gives a smaller curve still: both keep the test valid (a mechanism that is f-DP is f′-DP
for every f′ ≤ f), they only cost power.

**The profile.** dp-accounting's privacy loss distribution (PLD) of the mechanism — the Gaussian or
Laplace additive-noise PLD at sensitivity 1, Poisson subsampling at rate q under add-or-remove
neighbours, self-composed T times — with its pessimistic discretisation, so that every δ(ε) it
returns is an upper bound (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, "Connect the dots").
Against a canary read in every step with participation hidden, an honest implementation of that
mechanism makes the counts of a one-run audit no larger than this curve allows (Mahloujifar,
Melis & Chaudhuri 2024), so a rejection says the code releases more than the mechanism accounted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

import numpy as np

from audit.core.empirical_epsilon import GUESS_FRACTIONS, OneRunAudit
from audit.core.fdp_one_run import TradeOff, fdp_p_value, fdp_rejects

#: ε grid points of a profile, and the largest ε looked at (beyond it δ(ε) is taken as its value there)
GRID_POINTS, LARGEST_EPSILON = 400, 60.0
#: the PLD's discretisation of the privacy loss (dp-accounting's ``value_discretization_interval``)
DISCRETISATION = 1e-3
KINDS = ("gaussian", "laplace")


@dataclass(frozen=True)
class ProfileTradeOff(TradeOff):
    """f = max over the grid of f_{ε_i, δ_i} (module docstring); ``deltas[i]`` ≥ δ(ε_i)."""

    epsilons: tuple[float, ...]
    deltas: tuple[float, ...]
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.epsilons) != len(self.deltas) or not self.epsilons:
            raise ValueError("epsilons and deltas: one δ per ε, at least one")
        epsilons = np.asarray(self.epsilons, dtype=np.float64)
        # computed once: the p-value recursion evaluates the curve thousands of times
        object.__setattr__(self, "_arrays", (np.asarray(self.deltas, dtype=np.float64), np.exp(epsilons), np.exp(-epsilons)))

    def __call__(self, x: float) -> float:
        x = min(max(float(x), 0.0), 1.0)
        deltas, grow, shrink = self._arrays
        return float(max(0.0, np.max(1.0 - deltas - grow * x), np.max(shrink * (1.0 - deltas - x))))

    def floor(self, y: float) -> float:
        # g(y) = f(1 − y) = max(0, e^−ε·(y − δ), 1 − δ − e^ε·(1 − y)): the first form keeps tiny y exact
        y = min(max(float(y), 0.0), 1.0)
        deltas, grow, shrink = self._arrays
        return float(max(0.0, np.max(shrink * (y - deltas)), np.max(1.0 - deltas - grow * (1.0 - y))))


def _pld(kind: str, parameter: float, rate: float, steps: int):
    from dp_accounting.pld import privacy_loss_distribution as pld

    if kind == "gaussian":
        one = pld.from_gaussian_mechanism(parameter, sampling_prob=rate, value_discretization_interval=DISCRETISATION)
    elif kind == "laplace":
        one = pld.from_laplace_mechanism(parameter, sampling_prob=rate, value_discretization_interval=DISCRETISATION)
    else:
        raise ValueError(f"kind: {kind!r}; allowed: {', '.join(KINDS)}")
    return one.self_compose(steps) if steps > 1 else one


@lru_cache(maxsize=64)
def composed_tradeoff(kind: str, parameter: float, rate: float, steps: int) -> ProfileTradeOff:
    """The curve of ``steps`` compositions of the ``kind`` mechanism at sensitivity 1 — noise std
    ``parameter`` (Gaussian) or scale ``parameter`` (Laplace) — Poisson-subsampled at ``rate``."""
    if not (parameter > 0 and math.isfinite(parameter)) or not 0 < rate <= 1 or steps < 1:
        raise ValueError(f"need parameter > 0, 0 < rate ≤ 1, steps ≥ 1; got {parameter}, {rate}, {steps}")
    composed = _pld(kind, float(parameter), float(rate), int(steps))
    epsilons = np.linspace(0.0, LARGEST_EPSILON, GRID_POINTS)
    deltas = np.clip(np.asarray(composed.get_delta_for_epsilon(epsilons), dtype=np.float64), 0.0, 1.0)
    return ProfileTradeOff(tuple(float(e) for e in epsilons), tuple(float(d) for d in deltas))


@lru_cache(maxsize=64)
def composed_epsilon(kind: str, parameter: float, rate: float, steps: int, delta: float) -> float:
    """ε at ``delta`` of the same composition (dp-accounting's PLD, pessimistic); kept, as the
    curve is: every audit of one mechanism holds its figure to the same ε."""
    return float(_pld(kind, float(parameter), float(rate), int(steps)).get_epsilon_for_delta(delta))


# --------------------------------------------------------------------------- the one-run test against the curve


@dataclass(frozen=True)
class MechanismOneRunAudit(OneRunAudit):
    """The f-DP analysis of one-run counts against the accounted mechanism's own composed curve
    (:func:`mechanism_one_run_audit`). ``epsilon`` is the ε at δ of the least noisy member of the
    mechanism's family — its noise parameter scaled by ``scale`` — whose curve the counts reject at
    alpha: the code leaks at least as much as that mechanism, and ``epsilon`` exceeds the accounted
    mechanism's own ε exactly when the counts reject it (``scale`` < 1)."""

    #: its power is simulated as the f-DP analysis's (a weight fixed before the data; verdicts on
    #: subsampled designs state no power)
    method: ClassVar[str] = "fdp"

    kind: str = "gaussian"
    parameter: float = 1.0  # the accounted noise: std (Gaussian) or scale (Laplace), at sensitivity 1
    rate: float = 1.0
    steps: int = 1
    scale: float = 0.0  # the least factor on the noise whose curve the counts reject, to 1 % (0: none up to 64)

    def count_p_value(self, guesses: int, correct: int, epsilon: float, delta: float) -> float:
        """The p-value of "the code is the accounted mechanism" (its whole curve; ε and δ unused)."""
        return fdp_p_value(self.canaries, guesses, correct, composed_tradeoff(self.kind, self.parameter, self.rate, self.steps))


def _rejects(canaries: int, tried: tuple[tuple[int, int], ...], curve: ProfileTradeOff, alpha: float) -> bool:
    return any(fdp_rejects(canaries, g, c, curve, alpha / len(tried)) for g, c in tried if g)


def mechanism_one_run_audit(canaries: int, tried: tuple[tuple[int, int], ...], kind: str, parameter: float, rate: float,
                            steps: int, delta: float, alpha: float = 0.05,
                            fractions: tuple[float, ...] = GUESS_FRACTIONS) -> MechanismOneRunAudit:
    """The counts ``tried`` ((guesses, correct) per abstention level, Bonferroni over them) against the
    ``kind`` mechanism with noise ``parameter``·s, Poisson rate ``rate``, ``steps`` compositions:
    the least s whose curve they reject at ``alpha`` (to 1 % by bisection on log s, within
    [1/64, 64]) and that mechanism's ε at ``delta`` (0 when none up to 64 is rejected)."""
    def rejected(scale: float) -> bool:
        return _rejects(canaries, tried, composed_tradeoff(kind, float(parameter * scale), rate, steps), alpha)

    # the rejected scales are [s*, ∞): more noise is easier to refute; s* is found between a scale not
    # rejected (low) and one rejected (high), and the mechanism at high — no leakier than at s* — reported
    low, high = 0.0, 0.0
    if tried and rejected(1.0):
        low, high = 0.5, 1.0
        while low >= 1.0 / 64.0 and rejected(low):
            low, high = low / 2.0, low
    elif tried:
        low, high = 1.0, 2.0
        while high <= 64.0 and not rejected(high):
            low, high = high, 2.0 * high
        if high > 64.0:
            high = 0.0
    if high > 0.0 and low >= 1.0 / 64.0:
        while high / low > 1.01:
            middle = math.sqrt(low * high)
            low, high = (low, middle) if rejected(middle) else (middle, high)
    epsilon = composed_epsilon(kind, parameter * high, rate, steps, delta) if high > 0.0 else 0.0
    best = min(((g, c) for g, c in tried if g), default=(0, 0),
               key=lambda level: fdp_p_value(canaries, level[0], level[1], composed_tradeoff(kind, parameter, rate, steps)))
    return MechanismOneRunAudit(epsilon, canaries, best[0], best[1], alpha, delta, tried, tuple(fractions), kind=kind,
                                parameter=float(parameter), rate=float(rate), steps=int(steps), scale=high)
