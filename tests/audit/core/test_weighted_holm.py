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
