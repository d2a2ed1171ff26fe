"""A parametric test of a Gaussian claim on statistics that are Gaussian by construction: an
estimate-based verdict, distinct from the rigorous one-run bounds.

A Dirac canary's standardised sum (:func:`audit.core.gaussian_canary_statistics.standardised_sum`)
is, for a mechanism that adds Gaussian noise to a sum the canary moves in the steps it joins,
N(a, v) when the canary is held out and N(a + b·μᵢ, v) when it is inserted, where μᵢ is the
shift the claim accounts for canary i (√n/σ after n steps of multiplier σ; a weighted sum's
√Σμ_t²). Under the claim b/√v = 1; the pair of canary i is then exactly μᵢ-GDP (Dong, Roth & Su
2022, "Gaussian Differential Privacy", Def. 2.6 and Thm. 2.7), and a mechanism whose pair is
θ·μᵢ-GDP has θ = b/√v. Less noise than accounted (or a larger contribution: a skipped clip) is
θ > 1. So the question "is the mechanism more distinguishable than claimed?" is a question about
the slope of a normal linear model x = a + b·c + e with the known covariate cᵢ = μᵢ·[inserted],
in units of the noise std. Its law is exact: with S_cc = Σ(cᵢ − c̄)², the slope's t statistic
t = b̂·√S_cc / s is noncentral t with n − 2 degrees of freedom and noncentrality θ·√S_cc
(Hedges & Olkin 1985, "Statistical Methods for Meta-Analysis", ch. 5 §B, for two groups, where
θ·μ is Cohen's standardised mean difference). That gives an exact one-sided p-value of
H₀: θ ≤ θ₀ and an exact lower confidence bound on θ, which the claim's δ turns into an ε
estimate (:func:`audit.core.fdp_one_run.gdp_epsilon` of θ·μ). θ₀ = 1 tests the claimed
mechanism itself; where the claim's ε comes from a looser accountant than the mechanism's exact
curve, θ₀ is the ratio at which the pair's exact ε reaches the claimed ε
(gdp_mu(ε, δ) / μ of the canary the claim's worst case is about).

This is *not* a bound that holds whatever the scores are: it holds when the model holds. Hence
the goodness-of-fit gate, decided before the test is read: the residuals must not reject
normality (D'Agostino & Pearson's omnibus test of skewness and kurtosis), and the inserted and
held-out canaries must not reject equal variances (the F test); each at gate_alpha / 2. Noise of
the claimed variance but another shape — uniform (kurtosis 1.8), Laplace (6) — fails the gate at
the sample sizes of a canary audit, and then the test says nothing (``applies`` is False),
leaving the rigorous bounds to speak. Participation hidden from the observer makes the inserted
scores a mixture, which fails the variance check.

The false-violation rate of the gated test under exactly tight and conservative claims, with
Gaussian and non-Gaussian noise of the claimed variance, is measured by simulation in
``benchmarks/parametric_gdp.py`` and in the suite.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audit.core.audit_power import gdp_mu
from audit.core.fdp_one_run import gdp_epsilon
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import optimize, stats
else:  # imported with the first test: `list` and `config` name attacks without scipy
    optimize = lazy_module("scipy.optimize")
    stats = lazy_module("scipy.stats")

#: fewest scores per group the test reads (the omnibus normality test needs ≥ 20 in all; the
#: F test's and the t's laws are exact at any size, but a handful of coins has no power anyway)
MIN_PER_GROUP = 50


@dataclass(frozen=True)
class ParametricGDP:
    """The gated test of θ ≤ θ₀ on the scores of inserted and held-out canaries; θ is the
    mechanism's distinguishability over the claimed one (the GDP μ of a canary's pair over μᵢ)."""

    inserted: int
    held_out: int
    claimed_mu: float  # the claimed μ the ratios scale: the one given, or the inserted μᵢ's root mean square
    ratio_hat: float  # θ̂ = b̂ / s, the estimate of θ
    ratio_low: float  # its exact one-sided lower confidence bound at 1 − alpha (≥ 0)
    null_ratio: float  # θ₀
    p_value: float  # of H₀: θ ≤ θ₀, exact under the model
    normality_p: float  # D'Agostino–Pearson on the residuals
    variance_p: float  # two-sided F test of equal variances, inserted against held out
    alpha: float
    gate_alpha: float
    spread: float = 0.0  # √S_cc: the t statistic's noncentrality per unit of θ (fixed by the coins, not the scores)

    @property
    def applies(self) -> bool:
        """Whether the goodness-of-fit gate let the test speak (each check at gate_alpha / 2)."""
        return min(self.normality_p, self.variance_p) > self.gate_alpha / 2

    @property
    def violation(self) -> bool:
        """The estimate-based verdict: the model holds and rejects θ ≤ θ₀ at ``alpha``."""
        return self.applies and self.p_value <= self.alpha

    @property
    def gate_figures(self) -> str:
        """The gate's two p-values and the level each is checked at, for a sentence."""
        return (f"normality p = {self.normality_p:.2g}, equal variances p = {self.variance_p:.2g}, each checked at "
                f"{self.gate_alpha / 2:.2g}")

    @property
    def gated_p_value(self) -> float:
        """The p-value a family of tests reads: :attr:`p_value` where the gate let the test speak,
        else 1 (never rejects). Under the model the gate's statistics are scale-free functions of
        the residuals, independent of the t statistic (Basu's theorem), so this stays a valid
        p-value: P(gated ≤ u) = P(gate passes)·u ≤ u."""
        return self.p_value if self.applies else 1.0

    def power(self, level: float, ratio: float) -> float:
        """The probability that the test rejects θ ≤ θ₀ at ``level`` when θ = ``ratio`` (gate
        aside): the noncentral t's tail beyond its critical value — a function of the design (the
        coins and their claimed μᵢ), not of the scores."""
        df = self.inserted + self.held_out - 2
        critical = float(stats.nct.isf(level, df, self.null_ratio * self.spread))
        return _nct_sf(critical, df, ratio * self.spread)

    @property
    def mu_hat(self) -> float:
        """The estimated μ of a canary whose claimed μ is :attr:`claimed_mu`."""
        return self.ratio_hat * self.claimed_mu

    @property
    def mu_low(self) -> float:
        """The lower confidence bound of that μ."""
        return self.ratio_low * self.claimed_mu

    def epsilon_low(self, delta: float) -> float:
        """The ε at ``delta`` of μ_low-GDP: the lower end of the ε estimate."""
        return gdp_epsilon(self.mu_low, delta) if self.mu_low > 0 else 0.0

    def claim_epsilon_low(self, epsilon: float, delta: float) -> float:
        """Where θ₀ was set from a claim (ε, δ) as gdp_mu(ε, δ)/μ* — μ* the claimed μ of the unit the
        claim's worst case is about — the lower end of that unit's ε at ``delta``: the ε of
        θ_low·μ*-GDP. It exceeds ``epsilon`` exactly when θ_low exceeds θ₀."""
        mu = self.ratio_low / self.null_ratio * gdp_mu(epsilon, delta)
        return gdp_epsilon(mu, delta) if mu > 0 else 0.0


def _nct_sf(t: float, df: float, nc: float) -> float:
    """P(T ≥ t) for T noncentral t. Far in the tail (p below 1e-200, e.g. half the claimed noise
    at 10⁴ coins) the library's series may stop before converging and warn; the value it returns
    is still far below any level, so the warning says nothing a verdict needs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*did not converge.*", category=RuntimeWarning)
        return float(stats.nct.sf(t, df, nc))


def _lower_noncentrality(t: float, df: float, alpha: float) -> float:
    """The noncentrality λ with P(T ≥ t | λ) = alpha (the sf rises with λ), or 0 when even λ = 0
    leaves t unremarkable: the exact one-sided lower confidence bound of λ."""
    if _nct_sf(t, df, 0.0) >= alpha:
        return 0.0
    high = max(1.0, 2.0 * t)
    while _nct_sf(t, df, high) < alpha:
        high *= 2.0
    return float(optimize.brentq(lambda nc: _nct_sf(t, df, nc) - alpha, 0.0, high, xtol=1e-10, rtol=1e-12))


def parametric_gdp_test(scores: np.ndarray, inserted: np.ndarray, claimed_mu: float | np.ndarray, alpha: float = 0.05,
                        gate_alpha: float = 0.01, null_ratio: float = 1.0) -> ParametricGDP | None:
    """The gated noncentral-t test of θ ≤ ``null_ratio`` on ``scores`` (one per canary, shifted up when
    inserted) split by ``inserted`` (bool); ``claimed_mu`` is the shift the claim accounts for an
    inserted canary in units of the noise std, one for all or one per canary (read where
    inserted). None: fewer than :data:`MIN_PER_GROUP` scores in a group, or no spread."""
    x = np.asarray(scores, dtype=np.float64)
    mask = np.asarray(inserted, dtype=bool)
    if x.shape != mask.shape or x.ndim != 1:
        raise ValueError(f"scores and inserted must be 1-D of one length, got {x.shape} and {mask.shape}")
    mu = np.broadcast_to(np.asarray(claimed_mu, dtype=np.float64), x.shape)
    if not (np.all(np.isfinite(mu[mask])) and np.all(mu[mask] > 0)):
        raise ValueError("claimed_mu must be finite and > 0 for every inserted canary")
    if not (math.isfinite(null_ratio) and null_ratio > 0):
        raise ValueError(f"null_ratio must be finite and > 0, got {null_ratio}")
    if not (0 < alpha < 1 and 0 < gate_alpha < 1):
        raise ValueError(f"alpha and gate_alpha must be in (0, 1), got {alpha}, {gate_alpha}")
    if not np.all(np.isfinite(x)):
        raise ValueError("scores must be finite")
    n1, n0 = int(mask.sum()), int((~mask).sum())
    if min(n1, n0) < MIN_PER_GROUP:
        return None
    covariate = np.where(mask, mu, 0.0)
    centred = covariate - covariate.mean()
    s_cc = float(centred @ centred)
    slope = float(centred @ (x - x.mean())) / s_cc
    residuals = x - x.mean() - slope * centred
    df = x.size - 2
    residual_var = float(residuals @ residuals) / df
    if not residual_var > 0:
        return None
    root = math.sqrt(s_cc)
    t = slope * root / math.sqrt(residual_var)
    p_value = _nct_sf(t, df, null_ratio * root)
    ratio_low = _lower_noncentrality(t, df, alpha) / root
    normality_p = float(stats.normaltest(residuals).pvalue)
    v1, v0 = residuals[mask].var(ddof=1), residuals[~mask].var(ddof=1)
    ratio = v1 / v0 if v0 > 0 else math.inf
    f_tail = stats.f.sf(ratio, n1 - 1, n0 - 1) if ratio >= 1 else stats.f.cdf(ratio, n1 - 1, n0 - 1)
    variance_p = float(min(1.0, 2.0 * f_tail))
    reference = float(np.sqrt(np.mean(mu[mask] ** 2)))
    return ParametricGDP(inserted=n1, held_out=n0, claimed_mu=reference, ratio_hat=slope / math.sqrt(residual_var),
                         ratio_low=ratio_low, null_ratio=float(null_ratio), p_value=p_value, normality_p=normality_p,
                         variance_p=variance_p, alpha=alpha, gate_alpha=gate_alpha, spread=root)
