"""The verdict statistics, validated by simulation (issue 17, item 2): the small version of
``benchmarks/coverage.py``.

With n replicates a 95 % interval's empirical coverage is Binomial(n, 0.95)/n; we accept it when
it lies within 3 binomial standard errors of 0.95, which a correct interval fails with
probability < 0.3 %. An interval that ignores the design's dependence (DeLong on 16 × 40
correlated scores) is typically 1.7× too narrow: coverage ≈ 0.76, far outside. Under an exactly
tight claim the rate of experiments with a VIOLATION must not exceed 5 % by more than 3 standard
errors.
"""

from __future__ import annotations

import math

import pytest

from audit.validation import known_effect, tight_claim

REPLICATES = 120


def _tolerance(n: int, rate: float = 0.95) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / n)


@pytest.mark.parametrize("mu", [0.0, 1.0])
def test_two_way_intervals_cover_the_truth_on_a_crossed_design(mu):
    tallies = known_effect(REPLICATES, mu=mu, seed=11, bootstrap=300)
    for name, tally in tallies.items():
        assert tally.total >= REPLICATES * 0.9, name
        assert abs(tally.rate - 0.95) <= _tolerance(tally.total), (mu, name, tally.rate)


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-5), (0.5, 0.0)])
def test_a_tight_claim_is_rarely_called_a_violation(epsilon, delta):
    rate, n = tight_claim(REPLICATES, epsilon, delta, seed=12)
    assert rate <= 0.05 + _tolerance(n, 0.05), rate
