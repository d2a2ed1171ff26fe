"""The power simulation's partition-based counts are guess_counts' counts (the simulation must
simulate the audit that runs, not a cheaper one)."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.audit_power import simulated_counts
from audit.core.empirical_epsilon import guess_counts


@pytest.mark.parametrize("m", [2, 3, 5, 100, 1001, 20_000])
def test_partition_counts_equal_the_audits_counts(m):
    rng = np.random.default_rng(m)
    for _ in range(10):
        inserted = rng.random(m) < 0.5
        scores = rng.standard_normal(m) + inserted
        assert simulated_counts(scores, inserted) == [c for _, c in guess_counts(scores, inserted)]
        rounded = np.round(scores, 1)  # ties: the audit's tie rule, by the fallback
        assert simulated_counts(rounded, inserted) == [c for _, c in guess_counts(rounded, inserted)]


def test_a_preregistered_level_keeps_the_false_violation_rate_of_a_tight_mechanism():
    """The level is chosen from (coins, claim, test) alone; tested at the full α it rejects an
    exactly tight μ-GDP mechanism in at most 5 % of audits (300 simulated audits, binomial 99.9 %)."""
    from scipy import stats

    from audit.core.audit_power import FRACTION_GRID, gdp_mu, preregistered_fraction
    from audit.core.empirical_epsilon import guess_counts
    from audit.core.fdp_one_run import ApproximateDPTradeOff, fdp_rejects

    m, epsilon, delta = 20_000, 1.0, 1e-5
    fraction = preregistered_fraction(m, epsilon, delta, "fdp")
    assert fraction in FRACTION_GRID and preregistered_fraction(m, epsilon, delta, "fdp") == fraction
    rng = np.random.default_rng(11)
    mu = gdp_mu(epsilon, delta)
    rejections = 0
    for _ in range(300):
        inserted = rng.random(m) < 0.5
        ((guesses, correct),) = guess_counts(rng.standard_normal(m) + mu * inserted, inserted, (fraction,))
        rejections += fdp_rejects(m, guesses, correct, ApproximateDPTradeOff(epsilon, delta), 0.05)
    assert rejections <= stats.binom.ppf(0.999, 300, 0.05)
