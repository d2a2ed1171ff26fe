"""How much an audit can show: its power against a claim.

An ε lower bound below the claim is evidence only if the audit could have found a violation.
For a design with m independent coins (canaries, or (run, unit) pairs) and a one-run test of
the counts — Steinke, Nasr & Jagielski's (2023) binomial p-value (``method="steinke"``) or the
f-DP analysis of the f_{ε,δ} curve (Mahloujifar, Melis & Chaudhuri 2024, ``method="fdp"``,
:mod:`audit.core.fdp_one_run`) — we simulate the audit against the *most leaky mechanism the
claim allows* and the *optimal attack* on it:

* a Gaussian claim (δ > 0) is exactly tight for the μ-GDP pair N(μ, 1) vs N(0, 1) whose privacy
  profile meets δ at ε: δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth, Su 2022,
  "Gaussian differential privacy", Cor. 2.13); the optimal score of a canary is its draw;
* a pure claim (δ = 0) is tight for ε-randomised response: each canary's ±1 score is right with
  probability e^ε/(1 + e^ε) (Steinke et al. 2023 show their bound is tight for it).

Two figures (:class:`AuditPower`): ``tight_bound`` — the median ε lower bound the audit reports when
the mechanism is exactly as private as claimed (the most this design can certify), and
``detection`` — the probability that it reports a violation of the claim (at the family-adjusted
level) when the true ε is twice the claim. ``needed`` extrapolates, by a normal approximation of
the counts, how many coins would give 80 % detection.

``detection`` is a Monte-Carlo estimate and the verdict compares it with 80 %, so its error
decides only near that boundary: simulations continue until the estimate is four boundary
standard errors away from 0.80 or 2,000 are done (standard error ≤ 0.009 there); the number of
simulations and the standard error are reported with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from audit.core.empirical_epsilon import (
    GUESS_FRACTIONS,
    guess_counts,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)
from audit.core.fdp_one_run import (
    ApproximateDPTradeOff,
    fdp_epsilon_lower_bound,
    fdp_rejects,
    gdp_delta,
)
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import optimize
else:  # imported with the first power figure: `list` registers the attacks without scipy.optimize
    optimize = lazy_module("scipy.optimize")

#: detection probability a verdict needs to call an audit powered
POWER_TARGET = 0.8
#: the largest number of coins :func:`one_run_power` searches for 80 % detection
NEEDED_LIMIT = 10**5
#: simulations per batch, and the most a power estimate runs: 2,000 give a standard error of
#: √(0.8 · 0.2 / 2000) ≈ 0.009 at the 0.80 boundary the verdict is decided at
BATCH, MAX_SIMULATIONS = 250, 2000
#: stop early once the estimate lies this many boundary standard errors from :data:`POWER_TARGET`
#: (a 4-SE excursion has probability ≈ 6·10⁻⁵ under a detection probability at the boundary)
STOP_AT = 4.0
#: the one-run tests whose power :func:`one_run_power` simulates
METHODS = ("steinke", "fdp")


@lru_cache(maxsize=1024)
def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP pair is exactly (ε, δ)-DP (δ(ε) increases with μ: Brent's root)."""
    if delta <= 0:
        raise ValueError("a Gaussian pair is (ε, δ)-DP only for δ > 0")
    high = 1.0
    while gdp_delta(high, epsilon) < delta:
        high *= 2.0
        if high > 1e4:
            return high
    return float(optimize.brentq(lambda mu: gdp_delta(mu, epsilon) - delta, 0.0, high, xtol=1e-13, rtol=1e-13))


def tight_scores(rng: np.random.Generator, inserted: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The optimal attack's scores on a mechanism exactly (ε, δ)-tight (see the module docstring).

    Randomised response gives two-valued scores: the audit meets them as it would in a score file,
    as two tied blocks (:func:`audit.core.empirical_epsilon.guess_counts` never splits one)."""
    if delta > 0:
        return gdp_mu(epsilon, delta) * inserted + rng.standard_normal(inserted.shape)
    right = rng.random(inserted.shape) < 1.0 / (1.0 + math.exp(-epsilon))
    return np.where(inserted == right, 1.0, -1.0)


@dataclass(frozen=True)
class AuditPower:
    """What the audit could show against the claim (ε, δ) with ``canaries`` coins."""

    canaries: int
    level: float  # the significance level the violation test uses (family-adjusted)
    tight_bound: float  # median ε_LB under a mechanism exactly as private as claimed
    detection: float  # probability of a violation verdict when the true ε is twice the claim
    needed: int | None  # coins for 80 % detection (normal approximation); None when beyond NEEDED_LIMIT
    simulations: int = 0  # simulated audits behind ``detection``
    detection_se: float = 0.0  # its Monte-Carlo standard error

    @property
    def powered(self) -> bool:
        return self.detection >= POWER_TARGET


def _rejects(method: str, canaries: int, guesses: int, correct: int, epsilon: float, delta: float, level: float) -> bool:
    """Does one abstention level's count reject (ε, δ) at ``level`` under the test ``method``?"""
    if method == "fdp":
        return fdp_rejects(canaries, guesses, correct, ApproximateDPTradeOff(epsilon, delta), level)
    return one_run_p_value(canaries, guesses, correct, epsilon, delta) <= level


def _bound(method: str, canaries: int, guesses: int, correct: int, delta: float, alpha: float) -> float:
    if method == "fdp":
        return fdp_epsilon_lower_bound(canaries, guesses, correct, delta, alpha)
    return one_run_epsilon_lower_bound(canaries, guesses, correct, delta, alpha)


def _detects(method: str, canaries: int, counts: tuple[tuple[int, int], ...], epsilon: float, delta: float,
             level: float) -> bool:
    """Bonferroni over the abstention levels: some level rejects at level / (number of levels)."""
    return any(_rejects(method, canaries, g, c, epsilon, delta, level / len(counts)) for g, c in counts)


def _needed(method: str, canaries: int, epsilon: float, delta: float, level: float,
            rng: np.random.Generator) -> int | None:
    """Smallest m (doubling) at which the 20th percentile of the counts detects 2ε: each abstention
    level's accuracy is read off one large simulated audit (the same guessing rule, ties included)."""
    sample = np.arange(20000) < 10000
    accuracy = [c / g for g, c in guess_counts(tight_scores(rng, sample, 2.0 * epsilon, delta), sample)]
    m = canaries
    while m <= NEEDED_LIMIT // 2:
        m *= 2
        counts = []
        for fraction, share in zip(GUESS_FRACTIONS, accuracy):
            g = min(m, max(2, int(fraction * m)))
            low = g * share - 0.8416 * math.sqrt(g * share * (1 - share))
            counts.append((g, int(min(g, max(0, math.floor(low))))))
        if _detects(method, m, tuple(counts), epsilon, delta, level):
            return m
    return None


def _critical_count(method: str, canaries: int, guesses: int, epsilon: float, delta: float, level: float) -> int:
    """The fewest correct guesses (of ``guesses``) whose p-value is ≤ ``level``; guesses + 1 when
    none is (the p-value falls as the count rises, so a bisection finds it)."""
    if not _rejects(method, canaries, guesses, guesses, epsilon, delta, level):
        return guesses + 1
    low, high = 0, guesses  # p(low) > level ≥ p(high), once low is checked
    if _rejects(method, canaries, guesses, 0, epsilon, delta, level):
        return 0
    while high - low > 1:
        middle = (low + high) // 2
        if _rejects(method, canaries, guesses, middle, epsilon, delta, level):
            high = middle
        else:
            low = middle
    return high


#: the abstention levels the simulations count at: the audit's default ones and the finer ones a
#: design may pre-register (:func:`preregistered_fraction`)
FRACTION_GRID = (0.005, 0.01) + GUESS_FRACTIONS
#: the fewest guesses a pre-registered level may make
MIN_PREREGISTERED_GUESSES = 100


def level_budgets(canaries: int, fractions: tuple[float, ...]) -> list[int]:
    """Guesses at each abstention level, as :func:`guess_counts` makes them."""
    return [min(canaries, max(2, int(fraction * canaries))) for fraction in fractions]


class _Simulation:
    """Simulated audits of one design (``canaries`` coins) against a tight and a twice-as-leaky
    mechanism, drawn in batches from one stream keyed by (seed, canaries, ε, δ) and shared by
    every test and level asked about it (both methods see the same counts), counted at every
    level of :data:`FRACTION_GRID`."""

    def __init__(self, canaries: int, epsilon: float, delta: float, seed: int):
        self.canaries, self.epsilon, self.delta = canaries, epsilon, delta
        self.rng = np.random.default_rng([seed, canaries, *_float_key(epsilon), *_float_key(delta)])
        self.tight: list[list[int]] = []
        self.leaky: list[list[int]] = []

    def counts(self, simulations: int) -> tuple[np.ndarray, np.ndarray]:
        """Correct-guess counts [simulations, levels] of the tight and the leaky mechanism."""
        while len(self.tight) < simulations:
            inserted = self.rng.random(self.canaries) < 0.5
            for epsilon, out in ((self.epsilon, self.tight), (2.0 * self.epsilon, self.leaky)):
                scores = tight_scores(self.rng, inserted, epsilon, self.delta)
                # Gaussian scores (δ > 0) have no ties; randomised response's two values do
                out.append(simulated_counts(scores, inserted, FRACTION_GRID) if self.delta > 0
                           else [c for _, c in guess_counts(scores, inserted, FRACTION_GRID)])
        return np.array(self.tight[:simulations]), np.array(self.leaky[:simulations])


def simulated_counts(scores: np.ndarray, inserted: np.ndarray,
                     fractions: tuple[float, ...] = GUESS_FRACTIONS) -> list[int]:
    """The correct counts :func:`guess_counts` gives for scores *without ties*, found by
    partitioning at the abstention levels' cut ranks instead of sorting all scores (the power
    simulation's cost at 10⁵ coins). Without ties the top a and bottom b canaries of a level are
    the a highest and b lowest scores whatever the sort, so the counts are exactly guess_counts'
    (a = ⌈k/2⌉, b = ⌊k/2⌋); a tie at a cut rank falls back to guess_counts' tie rule."""
    m = len(scores)
    budgets = level_budgets(m, fractions)
    tops = [budget - budget // 2 for budget in budgets]
    bottoms = [budget // 2 for budget in budgets]
    ranks = sorted({m - a for a in tops if 0 < a < m} | {b - 1 for b in bottoms if 0 < b <= m})
    parted = np.partition(scores, ranks) if ranks else np.sort(scores)
    cut_values = parted[ranks]
    if ranks and (np.isin(scores, cut_values).sum() != np.unique(cut_values).size):  # a tie at a cut
        return [c for _, c in guess_counts(scores, inserted, fractions)]
    members, outside = int(inserted.sum()), int(m - inserted.sum())
    counts = []
    for a, b in zip(tops, bottoms):
        right = 0
        if a > 0:  # the a highest: scores ≥ the (m − a)-th order statistic
            right += int(inserted[scores >= parted[m - a]].sum()) if a < m else members
        if b > 0:  # the b lowest: scores ≤ the (b − 1)-th order statistic, right when not inserted
            right += int((~inserted[scores <= parted[b - 1]]).sum()) if b < m else outside
        counts.append(right)
    return counts


def _float_key(value: float) -> tuple[int, int]:
    """A float as two 32-bit words of its IEEE bits: the whole value keys the stream."""
    bits = int(np.float64(value).view(np.uint64))
    return bits >> 32, bits & 0xFFFFFFFF


@lru_cache(maxsize=64)
def _simulation(canaries: int, epsilon: float, delta: float, seed: int) -> _Simulation:
    return _Simulation(canaries, epsilon, delta, seed)


@lru_cache(maxsize=256)
def one_run_power(canaries: int, epsilon: float, delta: float, level: float, seed: int = 0,
                  simulations: int = MAX_SIMULATIONS, method: str = "steinke",
                  fractions: tuple[float, ...] = GUESS_FRACTIONS) -> AuditPower:
    """Power of the one-run audit with ``canaries`` independent coins against an (ε, δ) claim,
    its violation test (``method``: "steinke" or "fdp") run at ``level``. Deterministic in ``seed``.

    A simulated audit detects when some abstention level's count reaches the smallest count
    whose Bonferroni-adjusted p-value is ≤ ``level`` (computed once per level). The verdict reads
    the detection probability against :data:`POWER_TARGET`, so its Monte-Carlo error matters only
    near that boundary: audits are simulated in batches of :data:`BATCH` until the estimate lies
    :data:`STOP_AT` boundary standard errors from the target, or ``simulations`` (by default
    2,000: a standard error ≤ 0.009 at the boundary) are done. ``fractions``: the abstention
    levels the audit tries (a subset of :data:`FRACTION_GRID`; Bonferroni over them)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if canaries < 2 or not math.isfinite(epsilon) or not 0 <= delta < 1:
        return AuditPower(canaries, level, 0.0, 0.0, None)
    if not set(fractions) <= set(FRACTION_GRID):
        raise ValueError(f"fractions must be levels of {FRACTION_GRID}, got {fractions}")
    simulation = _simulation(canaries, epsilon, delta, seed)
    columns = [FRACTION_GRID.index(f) for f in fractions]
    guesses = level_budgets(canaries, fractions)
    critical = np.array([_critical_count(method, canaries, g, epsilon, delta, level / len(guesses)) for g in guesses])
    done = 0
    while True:
        done = min(simulations, done + BATCH)
        tight, leaky = (counts[:, columns] for counts in simulation.counts(done))
        detection = float(np.mean((leaky >= critical[None, :]).any(axis=1)))
        boundary_se = math.sqrt(POWER_TARGET * (1 - POWER_TARGET) / done)
        if done >= simulations or abs(detection - POWER_TARGET) > STOP_AT * boundary_se:
            break
    smoothed = (detection * done + 0.5) / (done + 1)  # never 0 at an estimate of 0 or 1
    # median bound at the claim: each abstention level's bound is monotone in its count, so its
    # median is the bound at the median count; the audit reports the best level
    alpha = 0.05 / len(fractions)
    medians = np.median(tight, axis=0)
    tight_bound = max(_bound(method, canaries, g, int(c), delta, alpha) for g, c in zip(guesses, medians))
    rng = np.random.default_rng([seed, canaries, *_float_key(epsilon), *_float_key(delta), 1])
    needed = None if detection >= POWER_TARGET else _needed(method, canaries, epsilon, delta, level, rng)
    return AuditPower(canaries, level, tight_bound, detection, needed, done, math.sqrt(smoothed * (1 - smoothed) / done))


@lru_cache(maxsize=256)
def preregistered_fraction(canaries: int, epsilon: float, delta: float, method: str, seed: int = 0) -> float | None:
    """The single abstention level an audit of ``canaries`` coins against the claim (ε, δ) should
    use: among the levels of :data:`FRACTION_GRID` with ≥ :data:`MIN_PREREGISTERED_GUESSES`
    guesses, the one most likely to call a mechanism twice as leaky a violation at 5 %, and among
    those within 0.02 of the best, the one whose bound is largest at the median of simulated audits
    of the exactly tight mechanism. It depends on the design and the claim only — never on the
    scores — so the audit may test that one level at the full α instead of trying six at α/6
    (Steinke, Nasr, Jagielski 2023 fix the number of guesses in advance): the Bonferroni factor's
    price, about 0.05 in ε at 10⁵ coins and ε = 1, is not paid. None where no level qualifies or
    the claim is not finite."""
    if canaries < 2 or not math.isfinite(epsilon) or not 0 < delta < 1 or method not in METHODS:
        return None
    tight, leaky = _simulation(canaries, epsilon, delta, seed).counts(BATCH)
    medians = np.median(tight, axis=0)
    candidates = []
    for column, (fraction, guesses) in enumerate(zip(FRACTION_GRID, level_budgets(canaries, FRACTION_GRID))):
        if guesses < MIN_PREREGISTERED_GUESSES:
            continue
        critical = _critical_count(method, canaries, guesses, epsilon, delta, 0.05)
        detection = float(np.mean(leaky[:, column] >= critical))
        candidates.append((detection, _bound(method, canaries, guesses, int(medians[column]), delta, 0.05), fraction))
    if not candidates:
        return None
    best = max(c[0] for c in candidates)
    return max((c for c in candidates if c[0] >= best - 0.02), key=lambda c: (c[1], c[2]))[2]


def power_caveat(rate: float = 1.0, noise: str = "Gaussian", composed: str = "") -> str:
    """Why no power is stated for coins whose mechanism is ``noise`` subsampled at ``rate``
    (``composed``: e.g. " and composed over 100 steps"); "" when the power model applies: Gaussian
    noise without sampling.

    The power above is that of the optimal attack on the μ-GDP pair at twice the claim. A
    subsampled Gaussian is not shaped like it: its privacy loss is mostly small with rare large
    excursions, so at the same (ε, δ) the one-run counts certify far less of it (measured: DP-SGD
    steps at q = 0.05 over 100 steps with Gaussian noise halved have ε ≈ 15 where a claim of 4
    holds, yet 10⁵ canaries certify ≈ 3.4), and Laplace or staircase noise has other curves again —
    a twice-as-leaky implementation could pass unnoticed while the power model promised to catch
    it. Such a bound is never called consistent: the verdict says inconclusive, and why
    (:mod:`reports.soundness`)."""
    if rate >= 1.0 and noise == "Gaussian":
        return ""
    what = f"{noise} noise subsampled at q = {rate:.3g}" if rate < 1.0 else f"{noise} noise"
    return (f"the power model (the optimal attack on a μ-GDP mechanism at twice the claim) does not describe {what}"
            f"{composed}, whose trade-off curve is far from Gaussian: a violation of the claim can go undetected")
