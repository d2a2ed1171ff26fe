"""What a client-level claim implies for one record, and when it implies nothing.

Group privacy (Dwork & Roth 2014, Thm 2.2): a record added to one client's data replaces that
client — two add/remove steps — so an (ε, δ) client-level claim gives (2ε, (1 + e^ε)·δ) per
record. Once (1 + e^ε)·δ ≥ 1, i.e. ε ≥ ln(1/δ − 1) (≈ 11.513 at δ = 1e-5), every test satisfies
TPR ≤ e^{2ε}·FPR + δ′: the implication is vacuous and no measurement can contradict it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from audit.cli import main
from audit.core import audit_power
from audit.core.audit_power import gdp_delta, gdp_mu, one_run_power, tight_scores
from audit.core.empirical_epsilon import OneRunAudit, one_run_audit
from defenses.privacy.claims import PrivacyClaim
from reports.document import Estimate, Verdict
from reports.soundness import claim_bound, family_verdicts, verdict
from tests.helpers import tiny_config

DELTA = 1e-5
THRESHOLD = math.log(1 / DELTA - 1)  # (1 + e^ε)·δ = 1


def client_claim(epsilon: float) -> PrivacyClaim:
    return PrivacyClaim(epsilon, DELTA, "client", "rdp-improved", relation="add-remove")


def test_a_record_under_a_client_claim_is_held_to_twice_epsilon_below_the_threshold():
    v = verdict(client_claim(8.0), "record", "epsilon_one_run", Estimate(3.0, 3.0, None), "lower_bound")
    assert v.status == "inconclusive" and v.bound == 16.0  # no counts: no power, so never "consistent"
    assert v.bound_delta == pytest.approx(DELTA * (1 + math.exp(8.0)), rel=1e-12)  # 0.0298…
    assert verdict(client_claim(8.0), "record", "epsilon_one_run", Estimate(16.5, 16.5, None),
                   "lower_bound").status == "violation"


@pytest.mark.parametrize("measured", [0.5, 3.0, 50.0, 1e6])
def test_beyond_the_threshold_the_record_implication_is_vacuous_whatever_was_measured(measured):
    v = verdict(client_claim(12.0), "record", "epsilon_one_run", Estimate(measured, measured, None), "lower_bound")
    assert v.status == "vacuous" and v.bound is None and v.bound_delta is None
    assert "δ′" in v.text and f"{DELTA * (1 + math.exp(12.0)):.3g}" in v.text  # 1.63
    assert claim_bound(client_claim(12.0), "record") is None


def test_the_switch_happens_where_group_delta_reaches_one():
    below, above = THRESHOLD - 1e-6, THRESHOLD + 1e-6
    assert claim_bound(client_claim(below), "record") is not None
    assert verdict(client_claim(above), "record", "epsilon_one_run", Estimate(1.0, 1.0, None), "lower_bound").status == "vacuous"
    # the client-level figure itself is not vacuous: a whole client is held to ε as claimed
    assert verdict(client_claim(above), "client", "epsilon_one_run", Estimate(1.0, 1.0, None),
                   "lower_bound").status == "inconclusive"


def test_record_canaries_at_epsilon_12_complete_and_say_the_record_implication_is_vacuous(tmp_path, capsys):
    config = tmp_path / "eps12.yaml"
    config.write_text(tiny_config(partition={"name": "iid", "clients": 4}, training={"rounds": 2, "local_steps": 1,
                                                                                    "batch_size": 10, "lr": 0.1},
                                  defenses=[{"name": "dp-fedavg", "epsilons": [12]}], attacks=[{"name": "record-canaries"}],
                                  diagnostics={"enabled": False}), encoding="utf-8")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    experiment = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))["experiments"][0]
    assert experiment["claim"]["unit"] == "client" and experiment["claim"]["epsilon"] > THRESHOLD
    verdicts = [v for a in experiment["attacks"] if a["attack"] == "record-canaries" for v in a["verdicts"]]
    assert verdicts and {v["status"] for v in verdicts} <= {"vacuous", "no measurement"}
    assert any(v["status"] == "vacuous" for v in verdicts)
    assert experiment["soundness"] == "vacuous"


# ---------------------------------------------------------------- relations

def test_what_a_claim_implies_depends_on_the_designs_neighbouring_relation():
    add_remove = client_claim(1.0)
    replace_claim = PrivacyClaim(1.0, DELTA, "client", "rdp-improved", relation="replace-one")
    zero_out = PrivacyClaim(1.0, DELTA, "client", "rdp-improved", relation="zero-out")
    group = (2.0, (1 + math.e) * DELTA)
    assert claim_bound(add_remove, "client", "add-remove")[:2] == (1.0, DELTA)
    assert claim_bound(add_remove, "client", "replace-one")[:2] == pytest.approx(group)  # replace = remove + add
    assert claim_bound(replace_claim, "client", "replace-one")[:2] == (1.0, DELTA)
    assert claim_bound(replace_claim, "client", "add-remove") is None  # an added client is not a replacement
    assert claim_bound(zero_out, "client", "add-remove") is None  # zero-out keeps who takes part
    # a record added to one client's data replaces that client's data: one step of a replace-one claim
    assert claim_bound(replace_claim, "record", "add-remove")[:2] == (1.0, DELTA)
    assert claim_bound(zero_out, "record", "add-remove")[:2] == pytest.approx(group)
    v = verdict(replace_claim, "client", "epsilon_one_run", Estimate(0.1, 0.1, None), "lower_bound", design="add-remove")
    assert v.status == "not covered" and "replace-one" in v.text and "add-remove design" in v.text
    assert (v.claim_relation, v.design_relation) == ("replace-one", "add-remove")


# ---------------------------------------------------------------- family and power

def _tested(p_value: float, correct: int = 8) -> tuple[Verdict, OneRunAudit]:
    v = Verdict(metric="epsilon_one_run", unit="client", kind="lower_bound", measured=0.5, claimed=1.0, bound=1.0,
                bound_delta=DELTA, status="inconclusive", text="", p_value=p_value)
    return v, OneRunAudit(0.5, 100, 10, correct, 0.05, DELTA, ((10, correct),))


@pytest.mark.parametrize("p_values, rejected", [
    # Holm at α = 0.05, k = 3: levels 0.05/3, 0.05/2, 0.05 in order of the p-values, stop at the first miss
    ([0.01, 0.02, 0.04], [True, True, True]),
    ([0.01, 0.03, 0.04], [True, False, False]),
    ([0.04, 0.01, 0.02], [True, True, True]),
    ([0.02, 0.02, 0.02], [False, False, False]),  # 0.02 > 0.05/3: each alone would pass at 5 %, the family does not
    ([0.001, 0.9, 0.024], [True, False, True]),
])
def test_holm_rejects_exactly_what_the_step_down_procedure_rejects(p_values, rejected):
    decided = family_verdicts([_tested(p, correct) for p, correct in zip(p_values, (6, 7, 8))])  # three distinct tests
    assert [v.status == "violation" for v in decided] == rejected
    assert all(v.family == 3 for v in decided)
    order = sorted(range(3), key=lambda i: p_values[i])
    for rank, i in enumerate(order):
        assert decided[i].level == pytest.approx(0.05 / (3 - rank))


def test_one_test_read_by_two_observers_counts_once():
    """Two figures with the same counts, analysis and limit (two observers whose statistics rank the
    canaries alike) are one test: with a third, distinct one the family has two members, and the
    pair is decided together."""
    decided = family_verdicts([_tested(0.02), _tested(0.02), _tested(0.6, 6)])
    assert [v.family for v in decided] == [2, 2, 2]
    assert decided[0].status == decided[1].status == "violation" and decided[0].level == pytest.approx(0.025)


def test_power_decides_between_consistent_and_inconclusive():
    rng = np.random.default_rng(0)
    inserted = rng.random(4000) < 0.5
    pure = PrivacyClaim(1.0, 0.0, "client", "pure", relation="add-remove")
    # scores that carry no membership: no violation; 4000 coins against ε = 1 (pure) detect ε = 2 surely
    audit = one_run_audit(rng.normal(size=4000), inserted, delta=0.0)
    v = verdict(pure, "client", "epsilon_one_run", audit.as_estimate(), "lower_bound", evidence=audit)
    assert v.status == "consistent" and v.power.detection >= 0.8 and v.family == 1
    # 40 coins cannot: the same verdict is inconclusive and says how many coins would do
    small = one_run_audit(rng.normal(size=40), inserted[:40], delta=0.0)
    v = verdict(pure, "client", "epsilon_one_run", small.as_estimate(), "lower_bound", evidence=small)
    assert v.status == "inconclusive" and v.power.detection < 0.8 and v.power.needed > 40
    assert f"about {v.power.needed} coins" in v.text


def test_a_design_the_power_model_does_not_describe_is_never_consistent():
    """The power model is the optimal attack on a μ-GDP (or randomised-response) mechanism at twice
    the claim; where an audit says it does not describe its design, the same counts that were
    consistent above are inconclusive, with no power stated — and a rejection is still a violation."""
    from dataclasses import replace

    rng = np.random.default_rng(0)
    inserted = rng.random(4000) < 0.5
    pure = PrivacyClaim(1.0, 0.0, "client", "pure", relation="add-remove")
    audit = replace(one_run_audit(rng.normal(size=4000), inserted, delta=0.0), unmodelled_power="subsampled steps")
    v = verdict(pure, "client", "epsilon_one_run", audit.as_estimate(), "lower_bound", evidence=audit)
    assert v.status == "inconclusive" and v.power is None and "no power is stated: subsampled steps" in v.text
    leaky = replace(one_run_audit(np.where(inserted, 1.0, -1.0), inserted, delta=0.0), unmodelled_power="subsampled steps")
    assert verdict(pure, "client", "epsilon_one_run", leaky.as_estimate(), "lower_bound", evidence=leaky).status == "violation"


def test_the_power_of_the_one_run_count_matches_randomised_response_at_the_claim():
    """Against ε-randomised response (exactly ε-DP) with every canary guessed, the count is
    Binomial(m, e^ε/(1+e^ε)); the median bound the audit can certify is below ε and approaches it."""
    power = one_run_power(20000, 1.0, 0.0, 0.05)
    assert 0.8 < power.tight_bound <= 1.0
    assert power.detection == 1.0  # ε = 2 randomised response is far beyond 1 with 20000 coins
    assert gdp_delta(gdp_mu(1.0, DELTA), 1.0) == pytest.approx(DELTA, rel=1e-9)


def test_power_is_the_rate_at_which_the_real_test_detects_a_mechanism_twice_as_leaky():
    """An independent Monte Carlo of the verdict's own test — one_run_audit's counts, its p-value
    at the claim, the level — against 2ε randomised response must detect at the rate the power
    computation reports (each estimate's binomial error, 3σ)."""
    m, epsilon, level, n = 100, 0.5, 0.05, 400
    power = one_run_power(m, epsilon, 0.0, level)
    assert 0.2 < power.detection < 0.8  # an intermediate case, where the comparison is sharp
    rng = np.random.default_rng(9)
    hits = 0
    for _ in range(n):
        inserted = rng.random(m) < 0.5
        audit = one_run_audit(tight_scores(rng, inserted, 2 * epsilon, 0.0), inserted)
        hits += audit.p_value(epsilon, 0.0) <= level
    p = power.detection
    assert abs(hits / n - p) <= 3 * math.sqrt(p * (1 - p) * (1 / n + 1 / power.simulations))


def test_power_near_the_boundary_has_a_small_standard_error_and_does_not_flip_with_the_seed():
    """The verdict compares the detection probability with 0.80, so where it is near 0.80 the
    Monte-Carlo error must be small: 2,000 simulations there (standard error √(0.8·0.2/2000) ≈
    0.009 ≤ 0.01). Two independent seeds agree within four combined standard errors, and far
    from the boundary fewer simulations are spent."""
    near = one_run_power(82, 1.0, 0.0, 0.05)
    assert abs(near.detection - 0.8) < 0.1
    assert near.simulations == 2000 and near.detection_se <= 0.01
    other = one_run_power(82, 1.0, 0.0, 0.05, seed=1)
    assert abs(near.detection - other.detection) <= 4 * math.hypot(near.detection_se, other.detection_se)
    one_run_power.cache_clear()
    audit_power._simulation.cache_clear()  # the simulated counts drawn afresh from the seed
    assert one_run_power(82, 1.0, 0.0, 0.05) == near  # deterministic in its seed, recomputed
    far = one_run_power(20000, 1.0, 0.0, 0.05)
    assert far.detection == 1.0 and far.simulations < 2000
