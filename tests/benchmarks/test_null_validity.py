"""The small version of ``benchmarks/null_validity.py``: the one-run ε lower bounds and their
verdicts on inputs whose truth is known, through the benchmark's own simulation (which calls the
functions the command line uses).

The limits come from the statistics, not from the code: on pure null scores a bound built at
confidence 1 − α is positive in at most a fraction α of the audits, so the count over n audits is
at most Binomial(n, α)'s 99.9 % quantile (a valid method fails this with probability ≤ 0.1 %); at
an exactly tight claim a verdict at level 5 % is a false VIOLATION in at most 5 % of the audits,
so the count is at most Binomial(n, 0.05)'s 99 % quantile. And so that the test can fail: scores
of a mechanism with half the claimed noise (twice the claimed Gaussian shift) must be flagged in
most audits by the test against the mechanism's own curve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
nv = load_script(ROOT / "benchmarks" / "null_validity.py", "null_validity_benchmark")

EPSILON = 1.0
COINS = 2000
NULL_REPLICATES = 120
TIGHT_REPLICATES = 60
VERDICT_LEVEL = 0.05


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, list]]:
    """scenario → method → the outcome of every replicate (null: NULL_REPLICATES, tight: TIGHT_REPLICATES)."""
    rng = np.random.default_rng(20261203)
    out: dict[str, dict[str, list]] = {"null": {}, "tight": {}}
    for r in range(NULL_REPLICATES):
        scenarios = ("null", "tight") if r < TIGHT_REPLICATES else ("null",)
        for scenario, by_method in nv.replicate(rng, COINS, EPSILON, scenarios=scenarios).items():
            for method, outcome in by_method.items():
                out[scenario].setdefault(method, []).append(outcome)
    return out


@pytest.mark.parametrize("method", nv.METHODS)
def test_a_null_bound_is_positive_at_most_at_its_level(outcomes, method):
    null = outcomes["null"][method]
    alpha = null[0].alpha
    assert len(null) == NULL_REPLICATES and alpha == 0.05
    positives = sum(o.epsilon > 0 for o in null)
    assert positives <= stats.binom.ppf(0.999, len(null), alpha), f"{method}: ε_LB > 0 in {positives}/{len(null)} null audits"
    violations = sum(o.violation for o in null)
    assert violations <= stats.binom.ppf(0.99, len(null), VERDICT_LEVEL)


@pytest.mark.parametrize("method", nv.METHODS)
def test_a_tight_claim_is_rarely_a_violation(outcomes, method):
    tight = outcomes["tight"][method]
    assert len(tight) == TIGHT_REPLICATES
    # the own curve is held to the mechanism's exact ε (PLD), which is the claim's ε for this mechanism
    assert tight[0].held_to == pytest.approx(EPSILON, rel=1e-6)
    violations = sum(o.violation for o in tight)
    assert violations <= stats.binom.ppf(0.99, len(tight), VERDICT_LEVEL), \
        f"{method}: false VIOLATION in {violations}/{len(tight)} audits at an exactly tight claim"


def test_half_the_claimed_noise_is_flagged():
    """The Gaussian release with twice the claimed shift (half the noise) at ε = 4, 3,000 coins:
    the own-curve test flags it in most audits (it is far above a 5 % false-alarm rate)."""
    rng = np.random.default_rng(7)
    replicates = 8
    flagged = sum(nv.replicate(rng, 3000, 4.0, scenarios=("tight",), shift=2.0)["tight"]["own_curve"].violation
                  for _ in range(replicates))
    assert flagged > replicates / 2
    assert flagged > stats.binom.ppf(0.999, replicates, VERDICT_LEVEL)
