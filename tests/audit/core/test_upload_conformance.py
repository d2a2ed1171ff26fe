"""The upload conformance tests, validated by simulation before a verdict uses them: under
uploads that are exactly what the claim allows — any contribution in [−S, S], each round's noise
std at or above the claimed one — the p-value rejects at most α of the time; a noise short of the
claim in later rounds, or one unclipped inserted upload, is rejected with certainty.

The expected laws come from the mechanism (Gaussian noise on a clipped contribution), simulated
here with numpy on its own, not from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from audit.core.upload_conformance import upload_conformance

ROUNDS, CANARIES, S, STD = 6, 400, 1.0, 0.05


def _uploads(rng, stds, contributions=None):
    """[T, K] uploads: contribution (inserted canaries) plus N(0, std_t²); held-out contribute 0."""
    inserted = rng.random(CANARIES) < 0.5
    c = np.zeros((len(stds), CANARIES)) if contributions is None else contributions(rng, inserted)
    noise = rng.standard_normal((len(stds), CANARIES)) * np.asarray(stds)[:, None]
    return c + noise, inserted


def _worst_honest(rng, inserted):
    """Contributions the claim allows that come closest to the clip: ±S on every inserted canary."""
    signs = rng.choice([-1.0, 1.0], size=CANARIES)
    return np.where(inserted, signs * S, 0.0)[None, :].repeat(ROUNDS, axis=0)


@pytest.mark.parametrize("scale", ["exact", "above"])
def test_honest_uploads_are_rejected_at_most_alpha_of_the_time(scale):
    rng = np.random.default_rng(20261127)
    replicates, alpha, rejected = 2000, 0.05, 0
    for _ in range(replicates):
        runs, masks = [], []
        for _run in range(2):  # two canary runs, each round of each with its own std
            stds = np.full(ROUNDS, STD) if scale == "exact" else STD * rng.uniform(1.0, 1.3, ROUNDS)
            u, inserted = _uploads(rng, stds, _worst_honest)
            # some canaries skip some rounds (Poisson participation): NaN, not an upload
            u[rng.random(u.shape) < 0.1] = np.nan
            runs.append(u)
            masks.append(inserted)
        result = upload_conformance(runs, masks, S, STD)
        assert result is not None and result.rounds == 2 * ROUNDS
        rejected += result.p_value <= alpha
    rate = rejected / replicates
    # the binomial 99.9 % upper band around α: a sound test stays below it
    assert rate <= alpha + 3.1 * np.sqrt(alpha * (1 - alpha) / replicates), rate


def test_the_p_value_is_nearly_uniform_in_its_lower_range_under_exact_noise():
    """At exactly the claimed std the pooled χ² is exact: the noise p-value (Bonferroni over the
    rounds and the pool) rejects at about α — not far below it (the test is not toothless)."""
    rng = np.random.default_rng(7)
    ps = []
    for _ in range(2000):
        u, inserted = _uploads(rng, np.full(ROUNDS, STD))
        ps.append(upload_conformance([u], [inserted], S, STD).p_noise)
    rate = np.mean(np.array(ps) <= 0.05)
    assert 0.02 <= rate <= 0.05 + 3.1 * np.sqrt(0.05 * 0.95 / 2000), rate


def test_a_noise_at_eight_tenths_from_round_two_is_rejected():
    rng = np.random.default_rng(1)
    for _ in range(50):
        stds = np.array([STD] + [0.8 * STD] * (ROUNDS - 1))
        u, inserted = _uploads(rng, stds, _worst_honest)
        result = upload_conformance([u], [inserted], S, STD)
        assert result.p_value < 1e-4 and result.p_noise < result.p_clip
        assert result.least_ratio == pytest.approx(0.8, abs=0.12) and result.least_round >= 2
        assert result.noise_ratio == pytest.approx(np.sqrt((1 + 0.64 * (ROUNDS - 1)) / ROUNDS), abs=0.08)


def test_one_unclipped_upload_is_rejected_and_named():
    rng = np.random.default_rng(2)
    for _ in range(50):
        u, inserted = _uploads(rng, np.full(ROUNDS, STD), _worst_honest)
        k = int(np.flatnonzero(inserted)[0])
        u[3, k] = 10.0 * S + rng.standard_normal() * STD  # the raw ±U = 10·S, not ±S
        result = upload_conformance([u], [inserted], S, STD)
        assert result.p_value < 1e-5 and result.p_clip < result.p_noise
        assert result.excess_round == 4 and result.excess_clips == pytest.approx(10.0, rel=0.05)


def test_a_clip_at_three_times_the_bound_is_rejected():
    rng = np.random.default_rng(3)
    u, inserted = _uploads(rng, np.full(ROUNDS, STD), lambda r, keep: 3 * _worst_honest(r, keep))
    assert upload_conformance([u], [inserted], S, STD).p_clip < 1e-5


def test_a_bias_or_more_noise_never_fires():
    """Noise above the claim and a constant offset on every upload raise V_t: no rejection."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        u, inserted = _uploads(rng, np.full(ROUNDS, 2 * STD))
        assert upload_conformance([u + 0.1 * STD], [inserted], S, STD).p_noise > 0.05


def test_power_is_that_of_the_pooled_test_against_half_the_noise():
    """power(α) is P(χ²_n/4 below the α/(4(T'+1)) quantile of χ²_n) — four tests of one hypothesis
    (noise, clip, fresh noise, tails), the noise's own T' + 1: checked by simulating it."""
    from scipy import stats

    rng = np.random.default_rng(5)
    u, inserted = _uploads(rng, np.full(2, STD))
    u = u[:, :12]  # a tiny design, where the power is not 1
    inserted = inserted[:12]
    result = upload_conformance([u], [inserted], S, STD)
    n, tail = result.held_out, 0.05 / (4 * (result.rounds + 1))
    simulated = np.mean(rng.chisquare(n, 200_000) / 4 <= stats.chi2.ppf(tail, n))
    assert result.power(0.05) == pytest.approx(simulated, abs=0.01)
    assert 0.0 < result.power(0.05) < 1.0


def test_without_held_out_uploads_there_is_nothing_to_measure():
    u = np.ones((3, 4))
    assert upload_conformance([u], [np.ones(4, dtype=bool)], S, STD) is None
    with pytest.raises(ValueError, match="positive"):
        upload_conformance([u], [np.zeros(4, dtype=bool)], 0.0, STD)


def test_noise_reused_every_round_is_rejected_and_named():
    """One noise draw per canary, repeated every round (a stream keyed without the round)."""
    rng = np.random.default_rng(8)
    inserted = rng.random(CANARIES) < 0.5
    noise = rng.standard_normal(CANARIES) * STD
    uploads = np.where(inserted, S, 0.0)[None, :] + noise[None, :].repeat(ROUNDS, axis=0)
    test = upload_conformance([uploads], [inserted], S, STD)
    assert test.p_value < 1e-10 and test.fresh_correlation > 0.99
    assert "repeats from round to round" in test.failure()


def test_uniform_noise_of_the_claimed_variance_is_rejected_and_named():
    """Uniform noise with the claimed std (±√3·std): the level and clip tests see nothing wrong."""
    rng = np.random.default_rng(9)
    inserted = rng.random(CANARIES) < 0.5
    noise = rng.uniform(-1, 1, size=(ROUNDS, CANARIES)) * STD * np.sqrt(3)
    test = upload_conformance([np.where(inserted, S, 0.0)[None, :] + noise], [inserted], S, STD)
    assert test.p_tails < 1e-6 and test.p_value < 1e-5
    assert "lighter tails" in test.failure()


def _signed_run(rng, stds, kept, value):
    """[T, K] uploads of canaries with known signs: an inserted canary contributes s·``value`` in
    the share ``kept`` of them (a mask that keeps its coordinate), 0 otherwise; + N(0, std_t²)."""
    inserted = rng.random(CANARIES) < 0.5
    signs = rng.choice([-1.0, 1.0], size=CANARIES)
    passes = inserted & (rng.random(CANARIES) < kept)
    c = np.where(passes, signs * value, 0.0)[None, :].repeat(len(stds), axis=0)
    return c + rng.standard_normal((len(stds), CANARIES)) * np.asarray(stds)[:, None], inserted, signs


def test_with_the_signs_honest_uploads_at_the_clip_are_rejected_at_most_alpha_of_the_time():
    """The one-sided count test (signs known) under the worst honest case: every inserted canary
    at exactly ±S, the noise exactly as claimed."""
    rng = np.random.default_rng(20261202)
    replicates, alpha, rejected = 2000, 0.05, 0
    for _ in range(replicates):
        u, inserted, signs = _signed_run(rng, np.full(ROUNDS, STD), 1.0, S)
        result = upload_conformance([u], [inserted], S, STD, signs=[signs])
        rejected += result.p_clip <= alpha
    rate = rejected / replicates
    assert rate <= alpha + 3.1 * np.sqrt(alpha * (1 - alpha) / replicates), rate


def test_a_rescaling_after_the_clip_on_the_masked_share_is_counted():
    """A sparsifier made "unbiased" after the clip: the 40 % of inserted canaries its mask keeps
    contribute 2.5·S, with a noise std of 0.9·S — never one extreme upload, but far more than the
    Φ̄(1) ≈ 15.9 % of uploads beyond S + one noise std a clipped contribution allows (≈ 31 % at
    the true std, above 20 % at its upper confidence limit)."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        u, inserted, signs = _signed_run(rng, np.full(ROUNDS, 0.9 * S), 0.4, 2.5 * S)
        result = upload_conformance([u], [inserted], S, 0.9 * S, signs=[signs])
        assert result.p_clip < 1e-5 and result.p_value < 1e-4  # γ = 1e-6 is its floor
        assert result.exceeding / result.inserted > 0.2 and "inserted canaries' uploads" in result.failure()
    # the honest rand-k (kept at ±S) is not
    u, inserted, signs = _signed_run(rng, np.full(ROUNDS, 0.9 * S), 0.4, S)
    assert upload_conformance([u], [inserted], S, 0.9 * S, signs=[signs]).p_clip > 0.05
