"""What a client-level claim implies for one record, and when it implies nothing (issue 17, item 4).

Group privacy (Dwork & Roth 2014, Thm 2.2): a record added to one client's data replaces that
client — two add/remove steps — so an (ε, δ) client-level claim gives (2ε, (1 + e^ε)·δ) per
record. Once (1 + e^ε)·δ ≥ 1, i.e. ε ≥ ln(1/δ − 1) (≈ 11.513 at δ = 1e-5), every test satisfies
TPR ≤ e^{2ε}·FPR + δ′: the implication is vacuous and no measurement can contradict it.
"""

from __future__ import annotations

import json
import math

import pytest

from audit.cli import main
from defenses.claims import PrivacyClaim
from reports.document import Estimate
from reports.soundness import claim_bound, verdict
from tests.helpers import tiny_config

DELTA = 1e-5
THRESHOLD = math.log(1 / DELTA - 1)  # (1 + e^ε)·δ = 1


def client_claim(epsilon: float) -> PrivacyClaim:
    return PrivacyClaim(epsilon, DELTA, "client", "rdp-improved", relation="add-remove")


def test_a_record_under_a_client_claim_is_held_to_twice_epsilon_below_the_threshold():
    v = verdict(client_claim(8.0), "record", "epsilon_one_run", Estimate(3.0, 3.0, None), "lower_bound")
    assert v.status == "consistent" and v.bound == 16.0
    assert v.bound_delta == pytest.approx(DELTA * (1 + math.exp(8.0)), rel=1e-12)  # 0.0298…
    assert verdict(client_claim(8.0), "record", "epsilon_one_run", Estimate(16.5, 16.5, None), "lower_bound").status == "violation"


@pytest.mark.parametrize("measured", [0.5, 3.0, 50.0, 1e6])
def test_beyond_the_threshold_the_record_implication_is_vacuous_whatever_was_measured(measured):
    v = verdict(client_claim(12.0), "record", "epsilon_one_run", Estimate(measured, measured, None), "lower_bound")
    assert v.status == "vacuous" and v.bound is None and v.bound_delta is None
    assert "δ′" in v.text and f"{DELTA * (1 + math.exp(12.0)):.3g}" in v.text  # 1.63
    assert claim_bound(client_claim(12.0), "record") is None


def test_the_switch_happens_where_group_delta_reaches_one():
    below, above = THRESHOLD - 1e-6, THRESHOLD + 1e-6
    assert claim_bound(client_claim(below), "record") is not None
    assert verdict(client_claim(above), "record", "epsilon_lower_bound", Estimate(1.0, 1.0, None), "lower_bound").status == "vacuous"
    # the client-level figure itself is not vacuous: a whole client is held to ε as claimed
    assert verdict(client_claim(above), "client", "epsilon_one_run", Estimate(1.0, 1.0, None), "lower_bound").status == "consistent"


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
