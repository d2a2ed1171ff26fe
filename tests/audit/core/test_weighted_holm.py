"""Holm's weighted step-down procedure (Holm 1979, §5): family-wise error at most α for fixed
weights, checked by simulation under the global null with dependent p-values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from audit.core.multiplicity import holm, weighted_holm


def test_equal_weights_are_holms_procedure():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.random(7) ** 3
        assert weighted_holm(list(p), [2.0] * 7, 0.05) == holm(list(p), 0.05)


def _holm_adjusted(p_values):
    """Holm's adjusted p-values (Wright 1992, eq. 5): p̃₍ᵢ₎ = max_{j ≤ i} min(1, (k − j + 1)·p₍ⱼ₎);
    a hypothesis is rejected at level α iff p̃ ≤ α. An independent formulation of the procedure
    (R's ``p.adjust(p, "holm")``, statsmodels' ``multipletests(p, method="holm")``)."""
    k, order = len(p_values), np.argsort(p_values, kind="stable")
    adjusted = np.empty(k)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def test_holm_rejects_what_the_adjusted_p_values_reject():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
    assert _holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [r for r, _ in holm([0.01, 0.04, 0.03, 0.005], 0.05)] == [True, False, False, True]
    rng = np.random.default_rng(2)
    for _ in range(2000):
        k = int(rng.integers(1, 12))
        p = rng.random(k) ** int(rng.integers(1, 6))
        if rng.random() < 0.3:  # ties
            p = np.round(p, 2)
        alpha = float(rng.choice([0.01, 0.05, 0.1]))
        decisions = holm(list(p), alpha)
        assert [r for r, _ in decisions] == list(_holm_adjusted(p) <= alpha)
        # the i-th smallest p-value is compared with α/(k − i + 1)
        assert sorted(level for _, level in decisions) == pytest.approx([alpha / (k - i) for i in range(k)])


def test_a_heavy_test_is_compared_with_its_share_of_alpha():
    """Weights (8, 1, 1): the first is tested at α·8/10, the others at α/10 until one is rejected."""
    decisions = weighted_holm([0.039, 0.5, 0.6], [8.0, 1.0, 1.0], 0.05)
    assert decisions[0] == (True, pytest.approx(0.04))
    assert decisions[1][1] == pytest.approx(0.05 * 1 / 2) and not decisions[1][0]


@pytest.mark.parametrize("correlation", [0.0, 0.6, 0.95])
def test_the_familywise_error_stays_at_alpha_under_the_null(correlation):
    """8 one-sided z-tests of true nulls, equicorrelated, weights spread over two orders of
    magnitude: rejections of any in ≤ α of 20,000 families (binomial 99.9 % upper limit)."""
    rng = np.random.default_rng(1)
    k, families, alpha = 8, 20_000, 0.05
    weights = [10.0, 5.0, 1.0, 1.0, 0.5, 0.2, 0.1, 0.1]
    shared = rng.standard_normal((families, 1))
    z = np.sqrt(correlation) * shared + np.sqrt(1 - correlation) * rng.standard_normal((families, k))
    p = stats.norm.sf(z)
    errors = sum(any(r for r, _ in weighted_holm(list(row), weights, alpha)) for row in p)
    assert errors <= stats.binom.ppf(0.999, families, alpha)


def test_weights_must_be_positive():
    with pytest.raises(ValueError):
        weighted_holm([0.1, 0.2], [1.0, 0.0])
