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
