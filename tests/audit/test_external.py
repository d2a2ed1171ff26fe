"""The results document of a system dpfl-audit did not train (audit.external): claims as their
owners state them, verdicts as an audit gives them."""

import math

import numpy as np
import pytest

from attacks.canaries.canary_audit import canary_result
from audit.core.errors import UserInputError
from audit.external import System, audit_external, stated_claim
from reports.results import load_results


@pytest.mark.parametrize("kwargs, field", [
    ({"unit": "weight"}, "claim unit"), ({"relation": "swap"}, "claim relation"),
    ({"adversary": "god"}, "claim adversary"), ({"delta": 1.5}, "claim delta"), ({"epsilon": -1.0}, "claim epsilon"),
    ({"epsilon": math.inf}, "claim epsilon")])
def test_a_bad_stated_claim_is_a_one_line_error_naming_the_field(kwargs, field):
    arguments = {"epsilon": 1.0, "delta": 1e-5, "unit": "record", **kwargs}
    with pytest.raises(UserInputError) as error:
        stated_claim(**arguments)
    assert str(error.value).startswith(field) and "\n" not in str(error.value)


def test_the_stated_claim_covers_only_the_named_adversary():
    claim = stated_claim(2.0, 1e-5, "client", "replace-one", "server")
    assert (claim.epsilon, claim.unit, claim.relation, claim.adversary) == (2.0, "client", "replace-one", "server")
    assert [a.adversary for a in claim.adversaries if a.covered] == ["server"]


def _canaries(shift: float, m: int = 1000, seed: int = 0):
    rng = np.random.default_rng(seed)
    inserted = rng.random(m) < 0.5
    return rng.normal(size=m) + shift * inserted, inserted


def test_canaries_that_separate_perfectly_contradict_a_small_claim_and_not_a_vacuous_one(tmp_path):
    # inserted canaries 8 standard deviations up: every guess is right, so Steinke et al.'s bound with
    # 1000 coins is far above ε = 0.5 — and, at ε = 200, TPR ≤ e^200·FPR + δ rules out nothing measurable
    # (the Gaussian fit of an 8σ shift, ≈ 66, stays below it too)
    statistics, inserted = _canaries(8.0)
    for epsilon, expected in ((0.5, "violation"), (200.0, "inconclusive")):
        claim = stated_claim(epsilon, 1e-5, "record")
        result = canary_result("canaries", "record", statistics[None], inserted[None], 1e-5, 0, "synthetic")
        audit_external(System("synthetic", "synthetic canary scores"), claim, [result], out=tmp_path / str(epsilon))
        results, _, _ = load_results(tmp_path / str(epsilon))  # the schema holds
        experiment = results.experiments[0]
        assert experiment.soundness == expected
        assert results.audit.system == "synthetic canary scores"
        assert experiment.attacks[0].metrics["epsilon_one_run"].value > 2.0
        assert all(v.power is not None for v in experiment.attacks[0].verdicts if v.kind == "lower_bound")
        claim_rows = [r for r in results.rows if r.attack == "claim" and r.metric == "epsilon_released"]
        assert [r.value for r in claim_rows] == [epsilon]
        assert "synthetic canary scores" in (tmp_path / str(epsilon) / "report.html").read_text()


def test_null_canaries_give_no_lower_bound_and_no_violation(tmp_path):
    statistics, inserted = _canaries(0.0)
    claim = stated_claim(0.1, 1e-5, "record")
    result = canary_result("canaries", "record", statistics[None], inserted[None], 1e-5, 0, "synthetic")
    results = audit_external(System("null", "null canary scores"), claim, [result])
    assert results.experiments[0].soundness != "violation"
    assert results.experiments[0].attacks[0].metrics["epsilon_one_run"].value == 0.0
