"""The "Add an attack" page (docs/how-to/add-an-attack.md): it shows the example's files as they are, its
command runs the example attack through the whole pipeline, and the example attack passes the two
checks the page asks of every attack — a null design (no leakage found) and a leaky one (found).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audit.cli import main
from tests.attacks.membership.test_membership_attacks import _experiment
from tests.helpers import load_script, readme_commands, with_out

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "add-an-attack.md"
EXAMPLE = ROOT / "examples" / "custom_attack.py"
CONFIG = ROOT / "examples" / "custom_attack.yaml"
RESULTS = ("logit-margin", "logit-margin-calibrated")

#: the page's audit made small: FedAvg alone, 4 runs of 3 rounds over 200 records
SMALL = ["--set", "defenses=[{name: fedavg}]", "--set", "membership.runs=4", "--set", "training.rounds=3",
         "--set", "dataset.max_pool=200"]


def test_the_page_shows_the_example_files_as_they_are():
    page = PAGE.read_text(encoding="utf-8")
    assert f"```python\n{EXAMPLE.read_text(encoding='utf-8')}```" in page
    assert f"```yaml\n{CONFIG.read_text(encoding='utf-8')}```" in page


def test_the_page_command_runs_the_attack(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    [command] = [c for c in readme_commands("dpfl-audit run", PAGE) if c[0] == "examples/custom_attack.yaml"]
    out = tmp_path / "out"
    assert main(["run", *with_out(command, out), *SMALL, "--quiet"]) == 0
    [experiment] = json.loads((out / "results.json").read_text())["experiments"]
    attacks = {a["attack"]: a for a in experiment["attacks"]}
    assert set(attacks) == {*RESULTS, "loss-threshold"}
    for name in RESULTS:
        result = attacks[name]
        assert result["unit"] == "record" and "score: logit margin" in result["notes"], name
        auc = result["metrics"]["auc"]
        assert 0.0 <= auc["ci_low"] <= auc["value"] <= auc["ci_high"] <= 1.0, (name, auc)
        assert result["epsilon_kind"]["epsilon_one_run"] == "lower_bound"
        assert result["metrics"]["epsilon_one_run"]["value"] >= 0.0, name
    # FedAvg's clients overfit: the margin of its memorised records tells members apart
    assert attacks["logit-margin"]["metrics"]["auc"]["ci_low"] > 0.5, attacks["logit-margin"]["metrics"]["auc"]
    # uncalibrated, the scores read no membership: every run's coins count toward the ε bound
    assert "over 4 target run(s)" in attacks["logit-margin"]["notes"]
    assert "over 1 target run(s)" in attacks["logit-margin-calibrated"]["notes"]


@pytest.fixture(scope="module")
def example():
    return load_script(EXAMPLE, "custom_attack")


def test_the_margin_is_the_true_logit_over_the_runner_up(example):
    logits = np.array([[[2.0, 5.0, 1.0], [0.5, 0.0, 3.0]]])  # [runs, records, classes]
    np.testing.assert_array_equal(example.logit_margin(logits, np.array([1, 0])), [[3.0, -2.5]])


@pytest.fixture(scope="module")
def designs():
    """The membership tests' MLPs on digits: runs trained outside the scored pool (null) or on it (leaky)."""
    return {"null": _experiment(leaky=False, unit="record"), "leaky": _experiment(leaky=True, unit="record")}


@pytest.mark.parametrize("calibrate", [False, True])
def test_the_example_attack_on_a_null_and_a_leaky_design(example, designs, calibrate):
    attack = example.LogitMargin(example.MarginParams(calibrate=calibrate))
    [null] = attack.run(designs["null"])
    m = null.metrics
    assert m["auc"].low <= 0.5 <= m["auc"].high, m["auc"]  # no membership signal: the interval covers chance
    assert m["epsilon_one_run"].value <= 0.2, m["epsilon_one_run"]  # > 0 with probability ≤ 5 %
    [leaky] = attack.run(designs["leaky"])
    m = leaky.metrics
    assert m["auc"].low > 0.5 and m["epsilon_one_run"].value > 0, (m["auc"], m["epsilon_one_run"])
