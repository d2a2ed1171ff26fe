"""UDP-FL's Harmonizer (Feng et al. 2024, §3.3; its Alg. 2/3 are not legible in the text we used,
so this is our construction): the least noise of each mechanism that meets a target (ε, δ) over a
number of Poisson-subsampled steps, and the "dominance" variant whose RDP curve lies under a
Gaussian's at every order.

Accounting per step (composition and conversion shared with :mod:`defenses.privacy.accounting`):

* Gaussian: the sampled-Gaussian RDP of dp-accounting (Mironov, Talwar, Zhang 2019) — exact;
* Laplace, Staircase: the mechanism's curve (:mod:`defenses.blocks.mechanisms`) amplified by Zhu & Wang's
  general Poisson-subsampling bound at integer orders (2..128, 256); without subsampling, the curve
  itself on the paper's order grid.

``accounting="paper_1d"`` uses the one-dimensional curves, as the paper does; ``"sound"`` uses
bounds valid for d-dimensional clipped gradients (``clip_norm`` ℓ2 or ℓ1), which for the
Staircase under ℓ2 clipping is no finite bound at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from audit.core.errors import UserInputError
from defenses.blocks.mechanisms import CLIP_NORMS, MECHANISMS, Mechanism, make_mechanism
from defenses.privacy.accounting import GaussianSchedule, rdp_per_round, rdp_to_epsilon
from defenses.privacy.calibration import smallest_noise
from defenses.privacy.subsampled_rdp import INTEGER_ORDERS, poisson_subsampled_rdp

ACCOUNTINGS = ("paper_1d", "sound")
#: the order grid of the ``paper_1d`` accounting (Opacus's default orders; the paper's own grid is not legible)
PAPER_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def _check(accounting: str, clip_norm: str) -> None:
    if accounting not in ACCOUNTINGS:
        raise UserInputError(f"accounting: '{accounting}' is not allowed; allowed: {', '.join(ACCOUNTINGS)}")
    if clip_norm not in CLIP_NORMS:
        raise UserInputError(f"clip_norm: '{clip_norm}' is not allowed; allowed: {', '.join(CLIP_NORMS)}")


def rdp_per_step(mechanism: Mechanism, rate: float, accounting: str = "paper_1d",
                 clip_norm: str = "l2") -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP of one Poisson-subsampled step) under the chosen accounting (float64)."""
    _check(accounting, clip_norm)
    if mechanism.kind == "gaussian":
        orders = np.array(PAPER_ORDERS)
        return orders, rdp_per_round(GaussianSchedule(mechanism.parameter, rate, 1), orders)

    def curve(orders: np.ndarray) -> np.ndarray:
        return mechanism.rdp_1d(orders) if accounting == "paper_1d" else mechanism.sound_rdp(orders, clip_norm)

    if rate >= 1.0:
        orders = np.array(PAPER_ORDERS)
        return orders, curve(orders)
    orders = np.array(INTEGER_ORDERS, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return orders, poisson_subsampled_rdp(curve, rate, INTEGER_ORDERS)


def epsilon(mechanism: Mechanism, rate: float, steps: int, delta: float, accounting: str = "paper_1d",
            clip_norm: str = "l2", conversion: str = "classic") -> float:
    """ε after ``steps`` subsampled steps; inf when the accounting has no finite bound."""
    if steps == 0:
        return 0.0
    orders, rdp = rdp_per_step(mechanism, rate, accounting, clip_norm)
    if not np.isfinite(rdp).any():
        return math.inf
    return rdp_to_epsilon(orders, steps * rdp, delta, conversion)[0]


def _build(kind: str, noise: float) -> Mechanism:
    """The mechanism whose noise grows with ``noise`` (z, λ, or 1/ε for the Staircase)."""
    cls = MECHANISMS[kind]
    return cls(noise if cls.larger_is_noisier else 1.0 / noise)


def _noise_of(mechanism: Mechanism) -> float:
    return mechanism.parameter if mechanism.larger_is_noisier else 1.0 / mechanism.parameter


def harmonize(kind: str, target_epsilon: float, delta: float, rate: float, steps: int, accounting: str = "paper_1d",
              clip_norm: str = "l2", conversion: str = "classic") -> Mechanism:
    """The least-noise mechanism of ``kind`` whose ε over ``steps`` steps does not exceed the target."""
    if kind not in MECHANISMS:
        raise UserInputError(f"mechanism: '{kind}' is not allowed; allowed: {', '.join(MECHANISMS)}")
    _check(accounting, clip_norm)
    if accounting == "sound" and kind == "staircase" and clip_norm == "l2":
        raise UserInputError("accounting: the staircase mechanism has no finite sound bound under ℓ2 clipping; "
                             "use clip_norm 'l1' or accounting 'paper_1d'")
    noise = smallest_noise(lambda s: epsilon(_build(kind, s), rate, steps, delta, accounting, clip_norm, conversion),
                           target_epsilon)
    return _build(kind, noise)


def dominance(kind: str, gaussian_z: float, orders: Sequence[float] = PAPER_ORDERS) -> Mechanism:
    """The least-noise mechanism of ``kind`` whose 1-D RDP is ≤ α/(2z²) at every order: the paper's
    "privacy loss does not exceed the Gaussian version". z = 1 gives λ ≈ 0.8269 and ε_s ≈ 1.0838."""
    orders = np.asarray(orders, dtype=np.float64)
    bound = orders / (2 * gaussian_z ** 2)
    if kind == "gaussian":
        return _build(kind, gaussian_z)

    def dominated(noise: float) -> bool:
        return bool(np.all(_build(kind, noise).rdp_1d(orders) <= bound))

    hi = 1.0
    while not dominated(hi):
        hi *= 2.0
    lo = hi / 2.0
    while dominated(lo):
        hi, lo = lo, lo / 2.0
    while hi / lo - 1.0 > 1e-12:  # bisection on a monotone predicate: more noise stays dominated
        mid = math.sqrt(lo * hi)
        if dominated(mid):
            hi = mid
        else:
            lo = mid
    return _build(kind, hi)


def noise_of(mechanism: Mechanism) -> float:
    """The mechanism's noise coordinate (z, λ or 1/ε), larger meaning noisier."""
    return _noise_of(mechanism)


__all__ = ["ACCOUNTINGS", "PAPER_ORDERS", "dominance", "epsilon", "harmonize", "make_mechanism", "noise_of", "rdp_per_step"]
