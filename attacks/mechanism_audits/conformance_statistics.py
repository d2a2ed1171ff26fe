"""The statistics of the conformance audit (:mod:`attacks.mechanism_audits.conformance`, steps 4–6):
from coupled trials, the noise along the target's effect per unit of it, r_t = ⟨n_t, s_t⟩/‖s_t‖²;
two tests of σ_t ≥ σ on it — the χ² interval of σ_eff = √mean(r_t²) and a one-sided
Kolmogorov–Smirnov test (Smirnov 1939, D⁺) of |r_t|/σ against the half-normal law — and a test of
its shape (tails lighter than Gaussian: bounded noise, :mod:`audit.core.noise_shape`), per round
and pooled; and the optimal test's held-out ε lower bound (Jagielski, Ullman, Oprea 2020; Nasr et al.
2021) with its ceiling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.metrics import epsilon_lower_bound, held_out_epsilon_lower_bound
from audit.core.noise_shape import lighter_tails_p

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

#: trials in which the target must move the view before its effect is measured
MIN_INFLUENTIAL = 10
POOLED = "rounds pooled"


@dataclass
class ScopeResult:
    """The σ tests on the trials of one round (``scope`` "round r"), or of all rounds pooled."""

    scope: str
    influential: int
    multiplier: float | None = None
    interval: tuple[float, float] | None = None
    shortfall: float | None = None  # the one-sided KS statistic D⁺ of |r_t|/σ against the half-normal
    shortfall_p: float | None = None
    shape_p: float | None = None  # D'Agostino's one-sided test of lighter tails than Gaussian (audit.core.noise_shape)

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "influential_trials": self.influential, "noise_multiplier": self.multiplier,
                "interval": list(self.interval) if self.interval else None, "ks_statistic": self.shortfall,
                "ks_p_value": self.shortfall_p, "light_tails_p_value": self.shape_p}


@dataclass
class Measurement:
    """What :func:`measure` finds in one candidate's trials for one view: the σ tests of each scope
    (all rounds pooled first) and the ε lower bound (None where not run or nothing moved)."""

    influential: int
    scopes: list[ScopeResult]
    epsilon_lower_bound: float | None

    @property
    def pooled(self) -> ScopeResult:
        return self.scopes[0]


def multiplier_interval(ratios: np.ndarray, level: float) -> tuple[float, tuple[float, float]]:
    """σ̂ = √mean(r²) and its two-sided interval at ``level`` for r_t iid N(0, σ²): n·σ̂²/σ² ~ χ²_n."""
    n = len(ratios)
    mean_square = float(np.mean(ratios ** 2))
    alpha = 1.0 - level
    low = math.sqrt(n * mean_square / stats.chi2.ppf(1 - alpha / 2, n))
    high = math.sqrt(n * mean_square / stats.chi2.ppf(alpha / 2, n))
    return math.sqrt(mean_square), (low, high)


def shortfall_test(ratios: np.ndarray, claimed: float) -> tuple[float, float]:
    """(D⁺, p) of the one-sided Kolmogorov–Smirnov test of |r_t|/σ against the half-normal CDF G.

    The null is that every r_t ~ N(0, σ_t²) with σ_t ≥ σ, independently: each |r_t|/σ is then
    stochastically at least half-normal, so its CDF F_t ≤ G and the empirical CDF lies below that
    of n half-normal draws (couple |r_t|/σ = F_t⁻¹(U_t) ≥ G⁻¹(U_t)); the p-value of the iid case
    is valid. It is small when the empirical CDF exceeds G somewhere: too many small ratios, as
    when a share of the trials carries far less noise per unit of effect than σ.
    """
    result = stats.kstest(np.abs(ratios) / claimed, stats.halfnorm.cdf, alternative="greater")
    return float(result.statistic), float(result.pvalue)


def _halves(trials: int) -> tuple[int, int]:
    """Positives (odd trials) and negatives (even trials) of the held-out half the ε test counts."""
    held_out = range(trials // 2, trials)
    positives = sum(1 for t in held_out if t % 2 == 1)
    return positives, len(held_out) - positives


def epsilon_ceiling(trials: int, level: float, delta: float) -> float:
    """The largest ε lower bound :func:`measure`'s optimal test can report with ``trials`` trials at
    ``level``: every held-out count perfect (all positives above the threshold, no negative)."""
    positives, negatives = _halves(trials)
    return epsilon_lower_bound(positives, 0, 0, negatives, confidence=level, delta=delta)


def _scope(name: str, ratios: np.ndarray, level: float, claimed: float | None) -> ScopeResult:
    if len(ratios) < MIN_INFLUENTIAL:
        return ScopeResult(name, len(ratios))
    multiplier, interval = multiplier_interval(ratios, level)
    result = ScopeResult(name, len(ratios), multiplier, interval)
    if claimed is not None and claimed > 0:
        result.shortfall, result.shortfall_p = shortfall_test(ratios, claimed)
        result.shape_p = lighter_tails_p(ratios)
    return result


def sigma_scopes(dots: np.ndarray, norms: np.ndarray, rounds: np.ndarray, level: float,
                 claimed: float | None) -> tuple[int, list[ScopeResult]]:
    """(influential trials, σ tests per scope) from each trial's ⟨n_t, s_t⟩ (``dots``) and ‖s_t‖
    (``norms``): r_t = ⟨n_t, s_t⟩/‖s_t‖² over the trials where the target moved the view. Scopes: all
    rounds pooled, then each round (when there are several)."""
    scale = float(norms.max()) if len(norms) else 0.0
    influential = norms > max(1e-12, 1e-9 * scale)
    ratios = np.zeros(len(norms))
    ratios[influential] = dots[influential] / norms[influential] ** 2
    distinct = sorted(set(rounds.tolist()))
    several = len(distinct) > 1
    scopes = [_scope(POOLED if several or not distinct else f"round {distinct[0] + 1}", ratios[influential], level, claimed)]
    if several:
        scopes += [_scope(f"round {r + 1}", ratios[influential & (rounds == r)], level, claimed) for r in distinct]
    return int(influential.sum()), scopes


def epsilon_bound(neighbour: np.ndarray, moved: np.ndarray, level: float, delta: float) -> float | None:
    """The optimal test's ε lower bound: independent draws (the neighbour's view on even trials, the
    target's on odd ones) projected on the first half's mean effect, the threshold chosen on the first
    half and counted on the second (None when the target moved nothing)."""
    trials = len(neighbour)
    half = trials // 2
    direction = (moved[:half] - neighbour[:half]).mean(0)
    if not np.linalg.norm(direction) > 0:
        return None
    direction = direction / np.linalg.norm(direction)
    center = neighbour.mean(0)

    def scores(rows: range) -> tuple[np.ndarray, np.ndarray]:
        negatives = [(neighbour[t] - center) @ direction for t in rows if t % 2 == 0]
        positives = [(moved[t] - center) @ direction for t in rows if t % 2 == 1]
        return np.r_[positives, negatives], np.r_[np.ones(len(positives)), np.zeros(len(negatives))]

    calibration, calibration_labels = scores(range(half))
    test, test_labels = scores(range(half, trials))
    # exact plateaus (two-point outputs) carry rounding noise in their last bits; a threshold search
    # would exploit that artefact rather than the mechanism
    return held_out_epsilon_lower_bound(np.round(calibration, 9), calibration_labels, np.round(test, 9), test_labels,
                                        level, delta).value


def measure(neighbour: np.ndarray, moved: np.ndarray, level: float, delta: float, *, noise: np.ndarray | None = None,
            rounds: np.ndarray | None = None, claimed: float | None = None, epsilon_test: bool = True) -> Measurement:
    """The σ tests and the ε lower bound of coupled trials: ``moved[t]`` is the view with the target's
    input, ``neighbour[t]`` that of its neighbour and ``noise[t]`` the noise of trial t's view (the
    all-zero view less its mean; default ``neighbour`` itself, exact for a mean-zero neighbour), all
    with trial t's seed; ``rounds[t]`` is trial t's round."""
    effect = moved - neighbour
    noise = neighbour if noise is None else noise
    rounds = np.zeros(len(moved), dtype=int) if rounds is None else np.asarray(rounds)
    count, scopes = sigma_scopes(np.einsum("tk,tk->t", noise, effect), np.linalg.norm(effect, axis=1), rounds, level,
                                 claimed)
    bound = epsilon_bound(neighbour, moved, level, delta) if epsilon_test and count >= MIN_INFLUENTIAL else None
    return Measurement(count, scopes, bound)
