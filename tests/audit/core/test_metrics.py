"""Attack metrics against reference values (the test suites of tf-privacy and jax_privacy) and their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from audit.core.metrics import (
    auc,
    auc_convex_hull,
    balanced_accuracy,
    best_threshold_for_epsilon,
    clopper_pearson,
    confusion_at,
    epsilon_lower_bound,
    held_out_epsilon_lower_bound,
    tpr_at_fpr,
)


def test_clopper_pearson_epsilon_reference():
    # tf-privacy epsilon_lower_bound_test: TP 500/500, FP 0/500 at α = 0.01 → 4.54 (recomputed 4.5419).
    assert epsilon_lower_bound(500, 0, 0, 500, confidence=0.99) == pytest.approx(4.5419, abs=0.005)


@pytest.mark.parametrize(("k", "n", "confidence", "low", "high"), [
    # 40-digit inversions of the regularised incomplete beta function (mpmath); the first is R's binom.test(3, 10)
    (3, 10, 0.95, 0.066739511177734467, 0.65245285005999730),
    (1, 1000, 0.99, 5.0125292607775061e-6, 0.0074062869383529376),
    (517, 1000, 0.9, 0.49049557093605266, 0.54343009441545709),
    (49, 50, 0.95, 0.89353045428850008, 0.99949377201695917),
])
def test_clopper_pearson_is_the_exact_interval(k, n, confidence, low, high):
    assert clopper_pearson(k, n, confidence) == pytest.approx((low, high), rel=1e-13)


@pytest.mark.parametrize("n", [1, 7, 100, 4096])
def test_clopper_pearson_at_the_ends_has_its_closed_form(n):
    """k = 0: (0, 1 − (α/2)^(1/n)); k = n: ((α/2)^(1/n), 1) (Clopper & Pearson 1934)."""
    for confidence in (0.5, 0.95, 0.999):
        tail = ((1 - confidence) / 2) ** (1 / n)
        assert clopper_pearson(0, n, confidence) == pytest.approx((0.0, 1 - tail), rel=1e-12)
        assert clopper_pearson(n, n, confidence) == pytest.approx((tail, 1.0), rel=1e-12)


def test_clopper_pearson_agrees_with_scipys_binomial_test():
    """scipy's ``binomtest(k, n).proportion_ci(method="exact")`` is the same interval found by root
    finding on the binomial tail, so it agrees only to the root finder's tolerance (≈ 1e-5 relative
    at n = 10⁵, ≈ 1e-9 for n ≤ 1000), where the beta quantile is exact to ≈ 1e-15 (the test above):
    the library does not replace it without changing results.json's last digits."""
    for n in [1, 2, 3, 10, 37, 100, 1000, 100_000]:
        for k in sorted({0, 1, 2, n // 3, n // 2, n - 1, n} & set(range(n + 1))):
            for confidence in (0.5, 0.9, 0.95, 0.99, 0.999):
                library = stats.binomtest(k, n).proportion_ci(confidence, method="exact")
                assert clopper_pearson(k, n, confidence) == pytest.approx((library.low, library.high), rel=1e-4, abs=1e-12)
    assert clopper_pearson(0, 0) == (0.0, 1.0)  # no trials: no information (binomtest refuses n = 0)


def test_the_epsilon_bound_uses_one_sided_clopper_pearson_limits():
    """Each limit one-sided at level (1 − confidence)/2, as scipy's one-sided exact intervals give them."""
    tp, fn, fp, tn, confidence, delta = 930, 70, 40, 960, 0.95, 1e-5
    level = 1 - (1 - confidence) / 2
    tpr_lo = stats.binomtest(tp, tp + fn, alternative="greater").proportion_ci(level).low
    fpr_hi = stats.binomtest(fp, fp + tn, alternative="less").proportion_ci(level).high
    tnr_lo = stats.binomtest(tn, fp + tn, alternative="greater").proportion_ci(level).low
    fnr_hi = stats.binomtest(fn, tp + fn, alternative="less").proportion_ci(level).high
    expected = max(math.log((tpr_lo - delta) / fpr_hi), math.log((tnr_lo - delta) / fnr_hi), 0.0)
    assert epsilon_lower_bound(tp, fn, fp, tn, confidence, delta) == pytest.approx(expected, rel=1e-6)


def test_epsilon_lower_bound_properties():
    assert epsilon_lower_bound(250, 250, 250, 250) == 0.0  # chance
    tighter = epsilon_lower_bound(900, 100, 50, 950, confidence=0.9)
    looser = epsilon_lower_bound(900, 100, 50, 950, confidence=0.99)
    assert tighter > looser > 0
    assert epsilon_lower_bound(900, 100, 50, 950, delta=0.1) < epsilon_lower_bound(900, 100, 50, 950)
    # the TNR/FNR direction counts too: a test that is sure about non-members
    assert epsilon_lower_bound(100, 900, 0, 1000) > 0
    assert epsilon_lower_bound(100, 900, 0, 1000) == pytest.approx(epsilon_lower_bound(1000, 0, 900, 100))


def test_auc_reference_values():
    # jax_privacy: in=[0,4,6,7], out=[1,2,3,5]: AUROC on the ROC convex hull 13/16; the plain AUC is 11/16.
    scores, labels = [0, 4, 6, 7, 1, 2, 3, 5], [1, 1, 1, 1, 0, 0, 0, 0]
    assert auc_convex_hull(scores, labels) == pytest.approx(13 / 16)
    assert auc(scores, labels).value == pytest.approx(11 / 16)
    # tf-privacy MIA test: losses of members vs non-members → AUC 0.83 (score = −loss)
    members = np.array([0.1, 0.2, 1.3, 0.4, 0.5, 0.6])
    non_members = np.array([1.1, 1.2, 1.3, 0.4, 1.5, 1.6])
    assert auc(-np.r_[members, non_members], np.r_[np.ones(6), np.zeros(6)]).value == pytest.approx(0.8333, abs=1e-4)


def test_auc_interval_covers_truth_at_nominal_rate():
    """DeLong 95 % intervals for N(1,1) vs N(0,1) (true AUC Φ(1/√2) = 0.7602) cover the truth in
    about 95 % of 200 seeded repetitions; the binomial 99.9 % range for 200 trials is [0.895, 0.99]."""
    truth = 0.7602499389
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        scores = np.r_[rng.normal(1, 1, 300), rng.normal(0, 1, 300)]
        estimate = auc(scores, np.r_[np.ones(300), np.zeros(300)])
        covered += estimate.low <= truth <= estimate.high
    assert 0.895 <= covered / 200 <= 0.99


def test_tpr_at_fpr_reads_without_interpolation():
    # 10 negatives: FPR steps of 0.1. Members' scores 5..9, non-members −9..−1 plus one at 9.5.
    scores = np.r_[np.arange(5, 10), np.arange(-9, 0), [9.5]]
    labels = np.r_[np.ones(5), np.zeros(10)]
    assert tpr_at_fpr(scores, labels, 0.0).value == 0.0  # the top score is a non-member
    assert tpr_at_fpr(scores, labels, 0.1).value == 1.0
    assert tpr_at_fpr(scores, labels, 0.05).value == 0.0  # 0.1 > 0.05: no interpolation
    low, high = clopper_pearson(5, 5)
    estimate = tpr_at_fpr(scores, labels, 0.1)
    assert (estimate.low, estimate.high) == pytest.approx((low, high))


def test_balanced_accuracy_is_half_plus_half_advantage():
    scores = np.r_[np.arange(10), np.arange(5, 15)]
    labels = np.r_[np.zeros(10), np.ones(10)]
    assert balanced_accuracy(scores, labels) == pytest.approx(0.75)


def test_threshold_search_and_held_out_bound():
    rng = np.random.default_rng(3)
    scores = np.r_[rng.normal(3, 1, 2000), rng.normal(0, 1, 2000)]
    labels = np.r_[np.ones(2000), np.zeros(2000)]
    threshold = best_threshold_for_epsilon(scores, labels)
    direct = epsilon_lower_bound(*confusion_at(scores, labels, threshold))
    for other in np.quantile(scores, [0.1, 0.3, 0.5, 0.7, 0.9]):  # the search beats arbitrary thresholds
        assert direct >= epsilon_lower_bound(*confusion_at(scores, labels, other)) - 1e-12
    held_out = held_out_epsilon_lower_bound(scores[::2], labels[::2], scores[1::2], labels[1::2])
    assert 0 < held_out.value < direct + 1.0


def test_null_scores_give_no_epsilon():
    """Null case (jax_privacy PR #270): indistinguishable scores must not produce an ε."""
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=20000), rng.random(20000) < 0.5
    bound = held_out_epsilon_lower_bound(scores[:10000], labels[:10000], scores[10000:], labels[10000:])
    assert bound.value == 0.0 or bound.value < 0.1
    assert abs(auc(scores, labels).value - 0.5) < 0.02
    assert tpr_at_fpr(scores, labels, 0.01).value < 0.02


def test_bad_inputs():
    with pytest.raises(ValueError, match="both"):
        auc([1, 2], [1, 1])
    with pytest.raises(ValueError, match="finite"):
        auc([1, math.nan], [1, 0])


def test_the_weighted_roc_of_the_two_way_intervals_agrees_with_the_plain_definitions():
    """The bootstrap's point values come from one sorted, weighted ROC; with unit weights they
    must equal scikit-learn's AUC and the conservative TPR-at-FPR definition above, ties included."""
    from sklearn.metrics import roc_auc_score

    from audit.core.cluster_bootstrap import WeightedRoc

    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=(8, 300)), 1)  # rounded: many ties
    labels = rng.random((8, 300)) < 0.5
    scores += 0.4 * labels
    point = WeightedRoc(scores, labels).statistics(np.ones_like(scores), (0.001, 0.01, 0.1))
    assert point["auc"] == pytest.approx(roc_auc_score(labels.ravel(), scores.ravel()), abs=1e-12)
    for fpr in (0.001, 0.01, 0.1):
        assert point[f"tpr@{fpr}"] == pytest.approx(tpr_at_fpr(scores.ravel(), labels.ravel(), fpr).value, abs=1e-12)
    # a weight of 2 on a run is that run duplicated
    weights = np.ones_like(scores)
    weights[3] = 2.0
    doubled = np.vstack([scores, scores[3:4]]), np.vstack([labels, labels[3:4]])
    assert WeightedRoc(scores, labels).statistics(weights, (0.01,))["auc"] == pytest.approx(
        roc_auc_score(doubled[1].ravel(), doubled[0].ravel()), abs=1e-12)


def _brute_force_comparisons(scores, labels, units, strata):
    """AUC and each member's FPR by enumerating the pairs the ROC may compare: a member and a
    non-member of the same stratum and different units (ties half in the AUC)."""
    s, y, u, g = (np.asarray(a).ravel() for a in (scores, labels, units, strata))
    concordant, pairs, member_fpr = 0.0, 0, []
    for i in np.flatnonzero(y):
        others = np.flatnonzero(~y & (g == g[i]) & (u != u[i]))
        concordant += np.sum(s[others] < s[i]) + 0.5 * np.sum(s[others] == s[i])
        pairs += len(others)
        member_fpr.append(np.mean(s[others] >= s[i]))
    return concordant / pairs, np.array(member_fpr)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_comparison_roc_compares_members_with_non_members_of_other_units_in_their_group(grouped):
    from audit.core.cluster_bootstrap import comparison_roc

    rng = np.random.default_rng(5)
    scores = np.round(rng.normal(size=(8, 12)), 1)  # ties within and across units
    labels = rng.random((8, 12)) < 0.5
    scores += 0.5 * labels
    groups = np.arange(8) % 3 if grouped else np.zeros(8, dtype=int)
    units = np.broadcast_to(np.arange(12), scores.shape)
    strata = np.broadcast_to(groups[:, None], scores.shape)
    expected_auc, member_fpr = _brute_force_comparisons(scores, labels, units, strata)
    point = comparison_roc(scores, labels, groups if grouped else None).statistics(np.ones_like(scores), (0.05, 0.2))
    assert point["auc"] == pytest.approx(expected_auc, abs=1e-12)
    for fpr in (0.05, 0.2):
        assert point[f"tpr@{fpr}"] == pytest.approx(np.mean(member_fpr <= fpr + 1e-12), abs=1e-12)


def test_pooled_leave_one_out_auc_is_biased_under_a_null_and_the_comparison_roc_is_not():
    """An attack that only counts how often the references held the unit, (k_u − c_tu)/(R − 1),
    carries no information about the target (the coins are independent). Pooled over targets its
    AUC is far below ½ — a member's references hold one member fewer than a non-member's of the
    same unit — while the comparison ROC, which never pairs two runs of one unit, averages ½
    within its standard error (Airola et al. 2011 on pooled leave-one-out AUC)."""
    from sklearn.metrics import roc_auc_score

    from audit.core.cluster_bootstrap import comparison_roc

    rng = np.random.default_rng(6)
    pooled, compared = [], []
    for _ in range(400):
        keep = rng.random((8, 5)) < 0.5
        if keep.all() or not keep.any():
            continue
        scores = (keep.sum(0, keepdims=True) - keep) / 7 + 1e-6 * rng.standard_normal(keep.shape)
        pooled.append(roc_auc_score(keep.ravel(), scores.ravel()))
        compared.append(comparison_roc(scores, keep).statistics(np.ones_like(scores), (0.01,))["auc"])
    standard_error = np.std(compared, ddof=1) / np.sqrt(len(compared))
    assert np.mean(pooled) < 0.45  # the bias this ROC exists to remove (≈ 0.41)
    assert abs(np.mean(compared) - 0.5) < 4 * standard_error, (np.mean(compared), standard_error)


def test_the_two_way_variance_and_its_degrees_of_freedom():
    """V = V_cells + (V_runs − V_cells)⁺ + (V_units − V_cells)⁺, and Satterthwaite's ν counts the
    clusters each one-way variance that enters V was estimated from: pure cell noise has RU − 1
    degrees of freedom, a unit component alone U − 1, and both components ν = V²/(V_r²/(R−1) +
    V_u²/(U−1) + V_c²/(RU−1)) (the cell variance enters with coefficient 1 − 1 − 1 = −1)."""
    from audit.core.cluster_bootstrap import combined_variance

    assert combined_variance(1.0, 1.0, 1.0, 16, 10) == pytest.approx((1.0, 159.0))
    assert combined_variance(0.9, 1.0, 1.0, 16, 10) == pytest.approx((1.0, 159.0))  # no component beyond noise
    assert combined_variance(1.0, 3.0, 1.0, 16, 10) == pytest.approx((3.0, 9.0))  # units only: U − 1
    v, dof = combined_variance(2.0, 3.0, 1.0, 16, 10)
    assert v == pytest.approx(4.0) and dof == pytest.approx(16.0 / (4.0 / 15 + 9.0 / 9 + 1.0 / 159))


def test_tpr_at_an_fpr_finer_than_the_non_member_scores_allow_is_not_estimable():
    """With n non-member scores per member the finest FPR above 0 is 1/n: TPR at FPR 1 % needs
    n ≥ 100. Here 4 runs × 30 units give each member about 56 non-members of other units, so
    TPR at 10 % is reported and TPR at 1 % (which would be the TPR at FPR 0) is not."""
    from audit.core.cluster_bootstrap import comparison_roc, two_way_intervals

    rng = np.random.default_rng(8)
    labels = rng.random((4, 30)) < 0.5
    scores = rng.normal(size=(4, 30)) + labels
    compared = comparison_roc(scores, labels).compared_negatives()
    assert 40 < np.median(compared) < 100
    out = two_way_intervals(scores, labels, rng, fprs=(0.01, 0.1), replicates=50)
    assert math.isnan(out["tpr@0.01"].value) and math.isnan(out["tpr@0.01"].low)
    assert 0 < out["tpr@0.1"].value <= 1 and out["tpr@0.1"].low <= out["tpr@0.1"].value <= out["tpr@0.1"].high
