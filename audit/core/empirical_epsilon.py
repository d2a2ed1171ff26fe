"""Empirical ε from canaries: the one-run audit and the Gaussian-fit (one-shot) estimate.

Both turn canary statistics into a statement about ε that can be set beside a claim:

* :func:`one_run_epsilon_lower_bound` — Steinke, Nasr & Jagielski 2023, "Privacy Auditing with
  One (1) Training Run" (Thm. 3.3 / Alg. 1 of §5): m canaries, each included with probability ½
  in one training run; the auditor guesses "in" or "out" for r of them (abstaining on the
  rest) and gets v right. Under (ε, δ)-DP the number of correct guesses is stochastically
  dominated by Binomial(r, e^ε/(1+e^ε)) up to a δ-dependent slack, which gives a p-value;
  the bound is the largest ε rejected at level ``alpha``. A valid *lower bound* with
  confidence 1 − alpha. (:mod:`audit.core.fdp_one_run` analyses the same counts through the
  mechanism's trade-off curve: Mahloujifar, Melis & Chaudhuri 2024.)
* :func:`gaussian_fit_epsilon` — Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar 2024,
  "One-shot Empirical Privacy Estimation for Federated Learning" (§3): the statistics of
  inserted canaries and of held-out (never inserted) ones are modelled as two Gaussians and ε
  is that of the Gaussian pair at δ. An *estimate*, not a bound; its bootstrap interval says
  how well the canaries pin it down.

Reference values (``../shared/specs/peers.md`` §2): the one-run bound at m = 1000, r = v = 100,
δ = 0, p = 0.05 is 3.493; r = 100, v = 90: 1.631; r = v = 1000: 5.809; m = 10⁴, r = 10³,
v = 900, δ = 10⁻⁵: 2.015.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import stats

from audit.core.metrics import Estimate

# --------------------------------------------------------------------------- one-run audit (Steinke et al. 2023)


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Probability, under (ε, δ)-DP, of at least ``correct`` right guesses out of ``guesses``
    with ``canaries`` canaries (Steinke et al. 2023, Thm. 3.3 as stated in their §5 code).

    With q = e^ε/(1+e^ε) (the accuracy of ε-randomised response), β = P[Bin(r, q) ≥ v] and
    α = max_{1≤i≤v} P[v > Bin(r, q) ≥ v − i] / i, the p-value is β + 2·m·δ·α (capped at 1).
    """
    m, r, v = canaries, guesses, correct
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 ≤ correct ≤ guesses ≤ canaries, got {v}, {r}, {m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need ε ≥ 0 and 0 ≤ δ ≤ 1")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    alpha = 0.0
    if delta > 0 and v > 0:
        # P[v > Bin ≥ v − i] for i = 1..v: cumulative sums of the pmf below v
        below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)
        alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(1.0, beta + 2.0 * m * delta * alpha)


def one_run_epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float = 0.0,
                                alpha: float = 0.05) -> float:
    """The largest ε whose p-value stays below ``alpha`` (bisection; 0 when none does).

    The p-value rises with ε (a larger ε explains more correct guesses), so the rejected set
    {ε : p(ε) < alpha} is an interval [0, ε*) and ε* is the bound.
    """
    if one_run_p_value(canaries, guesses, correct, 0.0, delta) >= alpha:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(canaries, guesses, correct, high, delta) < alpha:
        low, high = high, 2.0 * high
        if high > 1e3:  # every guess right with many canaries: the bound is as large as the data allow
            return low
    for _ in range(100):
        middle = 0.5 * (low + high)
        if one_run_p_value(canaries, guesses, correct, middle, delta) < alpha:
            low = middle
        else:
            high = middle
        if high - low < 1e-10:
            break
    return low


GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class OneRunAudit:
    """The result of guessing on canary scores: the bound and the counts behind it.

    ``tried`` lists (guesses, correct) for every abstention level tried; each was tested at
    alpha / len(tried) (Bonferroni), so :meth:`p_value` is len(tried) × the smallest p-value.
    """

    #: which simulation :func:`audit.core.audit_power.one_run_power` runs for this test's power
    method: ClassVar[str] = "steinke"

    epsilon: float  # lower bound, confidence 1 − alpha (Bonferroni over the abstention levels tried)
    canaries: int
    guesses: int
    correct: int
    alpha: float
    delta: float
    tried: tuple[tuple[int, int], ...] = ()

    def as_estimate(self) -> Estimate:
        return Estimate(self.epsilon, self.epsilon, math.inf)

    def count_p_value(self, guesses: int, correct: int, epsilon: float, delta: float) -> float:
        """The p-value of one abstention level's counts under (ε, δ)-DP (this analysis: Steinke et al.'s)."""
        return one_run_p_value(self.canaries, guesses, correct, epsilon, delta)

    def p_value(self, epsilon: float, delta: float | None = None) -> float:
        """The p-value of "the mechanism is (ε, δ)-DP" given these counts (δ defaults to the audit's)."""
        delta = self.delta if delta is None else delta
        tried = self.tried or ((self.guesses, self.correct),)
        if not any(g for g, _ in tried):
            return 1.0
        smallest = min(self.count_p_value(g, c, epsilon, delta) for g, c in tried if g)
        return min(1.0, len(tried) * smallest)


def guess_counts(scores: np.ndarray, inserted: np.ndarray,
                 guess_fractions: tuple[float, ...] = GUESS_FRACTIONS) -> tuple[tuple[int, int], ...]:
    """(guesses, correct) at each abstention level: "in" for the k/2 highest scores, "out" for the
    k/2 lowest, k = fraction · m (at least one of each)."""
    m = len(scores)
    ranked = inserted[np.argsort(-scores, kind="stable")]
    counts = []
    for fraction in guess_fractions:
        half = min(max(1, int(fraction * m) // 2), m // 2)
        if half == 0:
            continue
        counts.append((2 * half, int(ranked[:half].sum() + (~ranked[m - half:]).sum())))
    return tuple(counts)


def canary_arrays(scores: np.ndarray, inserted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canary scores (float64) and inserted flags (bool), flat and of one length."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    inserted = np.asarray(inserted).astype(bool).ravel()
    if scores.shape != inserted.shape:
        raise ValueError("scores and inserted differ in length")
    return scores, inserted


def strongest_level(tried: tuple[tuple[int, int], ...], alpha: float,
                    bound: Callable[[int, int, float], float]) -> tuple[float, int, int]:
    """(bound, guesses, correct) of the abstention level with the largest ``bound(guesses,
    correct, level)``, each level tested at alpha / len(tried) (Bonferroni); (0, 0, 0) without levels."""
    best = (0.0, 0, 0)
    for guesses, correct in tried:
        value = bound(guesses, correct, alpha / len(tried))
        if value > best[0] or best[1] == 0:
            best = (value, guesses, correct)
    return best


def one_run_audit(scores: np.ndarray, inserted: np.ndarray, delta: float = 0.0, alpha: float = 0.05,
                  guess_fractions: tuple[float, ...] = GUESS_FRACTIONS) -> OneRunAudit:
    """Steinke et al.'s audit on canary scores (higher = more likely inserted).

    The auditor guesses "in" for the k₊ highest scores and "out" for the k₋ lowest, with
    k₊ = k₋ = k/2 and abstains on the rest. Trying several k and keeping the best would bias
    the bound upward, so each k is tested at level alpha / (number of k tried) (Bonferroni):
    the reported bound holds with confidence 1 − alpha whichever k wins.
    """
    scores, inserted = canary_arrays(scores, inserted)
    m = len(scores)
    tried = guess_counts(scores, inserted, guess_fractions)
    epsilon, guesses, correct = strongest_level(
        tried, alpha, lambda g, c, level: one_run_epsilon_lower_bound(m, g, c, delta, level))
    return OneRunAudit(epsilon, m, guesses, correct, alpha, delta, tried)


# --------------------------------------------------------------------------- Gaussian pairs (Andrew et al. 2024)


def gaussian_pair_delta(epsilon: float, mean_p: float, std_p: float, mean_q: float, std_q: float) -> float:
    """δ(ε) = ∫ max(0, p − e^ε q) for P = N(mean_p, std_p²), Q = N(mean_q, std_q²).

    The log-likelihood ratio log p/q is a quadratic a·x² + b·x + c, so {log p/q > ε} is at most
    two intervals whose masses come from normal CDFs.
    """
    a = 0.5 / std_q ** 2 - 0.5 / std_p ** 2
    b = mean_p / std_p ** 2 - mean_q / std_q ** 2
    c = mean_q ** 2 / (2 * std_q ** 2) - mean_p ** 2 / (2 * std_p ** 2) + math.log(std_q / std_p) - epsilon
    intervals: list[tuple[float, float]]
    if abs(a) < 1e-15 * max(abs(b), 1.0):
        if b == 0:
            intervals = [(-math.inf, math.inf)] if c > 0 else []
        else:
            root = -c / b
            intervals = [(root, math.inf)] if b > 0 else [(-math.inf, root)]
    else:
        discriminant = b * b - 4 * a * c
        if discriminant <= 0:
            intervals = [(-math.inf, math.inf)] if a > 0 else []
        else:
            r1, r2 = sorted(((-b - math.sqrt(discriminant)) / (2 * a), (-b + math.sqrt(discriminant)) / (2 * a)))
            intervals = [(-math.inf, r1), (r2, math.inf)] if a > 0 else [(r1, r2)]

    def mass(mean: float, std: float) -> float:
        return sum(float(stats.norm.cdf(hi, mean, std) - stats.norm.cdf(lo, mean, std)) for lo, hi in intervals)

    inside_p, inside_q = mass(mean_p, std_p), mass(mean_q, std_q)
    if inside_q <= 0.0:
        return max(0.0, inside_p)
    scaled_q = epsilon + math.log(inside_q)  # log(e^ε·Q(S)), kept in logs: e^ε overflows for large ε
    return 0.0 if scaled_q > 1.0 else max(0.0, inside_p - math.exp(scaled_q))


def gaussian_pair_epsilon(delta: float, mean_p: float, std_p: float, mean_q: float, std_q: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ ``delta`` in both directions (P vs Q and Q vs P)."""

    def profile(epsilon: float) -> float:
        return max(gaussian_pair_delta(epsilon, mean_p, std_p, mean_q, std_q),
                   gaussian_pair_delta(epsilon, mean_q, std_q, mean_p, std_p))

    if profile(0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while profile(high) > delta:
        low, high = high, 2.0 * high
        if high > 1e4:
            return math.inf
    for _ in range(200):
        middle = 0.5 * (low + high)
        if profile(middle) > delta:
            low = middle
        else:
            high = middle
        if high - low < 1e-10 * max(1.0, high):
            break
    return high


def _shift(inserted: np.ndarray, held_out: np.ndarray) -> float:
    """Standardised mean shift (μ₁ − μ₀)/σ with the pooled σ."""
    n1, n0 = len(inserted), len(held_out)
    pooled = ((n1 - 1) * inserted.var(ddof=1) + (n0 - 1) * held_out.var(ddof=1)) / (n1 + n0 - 2)
    return float((inserted.mean() - held_out.mean()) / math.sqrt(max(pooled, 1e-300)))


def _separate(inserted: np.ndarray, held_out: np.ndarray, delta: float) -> float:
    return gaussian_pair_epsilon(delta, float(inserted.mean()), max(float(inserted.std(ddof=1)), 1e-150),
                                 float(held_out.mean()), max(float(held_out.std(ddof=1)), 1e-150))


def gaussian_fit_epsilon(inserted: np.ndarray, held_out: np.ndarray, delta: float, confidence: float = 0.95,
                         bootstrap: int = 200, seed: int = 0, variance: str = "pooled") -> Estimate:
    """Andrew et al. 2024's estimate: fit N(μ₁, σ²) to the inserted canaries' statistics and
    N(μ₀, σ²) to the held-out ones; ε is that of the Gaussian pair at δ, a function of the
    standardised shift t = (μ₁ − μ₀)/σ alone (the ε of a Gaussian mechanism with μ-GDP, μ = |t|).

    The interval comes from a percentile bootstrap of the *signed* shift t (both groups
    resampled), mapped through ε(|t|): when the interval for t contains 0 — the canaries are
    not told apart — the ε interval starts at 0. (Bootstrapping ε itself would not: ε ≥ 0 is
    positive on every resample, so its percentile interval would exclude 0 even on null data.)

    ``variance="separate"`` fits each group its own σ, with a plain percentile bootstrap of ε;
    with few canaries a chance variance ratio then inflates ε at small δ even on identically
    distributed groups (the failure jax_privacy's PR #270 fixed), so it is an option only.
    """
    inserted = np.asarray(inserted, dtype=np.float64).ravel()
    held_out = np.asarray(held_out, dtype=np.float64).ravel()
    if len(inserted) < 2 or len(held_out) < 2:
        raise ValueError("need at least two inserted and two held-out canaries")
    if variance not in ("pooled", "separate"):
        raise ValueError("variance must be 'pooled' or 'separate'")
    rng = np.random.default_rng(seed)
    resamples = [(inserted[rng.integers(0, len(inserted), len(inserted))], held_out[rng.integers(0, len(held_out), len(held_out))])
                 for _ in range(bootstrap)]
    tail = (1.0 - confidence) / 2.0
    if variance == "separate":
        draws = [_separate(a, b, delta) for a, b in resamples]
        return Estimate(_separate(inserted, held_out, delta), float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail)))

    def epsilon_of(shift: float) -> float:
        return gaussian_pair_epsilon(delta, abs(shift), 1.0, 0.0, 1.0)

    shifts = np.array([_shift(a, b) for a, b in resamples])
    low, high = float(np.quantile(shifts, tail)), float(np.quantile(shifts, 1 - tail))
    smallest = 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))
    return Estimate(epsilon_of(_shift(inserted, held_out)), epsilon_of(smallest), epsilon_of(max(abs(low), abs(high))))
