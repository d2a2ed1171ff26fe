"""The parametric test of the claimed μ as a verdict: one member of its experiment's Holm family,
held to the claim's ε through the canary its worst case is about, VIOLATION only where its
goodness-of-fit gate let it speak, and never the reason a claim is called consistent.

The scores are simulated from the law the server's each-upload statistic has under a Gaussian
mechanism: N(θ·μᵢ, 1) for an inserted canary of claimed shift μᵢ, N(0, 1) held out (Dong, Roth & Su
2022, Def. 2.6: the pair is then θ·μᵢ-GDP). The server's figure accounts one round of multiplier
1/μ_max (μ_claim = μ_max) and is exactly tight: ε = the ε at δ of μ_max-GDP (Cor. 2.13), so θ₀ = 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from attacks.canaries.server_parametric import claimed_shifts, server_parametric
from audit.core.empirical_epsilon import OneRunAudit
from audit.core.fdp_one_run import gdp_epsilon
from defenses.privacy.claims import AdversaryClaim, PrivacyClaim
from reports.document import Verdict
from reports.mechanism_verdicts import parametric_verdict
from reports.soundness import FAMILY_ALPHA, experiment_verdict, family_verdicts

DELTA = 1e-5
MU = np.array([1.5, 2.0, 2.5])  # claimed shifts of canaries that joined more or fewer rounds


def simulate(rng, theta: float, coins: int, noise: str = "gaussian"):
    """Scores, coins and per-canary claimed μ; the server's figure is tight for the largest μ."""
    inserted = rng.random(coins) < 0.5
    mu = MU[rng.integers(0, len(MU), coins)]
    unit = rng.standard_normal(coins) if noise == "gaussian" else rng.uniform(-np.sqrt(3), np.sqrt(3), coins)
    scores = np.where(inserted, theta * mu, 0.0) + unit
    return scores, inserted, mu, server_claim(gdp_epsilon(float(MU.max()), DELTA), rounds=1, multiplier=1 / MU.max())


def server_claim(epsilon: float, rounds: int, multiplier: float) -> PrivacyClaim:
    figure = AdversaryClaim("server", epsilon, DELTA, "zero-out", "every client's upload", "exact", rounds=rounds,
                            noise_multiplier=multiplier)
    return PrivacyClaim(epsilon, DELTA, "client", "exact", relation="zero-out", adversary="server", adversaries=(figure,))


def decided(rng, theta: float, coins: int, noise: str = "gaussian", others=()) -> list[Verdict]:
    scores, inserted, mu, claim = simulate(rng, theta, coins, noise)
    test, _ = server_parametric(scores, inserted, mu, np.ones(coins, dtype=bool), claim, mirrored=False)
    assert test is not None and test.null_ratio == pytest.approx(1.0, rel=1e-6)
    return family_verdicts([*others, (parametric_verdict(claim, test), test)])


def test_the_claimed_shift_of_a_canary_sums_its_rounds_in_squares():
    taken = np.array([[True, False], [True, True], [False, False]])
    shifts = np.array([3.0, 4.0, 12.0])
    assert claimed_shifts(taken, shifts).tolist() == [5.0, 4.0]  # √(9 + 16), √16; round 3 joined by neither


def test_an_exactly_tight_claim_is_violated_at_the_familys_level_and_no_more():
    """A family of one decides at α = 5 %: over 300 tight audits the violations stay within the
    binomial's 99.9 % range at 5 % (a test that read the claim's ε, not its worst canary's, or that
    used a looser null would fall below it; one that ignored the covariates' spread, above)."""
    rng = np.random.default_rng(0)
    runs = 300
    hits = sum(decided(rng, 1.0, 400)[0].status == "violation" for _ in range(runs))
    assert stats.binom.ppf(0.0005, runs, FAMILY_ALPHA * 0.98) <= hits <= stats.binom.ppf(0.9995, runs, FAMILY_ALPHA)


def test_half_the_noise_is_an_estimate_based_violation_of_the_experiment():
    rng = np.random.default_rng(1)
    (verdict,) = decided(rng, 2.0, 2000)
    assert verdict.status == "violation" and verdict.kind == "parametric"
    assert "estimate-based" in verdict.text and verdict.measured > verdict.bound
    assert experiment_verdict([verdict]) == "violation"


def test_an_honest_mechanism_never_makes_the_claim_consistent():
    """No departure found is stated with its power (θ = 2θ₀ at 2,000 coins: ≈ 100 %), yet the
    experiment's status does not rest on a model: alone, the parametric test leaves it unmeasured."""
    rng = np.random.default_rng(2)
    (verdict,) = decided(rng, 1.0, 2000)
    assert verdict.status == "inconclusive" and "power 100% to detect θ = 2θ₀" in verdict.text
    assert experiment_verdict([verdict]) == "no measurement"


def _bound(p_value: float) -> tuple[Verdict, OneRunAudit]:
    v = Verdict(metric="epsilon_one_run", unit="client", kind="lower_bound", measured=0.5, claimed=1.0, bound=1.0,
                bound_delta=DELTA, status="inconclusive", text="", p_value=p_value)
    return v, OneRunAudit(0.5, 100, 10, 8, 0.05, DELTA, ((10, 8),))


def test_a_gated_out_test_keeps_its_weight_and_never_rejects():
    """Uniform noise at half the claimed std (θ = 2, but not Gaussian) fails the gate:
    the test says nothing — whatever its p-value — yet keeps its fixed weight in the family, so the
    other members' levels do not depend on what the gate saw."""
    rng = np.random.default_rng(3)
    scores, inserted, mu, claim = simulate(rng, 2.0, 4000, noise="uniform")
    test, said = server_parametric(scores, inserted, mu, np.ones(scores.size, dtype=bool), claim, mirrored=False)
    assert test is not None and not test.applies and test.p_value < 1e-10 and "REJECTED" in said
    # two members of equal weight (the bound's design power is below the floor): each first gets α/2
    bound, gated = family_verdicts([_bound(0.03), (parametric_verdict(claim, test), test)])
    assert gated.status == "no measurement" and gated.p_value is None and "says nothing" in gated.text
    assert bound.family == 2 and bound.level == pytest.approx(FAMILY_ALPHA / 2) and bound.status != "violation"
    # had the gate dropped the test from the family, the bound would have had all of α
    assert family_verdicts([_bound(0.03)])[0].status == "violation"


def test_the_null_is_the_accounted_clients_not_the_luckiest_canarys():
    """θ₀ comes from the figure's own accounting — R rounds at multiplier σ_server, μ = √R/σ_server —
    not from the canaries that happen to have joined most: a server figure over 4 rounds of
    multiplier 2 (μ = 1) at its exact ε gives θ₀ = 1 whatever the canaries' shifts, and the same
    figure computed by a looser accountant (a larger ε) gives θ₀ > 1."""
    rng = np.random.default_rng(6)
    scores, inserted, mu, _ = simulate(rng, 1.0, 400)
    every = np.ones(400, dtype=bool)
    exact = server_claim(gdp_epsilon(1.0, DELTA), rounds=4, multiplier=2.0)
    assert server_parametric(scores, inserted, mu, every, exact, False)[0].null_ratio == pytest.approx(1.0, rel=1e-6)
    looser = server_claim(1.2 * gdp_epsilon(1.0, DELTA), rounds=4, multiplier=2.0)
    assert server_parametric(scores, inserted, mu, every, looser, False)[0].null_ratio > 1.05
    silent = server_claim(gdp_epsilon(1.0, DELTA), rounds=None, multiplier=None)
    assert "no Gaussian rounds" in server_parametric(scores, inserted, mu, every, silent, False)[1]


def test_where_it_cannot_be_read_it_says_why():
    rng = np.random.default_rng(5)
    scores, inserted, mu, claim = simulate(rng, 1.0, 400)
    every = np.ones(400, dtype=bool)
    assert "mirrored" in server_parametric(scores, inserted, mu, every, claim, mirrored=True)[1]
    assert "no finite" in server_parametric(scores, inserted, mu, every, PrivacyClaim.non_private(), False)[1]
    assert "fewer than 50" in server_parametric(scores[:60], inserted[:60], mu[:60], every[:60], claim, False)[1]
    # canaries that joined no round carry no reading: left out of both groups, not scored as zeros
    none = np.zeros(400)
    assert "no inserted canary" in server_parametric(scores, inserted, none, every, claim, False)[1]
