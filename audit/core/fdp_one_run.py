"""The f-DP one-run audit: Mahloujifar, Melis & Chaudhuri 2024, "Auditing f-Differential Privacy
in One Run" (arXiv 2410.22235; ICML 2025).

The game is Steinke, Nasr & Jagielski's (:mod:`audit.core.empirical_epsilon`): m canaries, each
inserted with probability ½ in one run; the auditor guesses "in" or "out" on k of them (abstaining
on the rest) and N of its guesses are right. Steinke et al. reduce the mechanism to (ε, δ) and
dominate N by a binomial; Mahloujifar et al. bound P[N ≥ v] from the mechanism's whole trade-off
curve f (Dong, Roth & Su 2022, "Gaussian differential privacy", §2: f-DP), numerically.

**The bound, as implemented here** (our own derivation of the paper's analysis; it reproduces the
recursion of the code the paper gives, ``audit_rh_with_cap``, for an alphabet of two: in or out).
Let j be a canary drawn uniformly and independently of everything, W_j the correct guesses on the
other canaries, and for each level i

    R_i = P[the guess on j is right and N ≥ i],    H_i = P[the guess on j is wrong and N ≥ i].

(1) *One canary.* Fix the other canaries' coins and a guess value b. The event "the guess on j is
b and W_j ≥ i − 1" is post-processing of the output; it means "right and N ≥ i" when j's coin is b
and "wrong and N ≥ i − 1" when it is 1 − b. f-DP in both orders (a symmetric neighbouring
relation) bounds the probability P′ of an event under one neighbour from below by the other's P:
P′ ≥ f(1 − P) (the test that rejects outside the event has type I error 1 − P). Write
g(y) = f(1 − y): convex and non-decreasing with g(0) = 0, since f is convex, non-increasing and
f(1) = 0. Averaging over j, the coins and b (Jensen):

    H_{i−1} ≥ g(R_i)     for i = 1, …, k.

(2) *The law of N.* With q_n = P[N = n], exactly n of the m canaries are guessed right and k − n
wrong when N = n, so R_i = Σ_{n≥i} q_n·n/m and H_i = Σ_{n≥i} q_n·(k − n)/m.

A tail P[N ≥ v] = τ is possible only if some law (q_n) with Σ q_n = 1 satisfies (1). The least
mass the levels below v need is found greedily from the top, starting from all of τ at N = v
(r_v = τv/m, h_v = τ(k − v)/m): at each level i = v, …, 1, add just enough mass at N = i − 1 to
meet H_{i−1} ≥ g(R_i),

    h_{i−1} = max(h_i, g(r_i)),    r_{i−1} = r_i + (i − 1)/(k − i + 1)·(h_{i−1} − h_i),

and τ is impossible when the total passes 1 (the paper's test r_0 + h_0 > k/m: r_0 + h_0 is k/m
times the total). The greedy law is the optimum of the linear programme "maximise P[N ≥ v] subject
to (1) and (2)" (checked against ``scipy.optimize.linprog`` in the tests), so

    p(m, k, v, f) = the largest possible τ

is a valid p-value of "the mechanism is f-DP" (:func:`fdp_p_value`). The possible τ form an
interval [0, p]: scaling a law by s ≤ 1 keeps (1) (g(s·y) ≤ s·g(y): g convex, g(0) = 0) and the
rest of the mass can sit at N = 0.

Two curves (:class:`GaussianTradeOff`, :class:`ApproximateDPTradeOff`):

* μ-GDP, f(x) = Φ(Φ⁻¹(1 − x) − μ), so g(y) = Φ(Φ⁻¹(y) − μ) (Dong, Roth & Su 2022, §2: the
  trade-off of N(0, 1) against N(μ, 1));
* (ε, δ)-DP, f(x) = max(0, 1 − δ − e^ε·x, e^−ε·(1 − δ − x)) (ibid., §2): a mechanism is
  (ε, δ)-DP exactly when it is f_{ε,δ}-DP (Wasserman & Zhou 2010), so a rejection of f_{ε,δ} is
  a rejection of the (ε, δ) claim.

**What is reported** (:func:`fdp_one_run_audit`): the largest ε whose f_{ε,δ} the counts reject at
the audit's δ — a valid ε lower bound, comparable with a claim and with Steinke et al.'s; and the
largest μ whose μ-GDP the counts reject with its ε at δ (:func:`gdp_epsilon`), the paper's
"empirical privacy" for Gaussian mechanisms. The latter is *not* an (ε, δ) lower bound: an
(ε, δ)-DP mechanism need not be μ-GDP for the μ whose curve meets (ε, δ) — the counts of
ε-randomised response, which is (ε, 0)-DP, reject μ-GDP for μ whose ε at δ = 10⁻⁵ exceeds ε
(tests/audit/core/test_fdp_one_run.py) — so only the former is tested against claims, and the
latter goes to the notes.

**Against Steinke et al.** With δ = 0 and every guess right both give p = (e^ε/(1 + e^ε))^k;
with wrong guesses at δ = 0 the binomial tail is the smaller (it is exact for ε-randomised
response, so no valid bound is below it), while at δ > 0 the f-DP analysis of f_{ε,δ} is the
tighter when m·δ is not small (Steinke et al. pay 2m·δ·α for δ). So an audit reports both and the
verdicts correct for taking the better (Holm over the family, :mod:`reports.soundness`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from audit.core.empirical_epsilon import (
    GUESS_FRACTIONS,
    OneRunAudit,
    canary_arrays,
    guess_counts,
    strongest_level,
)
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import optimize, special
else:  # imported with the first curve or bound: `list` registers the attacks without scipy
    optimize = lazy_module("scipy.optimize")
    special = lazy_module("scipy.special")

# --------------------------------------------------------------------------- trade-off functions


class TradeOff:
    """A trade-off function f (Dong, Roth & Su 2022, Def. 2.1): convex, continuous,
    non-increasing, f(x) ≤ 1 − x. :meth:`floor` is g(y) = f(1 − y), computed without forming
    1 − y, whose rounding would erase the tiny probabilities of small p-values."""

    def __call__(self, x: float) -> float:
        raise NotImplementedError

    def floor(self, y: float) -> float:
        """The least probability one neighbour can give an event that the other gives ``y``."""
        raise NotImplementedError


@dataclass(frozen=True)
class GaussianTradeOff(TradeOff):
    """μ-GDP: f(x) = Φ(Φ⁻¹(1 − x) − μ), the trade-off of N(0, 1) against N(μ, 1)."""

    mu: float

    def __call__(self, x: float) -> float:
        return float(special.ndtr(special.ndtri(1.0 - min(max(x, 0.0), 1.0)) - self.mu))

    def floor(self, y: float) -> float:
        # Φ(Φ⁻¹(y) − μ) directly: y can be ~1e-300 inside a p-value search
        return float(special.ndtr(special.ndtri(min(max(y, 0.0), 1.0)) - self.mu))


@dataclass(frozen=True)
class ApproximateDPTradeOff(TradeOff):
    """(ε, δ)-DP: f(x) = max(0, 1 − δ − e^ε·x, e^−ε·(1 − δ − x))."""

    epsilon: float
    delta: float = 0.0

    def __call__(self, x: float) -> float:
        return max(0.0, 1.0 - self.delta - _scaled(self.epsilon, x), math.exp(-self.epsilon) * (1.0 - self.delta - x))

    def floor(self, y: float) -> float:
        y = min(max(y, 0.0), 1.0)
        return max(0.0, math.exp(-self.epsilon) * (y - self.delta), 1.0 - self.delta - _scaled(self.epsilon, 1.0 - y))


def _scaled(epsilon: float, x: float) -> float:
    """e^ε·x, +inf where it overflows (x > 0) — never inf·0 = NaN."""
    if x <= 0.0:
        return 0.0
    log = epsilon + math.log(x)
    return math.exp(log) if log < 700.0 else math.inf


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth & Su 2022, Cor. 2.13); the
    second term in logs, so that e^ε does not overflow."""
    if mu <= 0:
        return 0.0
    return max(0.0, float(special.ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon + special.log_ndtr(-epsilon / mu - mu / 2))))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε at which μ-GDP's δ(ε) meets ``delta`` (δ(ε) falls with ε: Brent's root); +inf for
    δ = 0 and μ > 0 — a Gaussian curve is never pure DP."""
    if mu <= 0 or delta >= gdp_delta(mu, 0.0):
        return 0.0
    if delta <= 0:
        return math.inf
    high = 1.0
    while gdp_delta(mu, high) > delta:
        high *= 2.0
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, high, xtol=1e-12, rtol=1e-12))


# --------------------------------------------------------------------------- the tail bound


def _check(canaries: int, guesses: int, correct: int) -> None:
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 ≤ correct ≤ guesses ≤ canaries, got {correct}, {guesses}, {canaries}")


def _mass(canaries: int, guesses: int, correct: int, tradeoff: TradeOff, tau: float) -> float:
    """The least total probability a law of N needs when P[N ≥ correct] = ``tau`` (the greedy
    recursion of the module docstring); any value above 1 means "impossible" — the loop stops
    there, which also keeps r ≤ k/m ≤ 1."""
    m, k, v = canaries, guesses, correct
    r, h, total = tau * v / m, tau * (k - v) / m, tau
    for i in range(v, 0, -1):
        need = tradeoff.floor(r)
        if need <= h:  # no mass added: r and h stay put, and so would every lower level
            break
        added = (need - h) * m / (k - i + 1)  # q_{i−1}: H grows by q·(k − (i − 1))/m
        total += added
        if total > 1.0:
            break
        r += added * (i - 1) / m
        h = need
    return total


def fdp_rejects(canaries: int, guesses: int, correct: int, tradeoff: TradeOff, level: float) -> bool:
    """Do ``correct`` right guesses out of ``guesses`` reject "the mechanism is f-DP" at
    ``level``? (P[N ≥ correct] = level is impossible: one run of the recursion.)"""
    _check(canaries, guesses, correct)
    return correct > 0 and _mass(canaries, guesses, correct, tradeoff, level) > 1.0


def fdp_p_value(canaries: int, guesses: int, correct: int, tradeoff: TradeOff) -> float:
    """p(m, k, v, f): the largest P[N ≥ v] an f-DP mechanism allows (module docstring).

    Bisection on log τ, ending on the impossible side: the value returned is never below the
    p-value (down to 1e-300, returned for anything smaller)."""
    _check(canaries, guesses, correct)
    if correct == 0 or _mass(canaries, guesses, correct, tradeoff, 1.0) <= 1.0:
        return 1.0
    low, high = -690.0, 0.0  # log τ: e^−690 ≈ 1e-300 (feasible side), 1 (impossible side)
    if _mass(canaries, guesses, correct, tradeoff, math.exp(low)) > 1.0:
        return math.exp(low)
    while high - low > 1e-12:
        middle = 0.5 * (low + high)
        if _mass(canaries, guesses, correct, tradeoff, math.exp(middle)) > 1.0:
            high = middle
        else:
            low = middle
    return math.exp(high)


def _largest_rejected(rejects, limit: float = 1e3) -> float:
    """The largest privacy parameter θ ≥ 0 that ``rejects(θ)`` rejects, by doubling then bisection
    (the curves weaken as θ grows, so the rejected set is an interval [0, θ*)); 0 when none is,
    ``limit`` when every θ up to it is (every guess right with many canaries)."""
    if not rejects(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejects(high):
        low, high = high, 2.0 * high
        if high > limit:
            return low
    while high - low > 1e-10:
        middle = 0.5 * (low + high)
        if rejects(middle):
            low = middle
        else:
            high = middle
    return low


def fdp_epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float = 0.0,
                            alpha: float = 0.05) -> float:
    """The largest ε whose (ε, δ)-DP curve the counts reject at ``alpha``."""
    return _largest_rejected(lambda e: fdp_rejects(canaries, guesses, correct, ApproximateDPTradeOff(e, delta), alpha))


def gdp_mu_lower_bound(canaries: int, guesses: int, correct: int, alpha: float = 0.05) -> float:
    """The largest μ whose μ-GDP curve the counts reject at ``alpha``."""
    return _largest_rejected(lambda mu: fdp_rejects(canaries, guesses, correct, GaussianTradeOff(mu), alpha))


# --------------------------------------------------------------------------- the audit


@dataclass(frozen=True)
class FdpOneRunAudit(OneRunAudit):
    """The f-DP analysis of the counts of guessing on canary scores (:func:`fdp_one_run_audit`):
    :class:`audit.core.empirical_epsilon.OneRunAudit`'s counts and Bonferroni rule, each level's
    p-value from the f_{ε,δ} trade-off curve (:func:`fdp_p_value`) instead of the binomial."""

    #: which simulation :func:`audit.core.audit_power.one_run_power` runs for this test's power
    method: ClassVar[str] = "fdp"

    # ``epsilon``: the largest ε with f_{ε,δ} rejected, a lower bound with confidence 1 − alpha
    mu: float = 0.0  # largest μ with μ-GDP rejected, confidence 1 − alpha

    @property
    def epsilon_gdp(self) -> float:
        """The paper's empirical privacy: ε at δ of μ-GDP at the rejected μ (not an (ε, δ) bound)."""
        return gdp_epsilon(self.mu, self.delta)

    def count_p_value(self, guesses: int, correct: int, epsilon: float, delta: float) -> float:
        return fdp_p_value(self.canaries, guesses, correct, ApproximateDPTradeOff(epsilon, delta))


def fdp_audit_of_counts(canaries: int, tried: tuple[tuple[int, int], ...], delta: float = 0.0,
                        alpha: float = 0.05, fractions: tuple[float, ...] = GUESS_FRACTIONS) -> FdpOneRunAudit:
    """The f-DP bounds of (guesses, correct) counts, each abstention level at alpha / len(tried)."""
    mu = strongest_level(tried, alpha, lambda g, c, level: gdp_mu_lower_bound(canaries, g, c, level))[0]
    epsilon, guesses, correct = strongest_level(
        tried, alpha, lambda g, c, level: fdp_epsilon_lower_bound(canaries, g, c, delta, level))
    return FdpOneRunAudit(epsilon, canaries, guesses, correct, alpha, delta, tried, tuple(fractions), mu=mu)


def fdp_one_run_audit(scores: np.ndarray, inserted: np.ndarray, delta: float = 0.0, alpha: float = 0.05,
                      guess_fractions: tuple[float, ...] = GUESS_FRACTIONS) -> FdpOneRunAudit:
    """The f-DP audit of canary scores (higher = more likely inserted), with the guesses of
    :func:`audit.core.empirical_epsilon.one_run_audit`: "in" for the highest scores, "out" for
    the lowest, k in all at each fraction of ``guess_fractions`` (Bonferroni over them), never
    splitting a block of tied scores (:func:`audit.core.empirical_epsilon.guess_counts`)."""
    scores, inserted = canary_arrays(scores, inserted)
    return fdp_audit_of_counts(len(scores), guess_counts(scores, inserted, guess_fractions), delta, alpha, guess_fractions)
