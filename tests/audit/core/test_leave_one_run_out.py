"""The membership accuracy at thresholds fitted on the other runs, checked against its definition:
for each target run, every candidate threshold (each distinct score, and "nobody is a member")
scored by the weighted count of the *other* runs' members at or above it plus their non-members
below it; the best one (ties to the highest threshold, and to "nobody" over any threshold) then
classifies the target run's cells."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.cluster_bootstrap import LeaveOneRunOutAccuracy, resample_weights


def _by_definition(scores: np.ndarray, truth: np.ndarray, weights: np.ndarray) -> np.ndarray:
    runs = scores.shape[0]
    out = np.zeros(scores.shape, dtype=bool)
    for r in range(runs):
        others = np.arange(runs) != r
        s, t, w = scores[others].ravel(), truth[others].ravel(), weights[others].ravel()
        best_count, best_threshold = float(np.sum(w * ~t)), np.inf  # nobody called a member
        for threshold in np.unique(scores)[::-1]:  # highest first: a tie keeps the higher one
            count = float(np.sum(w * (t & (s >= threshold))) + np.sum(w * (~t & (s < threshold))))
            if count > best_count:
                best_count, best_threshold = count, threshold
        out[r] = (scores[r] >= best_threshold) == truth[r]
    return out


@pytest.mark.parametrize("ties", [False, True])
def test_the_refitted_thresholds_classify_as_their_definition_says(ties):
    rng = np.random.default_rng(5 + ties)
    for _ in range(60):
        runs, units = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        truth = rng.random((runs, units)) < rng.random()
        scores = rng.normal(size=(runs, units)) + truth * rng.random() + rng.normal(size=(runs, 1))
        if ties:
            scores = np.round(scores)
        accuracy = LeaveOneRunOutAccuracy(scores, truth)
        for over in ("runs", "units", "cells", None):
            weights = np.ones((runs, units)) if over is None else resample_weights(rng, runs, units, over)
            assert np.array_equal(accuracy.correct(weights), _by_definition(scores, truth, weights))
