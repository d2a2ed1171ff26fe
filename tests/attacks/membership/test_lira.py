"""LiRA: leave-one-out scores equal a naive reimplementation; null case shows no leakage; a leaky case does."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from attacks.membership.lira import LiRA, LiRAParams
from attacks.membership_metrics import membership_metrics
from audit.core.metrics import auc


def _naive_scores(signals, keep, per_example):
    runs, records, views = signals.shape
    online = np.zeros((runs, records))
    offline = np.zeros((runs, records))
    for target in range(runs):
        refs = [r for r in range(runs) if r != target]
        means, variances = {}, {}
        for side in (True, False):
            groups = [[signals[r, p] for r in refs if keep[r, p] == side] for p in range(records)]
            mu = np.array([np.mean(g, axis=0) for g in groups])
            scatter = sum(((np.array(g) - m) ** 2).sum(0) for g, m in zip(groups, mu))
            pooled = scatter / sum(len(g) - 1 for g in groups)
            var = np.array([np.var(g, axis=0, ddof=1) for g in groups]) if per_example else np.broadcast_to(pooled, mu.shape)
            means[side], variances[side] = mu, var
        own = signals[target]
        online[target] = (stats.norm.logpdf(own, means[True], np.sqrt(variances[True]))
                          - stats.norm.logpdf(own, means[False], np.sqrt(variances[False]))).mean(1)
        offline[target] = ((own - means[False]) / np.sqrt(variances[False])).mean(1)
    return online, offline


@pytest.mark.parametrize("variance", ["global", "per-example"])
def test_leave_one_out_matches_naive(variance):
    rng = np.random.default_rng(0)
    runs, records = 6, 25
    # every record in exactly 3 runs, so each target keeps ≥ 2 references on each side
    keep = np.array([rng.permutation([True] * 3 + [False] * 3) for _ in range(records)]).T
    signals = rng.normal(size=(runs, records, 2)) + 0.7 * keep[:, :, None]
    scores = LiRA(LiRAParams(variance=variance)).scores(signals, keep)
    online, offline = _naive_scores(signals, keep, variance == "per-example")
    np.testing.assert_allclose(scores["online"], online, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(scores["offline"], offline, rtol=1e-9, atol=1e-9)


def _experiment(effect: float, seed: int = 1, runs: int = 16, records: int = 3000):
    rng = np.random.default_rng(seed)
    keep = rng.random((runs, records)) < 0.5
    difficulty = rng.normal(0, 3, records)  # records differ a lot in how confident models are on them
    signals = difficulty[None, :, None] + effect * keep[:, :, None] + rng.normal(size=(runs, records, 1))
    return signals, keep


def _split_coins(signals, keep, variant):
    """Targets 8..15 scored against references 0..7 only: their coins feed the one-run count."""
    references = np.arange(keep.shape[0]) < keep.shape[0] // 2
    split = LiRA().scores(signals, keep, references)[variant]
    return split[~references].ravel(), keep[~references].ravel()


def test_null_case_shows_no_leakage():
    signals, keep = _experiment(effect=0.0)
    for variant, scores in LiRA().scores(signals, keep).items():
        metrics, _, _ = membership_metrics(scores, keep, seed=0, coins=_split_coins(signals, keep, variant))
        assert 0.48 < metrics["auc"].value < 0.52, variant
        assert metrics["auc"].low <= 0.5 <= metrics["auc"].high, variant
        assert metrics["tpr_at_fpr_1%"].value <= 0.02, variant
        assert metrics["epsilon_one_run"].value < 0.15, variant


def test_split_scores_of_a_target_do_not_read_the_other_targets_membership():
    """The one-run count is valid only if a target's guesses use no other counted coin: flipping
    every other target run's membership must leave the target's split scores unchanged."""
    signals, keep = _experiment(effect=1.0, records=200)
    references = np.arange(16) < 8
    flipped = keep.copy()
    flipped[9:] = ~flipped[9:]  # every target but run 8
    for variant in ("online", "offline"):
        before = LiRA().scores(signals, keep, references)[variant][8]
        after = LiRA().scores(signals, flipped, references)[variant][8]
        np.testing.assert_array_equal(before, after)
    # while the leave-one-out scores do read them (which is why they are not counted)
    assert not np.array_equal(LiRA().scores(signals, keep)["online"][8], LiRA().scores(signals, flipped)["online"][8])


def test_leaky_case_shows_leakage_and_per_record_calibration_matters():
    signals, keep = _experiment(effect=1.5)
    scores = LiRA().scores(signals, keep)
    online, _, _ = membership_metrics(scores["online"], keep, seed=0, coins=_split_coins(signals, keep, "online"))
    offline, _, _ = membership_metrics(scores["offline"], keep, seed=0)
    raw = auc(signals[:, :, 0].ravel(), keep.ravel()).value  # a global threshold on φ itself
    assert online["auc"].value > 0.8 and offline["auc"].value > 0.8
    assert raw < 0.65, "the records' spread hides membership from a global threshold"
    assert online["tpr_at_fpr_1%"].value > 0.1
    assert online["epsilon_one_run"].value > 0.5
