"""The strength check of LiRA and RMIA: the small version of
``benchmarks/strength.py`` (``--quick``: MNIST's test split, a 600-record pool, 6 and 4 runs of
one overfitting client), run through its command-line entry point and read back from its JSON.

What must hold whatever the numbers: every figure is a rate in [0, 1] whose 95 % interval contains
it; TPR at 0.1 % FPR never exceeds TPR at 1 % FPR (the thresholds allowed at 0.1 % are a subset of
those allowed at 1 %, and each TPR is the best over its thresholds); and on this design, where the
target models fit their training records perfectly and miss ≈ 15 % of the test records, online
LiRA must find the members better than chance — its whole AUC interval above ½.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script, shared_data

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "strength.py"
#: the measured attacks' result names (``ATTACKS`` in the script: LiRA twice, RMIA, the loss threshold;
#: and the LiRA code's global threshold on φ, scored outside the registry)
NAMES = {"lira-online", "lira-offline", "lira-per-example-online", "lira-per-example-offline",
         "rmia-online", "rmia-offline", "loss-threshold", "global-threshold-phi"}


def _strength():
    return load_script(SCRIPT, "strength_benchmark")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    mnist = shared_data("mnist")
    out = tmp_path_factory.mktemp("strength") / "strength.json"
    assert _strength().main(["--quick", "--quiet", "--data-root", str(mnist), "--out", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def _inside(estimate: dict) -> None:
    value, low, high = estimate["value"], estimate["low"], estimate["high"]
    assert value is not None and 0.0 <= value <= 1.0, estimate
    if low is not None or high is not None:
        assert 0.0 <= low <= value <= high <= 1.0, estimate


def test_every_figure_is_a_rate_inside_its_interval(quick):
    assert quick["quick"] is True and [s["name"] for s in quick["settings"]] == ["many", "few"]
    for setting in quick["settings"]:
        assert setting["references_per_target"] == setting["runs"] - 1
        assert {a["attack"] for a in setting["attacks"]} == NAMES, setting["skipped"]
        for row in setting["attacks"]:
            for metric in ("auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%"):
                _inside(row[metric])
            assert row["tpr_at_fpr_0.1%"]["value"] <= row["tpr_at_fpr_1%"]["value"], row
        for accuracy in ("train_accuracy", "test_accuracy"):
            _inside(setting[accuracy])


def test_the_overfit_targets_leak_membership_to_online_lira(quick):
    many = quick["settings"][0]
    assert many["train_accuracy"]["value"] >= 0.99  # the design overfits, as the benchmark says
    assert many["train_accuracy"]["value"] - many["test_accuracy"]["value"] >= 0.05
    lira = next(a for a in many["attacks"] if a["attack"] == "lira-online")["auc"]
    assert lira["value"] > 0.5 and lira["low"] > 0.5, lira


def test_the_loss_threshold_ranks_as_the_global_threshold_on_phi(quick):
    """−loss = log p and φ = log p − log(1 − p) are both increasing in p, the probability of the
    true label: the same ranking, hence the same AUC (the loss is computed as log(1 + e^{−φ}), so
    no rounding ties the most confident records; 0.01 leaves room for bootstrap-free ROC rounding)."""
    for setting in quick["settings"]:
        auc = {a["attack"]: a["auc"]["value"] for a in setting["attacks"]}
        assert abs(auc["loss-threshold"] - auc["global-threshold-phi"]) <= 0.01, auc


def test_the_reference_figures_and_orderings_match_what_was_measured(quick):
    for reference in quick["references"]:
        assert reference["url"].startswith("https://")
        for figure in reference["figures"]:
            assert figure["ours"] in NAMES and 0.0 < figure["auc"] < 1.0 and 0.0 <= figure["tpr_at_fpr_0.1%"] <= 1.0
    values = {(s["name"], a["attack"], m): a[m]["value"] for s in quick["settings"] for a in s["attacks"]
              for m in ("auc", "tpr_at_fpr_0.1%")}
    assert quick["orderings"]
    for check in quick["orderings"]:
        left = values[(check["setting"], check["left"], check["metric"])]
        right = values[(check["setting"], check["right"], check["metric"])]
        assert (check["left_value"], check["right_value"]) == (left, right)
        expected = None if left is None or right is None else left >= check["factor"] * right
        assert check["holds"] == expected, check


@pytest.mark.parametrize("argv", [["--quick", "--runs", "3"], ["--quick", "--few-runs", "2"],
                                  ["--quick", "--data-root", "/nonexistent/mnist"]])
def test_bad_arguments_stop_before_any_training(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        _strength().main(argv)
    assert stopped.value.code == 2
    assert "error:" in capsys.readouterr().err
