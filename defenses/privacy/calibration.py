"""Noise calibration: the smallest noise parameter whose ε meets a target ε.

For any mechanism family whose ε is non-increasing in its noise parameter σ — the (subsampled)
Gaussian of DP-FedAvg (McMahan et al. 2018, Alg. 1; :func:`defenses.privacy.accounting.calibrate_noise`
wraps this search with a window of RDP orders), the distributed discrete Gaussian
(:mod:`defenses.ddgauss`) and the harmonized Laplace/Staircase mechanisms
(:mod:`defenses.blocks.harmonizer`) — find the least noise (to a relative tolerance) whose ε does not
exceed the target: a bracket by doubling/halving, then the Illinois variant of regula falsi on
(log σ, log ε). The upper end of the bracket is returned, so the target is never overshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from audit.core.errors import UserInputError


def smallest_noise(eps_at: Callable[[float], float], target_epsilon: float, relative_tolerance: float = 1e-4,
                   start: float = 1.0, step: float = 2.0, settle_ends: bool = False) -> float:
    """The smallest noise parameter σ (to ``relative_tolerance``) with eps_at(σ) ≤ target.

    ``eps_at`` must be non-increasing in σ. A bracket [lo, hi] with eps_at(lo) > target ≥
    eps_at(hi) is found by doubling/halving, then narrowed by the Illinois variant of regula
    falsi on (log σ, log ε) — ε is smooth and nearly a power of σ, so this needs a handful of ε
    evaluations where bisection needs a dozen — falling back to a bisection step whenever the
    interpolation does not land strictly inside the bracket. The upper end is returned, so the
    target is never exceeded. Raises a one-line error when no σ ≤ 1e7 reaches the target.

    The bracket search starts at ``start`` and moves by the factor ``step``: a caller that knows
    σ to within a few per cent (the PLD's σ lies a little below the RDP's) evaluates ε near it only.
    With ``settle_ends``, an interpolation that lands at an end of the bracket (that end's ε is
    already at the target) is followed by one step just inside that end rather than a bisection:
    for an ε that is a step function of σ (the PLD's grid) bisection crept up from the far end,
    14 evaluations of seconds each at ε = 100.
    """
    hi = start
    eps_hi = eps_at(hi)
    while eps_hi > target_epsilon:
        hi *= step
        if hi > 1e7:
            raise UserInputError(f"target-epsilon: {target_epsilon} is not reachable with any noise ≤ 1e7")
        eps_hi = eps_at(hi)
    lo = hi / step
    eps_lo = eps_at(lo)
    while eps_lo <= target_epsilon:
        hi, eps_hi = lo, eps_lo
        lo /= step
        if lo < 1e-4:  # essentially no noise meets the target: return the small σ found
            return hi
        eps_lo = eps_at(lo)
    log_target = math.log(target_epsilon)

    def gap(eps: float) -> float:  # log ε − log target: > 0 at lo, ≤ 0 at hi
        return math.log(eps) - log_target if eps > 0 else -math.inf

    f_lo, f_hi = gap(eps_lo), gap(eps_hi)
    kept = 0  # +1 when lo was kept last step, −1 when hi was (Illinois: halve a twice-kept side)
    clamped = False  # the last step went just inside an end of the bracket
    for _ in range(200):
        if target_epsilon - eps_hi <= relative_tolerance * target_epsilon or hi / lo - 1.0 < 1e-12:
            break
        x_lo, x_hi = math.log(lo), math.log(hi)
        x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo) if math.isfinite(f_lo) and math.isfinite(f_hi) else math.nan
        margin = 1e-3 * (x_hi - x_lo)
        if not (x_lo + margin < x < x_hi - margin):
            # see settle_ends; a second miss in a row bisects
            clamp = settle_ends and math.isfinite(x) and not clamped
            x = (x_lo + margin if x <= x_lo + margin else x_hi - margin) if clamp else 0.5 * (x_lo + x_hi)
            clamped = clamp
        else:
            clamped = False
        mid = math.exp(x)
        eps_mid = eps_at(mid)
        if eps_mid > target_epsilon:
            lo, f_lo = mid, gap(eps_mid)
            if kept == -1:
                f_hi /= 2.0
            kept = -1
        else:
            hi, eps_hi, f_hi = mid, eps_mid, gap(eps_mid)
            if kept == 1:
                f_lo /= 2.0
            kept = 1
    return hi

