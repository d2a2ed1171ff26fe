"""Partitions: cover the pool exactly once, are deterministic, and enforce the minimum client size."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.errors import UserInputError
from audit.partitions import partition

LABELS = np.repeat(np.arange(10), 60)


def _assert_exact_cover(clients, n):
    joined = np.concatenate(clients)
    assert len(joined) == n and len(np.unique(joined)) == n


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_exact_cover_and_determinism(scheme):
    first = partition(LABELS, scheme, 12, seed=4, alpha=0.5)
    _assert_exact_cover(first, len(LABELS))
    again = partition(LABELS, scheme, 12, seed=4, alpha=0.5)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    other = partition(LABELS, scheme, 12, seed=5, alpha=0.5)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(c) for c in partition(LABELS, "iid", 7, seed=0)]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_concentration_controls_skew():
    def mean_classes(alpha):
        clients = partition(LABELS, "dirichlet", 10, seed=1, alpha=alpha)
        return np.mean([len(np.unique(LABELS[c])) for c in clients])

    assert mean_classes(0.05) < 5 < mean_classes(100.0)


def test_shards_give_about_k_classes():
    clients = partition(LABELS, "shards", 20, seed=2, classes_per_client=2)
    assert max(len(np.unique(LABELS[c])) for c in clients) <= 4
    assert np.mean([len(np.unique(LABELS[c])) for c in clients]) <= 2.5


def test_minimum_client_size_error():
    with pytest.raises(UserInputError, match="min_client_size"):
        partition(LABELS, "dirichlet", 50, seed=0, alpha=0.01, min_client_size=11, max_attempts=3)
    with pytest.raises(UserInputError, match="partition.clients"):
        partition(LABELS, "iid", 700, seed=0)
