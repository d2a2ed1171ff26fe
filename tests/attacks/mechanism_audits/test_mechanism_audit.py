"""The mechanism audit finds UDP-FL's unsound claims and never accuses a sound one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attacks.mechanism_audits.mechanism_audit import audit_mechanism


@pytest.mark.parametrize("kind", ["laplace", "staircase"])
def test_paper_1d_claims_are_violated_by_the_spread_canary(kind):
    result = audit_mechanism(kind, 1.0, 1.0, 1000, 60_000, "paper_1d", seed=0)
    assert result["violation"] and result["epsilon_lower_bound"] > result["epsilon_claimed"]
    assert result["canaries"]["spread"] > result["epsilon_claimed"] >= result["canaries"]["concentrated"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sound_gaussian_is_never_violated(seed):
    result = audit_mechanism("gaussian", 1.0, 1.0, 1000, 20_000, "sound", seed=seed)
    assert not result["violation"] and result["epsilon_lower_bound"] <= result["epsilon_claimed"]


def test_the_audit_is_tight_on_a_one_dimensional_laplace():
    """One coordinate of Laplace noise with λ = 1 is exactly 1-DP: the bound approaches 1 and stays below it."""
    result = audit_mechanism("laplace", 1.0, 1.0, 1000, 200_000, "paper_1d", canary="concentrated", seed=5)
    assert 0.8 < result["epsilon_lower_bound"] <= 1.0


def test_sound_laplace_claim_holds_against_the_spread_canary():
    result = audit_mechanism("laplace", 1.0, 1.0, 1000, 40_000, "sound", seed=0)
    assert not result["violation"]


def test_cli_json_keys_and_bad_input(tmp_path):
    command = [sys.executable, "-m", "audit", "audit-mechanism", "--mechanism", "laplace", "--noise", "1", "--dim", "100",
               "--trials", "2000", "--accounting", "paper_1d", "--json"]
    output = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert {"epsilon_claimed", "epsilon_lower_bound", "verdict"} <= set(output)
    bad = subprocess.run(command[:-1] + ["--accounting", "exact"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--accounting: 'exact' is not allowed" in bad.stderr
    # no finite sound claim exists for the staircase under ℓ2 clipping
    assert audit_mechanism("staircase", 1.0, 1.0, 50, 2000, "sound")["epsilon_claimed"] is None


def test_the_larger_of_two_bounds_holds_at_the_stated_confidence():
    """With both canaries the larger bound is reported, so each is computed at 1 − (1 − 0.95)/2 = 97.5 %:
    under a sound claim the reported bound then exceeds the true ε with probability ≤ 5 %."""
    both = audit_mechanism("gaussian", 2.0, 1.0, 10, 4000, "sound", seed=0)
    one = audit_mechanism("gaussian", 2.0, 1.0, 10, 4000, "sound", canary="spread", seed=0)
    assert both["confidence_per_canary"] == pytest.approx(0.975) and one["confidence_per_canary"] == pytest.approx(0.95)
    assert both["canaries"]["spread"] <= one["canaries"]["spread"]  # a higher confidence gives a lower bound
