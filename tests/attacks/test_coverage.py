"""The verdict statistics, validated by simulation: the small version of
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

from audit.validation import (
    accuracy_coverage,
    gaussian_fit_coverage,
    known_effect,
    pipeline_leaky,
    pipeline_null,
    tight_claim,
)

#: the benchmark runs 200 of each; here just enough to catch the failures the statistics were
#: chosen against: at 60 replicates a correct interval's coverage is ≥ 0.866 within 3 binomial
#: standard errors, an interval 1.7× too narrow covers ≈ 0.76
REPLICATES = 60
PIPELINE_REPLICATES = 20  # about 2 s each: training, attacks and verdicts of one small audit (≥ 0.80)


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


def test_the_pipeline_intervals_cover_chance_under_a_null():
    """(a) through the real training, attacks and verdicts: AUC intervals cover ½ (3 binomial
    standard errors at n = 20: ≥ 0.80), and no experiment is called a violation."""
    tallies = pipeline_null(PIPELINE_REPLICATES, start_seed=500, progress=False)
    for attack in ("lira-online", "lira-offline", "shokri", "loss-threshold"):
        tally = tallies[f"{attack} auc"]
        assert tally.total == PIPELINE_REPLICATES and tally.rate >= 0.95 - _tolerance(tally.total), (attack, tally)
    assert tallies["experiment without a VIOLATION"].rate == 1.0


def test_the_pipeline_intervals_cover_a_leaky_designs_expected_auc():
    """(b1): on non-private FedAvg the AUC intervals cover the design's expected AUC (the mean
    over the replicates) within 3 binomial standard errors, and the seed-to-seed spread is what
    the intervals say (their implied SE within a factor 1.6 of the SD: at n = 20 an SD is
    known to ±16 %)."""
    for name, (tally, truth, sd, implied) in pipeline_leaky(PIPELINE_REPLICATES, start_seed=7 * 10**5, progress=False).items():
        if not name.endswith(" auc"):
            continue
        assert truth > 0.5 and abs(tally.rate - 0.95) <= _tolerance(tally.total), (name, tally, truth)
        assert 1 / 1.6 <= implied / sd <= 1.6, (name, sd, implied)


def test_the_gaussian_fit_interval_covers_the_true_epsilon():
    """The Gaussian fit's 95 % interval at 100 canaries, μ = 1 (the canary statistics exactly the
    μ-GDP pair): 400 replicates must cover the pair's ε at δ = 1e-5 at 0.95 within 3 binomial
    standard errors (≥ 0.917). The percentile bootstrap of the shift it replaces covered 0.905."""
    tally = gaussian_fit_coverage(400, canaries=100, mu=1.0, seed=21)
    assert tally.total >= 390 and abs(tally.rate - 0.95) <= _tolerance(tally.total), tally


def test_the_accuracy_interval_is_as_wide_as_the_accuracy_varies():
    """The membership accuracy at thresholds fitted on the other runs, under the null of a crossed
    design with a run effect: its interval must cover ½ and its implied standard error must not
    fall short of the seed-to-seed SD (at 30 replicates an SD is known to ±13 %: a ratio ≥ 0.8).
    Holding the thresholds fixed in the bootstrap gave 0.0096 against an SD of 0.0147 (0.65) and
    covered ½ in 81 % of the replicates."""
    tally, truth, sd, implied = accuracy_coverage(30, seed=22, bootstrap=200)
    assert truth == 0.5 and tally.total == 30
    assert tally.rate >= 0.95 - _tolerance(tally.total), tally
    assert implied / sd >= 0.8, (sd, implied)
