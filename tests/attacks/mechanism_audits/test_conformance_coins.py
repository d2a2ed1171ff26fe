"""The conformance audit's coin test of a per-weight claim: every coordinate of a trial's target
row is a coin of the one-run count bound (Steinke, Nasr and Jagielski 2023). Its law under a tight
claim is derived here independently of the audit's code: a weight at either end of its range,
reported by the two-point mechanism of LDP-FL (Sun, Qian, Chen 2021, Eq. 4) at ε, lands on the
side of its sign with probability e^ε/(1 + e^ε) — ε-randomised response — so the bound on such
coins must stay at or below ε at its confidence, and sit close to ε with 10⁵ of them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from audit.core.empirical_epsilon import one_run_audit


def _coins(epsilon: float, coins: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Scores as the coin test reads them: ±1 (the report's side) less a per-coordinate centre
    that is independent of the signs (the zero-input trials' mean)."""
    signs = rng.choice([-1.0, 1.0], size=coins)
    kept = rng.random(coins) < 1.0 / (1.0 + math.exp(-epsilon))
    centre = 0.01 * rng.standard_normal(coins)
    return np.where(kept, signs, -signs) - centre, signs > 0


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_at_a_tight_claim_the_coin_bound_exceeds_epsilon_at_most_at_its_level(epsilon):
    """300 audits of exact ε-randomised response, 10⁵ coins each, at α = 0.05: the bound exceeds ε
    in at most 5 % of them (the binomial(300, 0.05) 99.9 % quantile: 28 of 300; measured 10 and 11),
    and its median is within 5 % of ε."""
    rng = np.random.default_rng(int(epsilon * 10))
    bounds = np.array([one_run_audit(*_coins(epsilon, 100_000, rng), delta=0.0, alpha=0.05).epsilon for _ in range(300)])
    assert int((bounds > epsilon).sum()) <= 28, bounds.max()
    assert np.median(bounds) == pytest.approx(epsilon, rel=0.05)


def test_a_coin_drawn_at_twice_epsilon_is_above_the_claim():
    """A biased coin (probability of the twice-ε response) is caught by the bound in every one of 20
    audits at a claimed ε = 4 (its true ε is 8)."""
    rng = np.random.default_rng(3)
    bounds = [one_run_audit(*_coins(8.0, 100_000, rng), delta=0.0, alpha=0.05).epsilon for _ in range(20)]
    assert min(bounds) > 4.0, bounds
