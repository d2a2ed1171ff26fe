"""RMIA (Zarifzadeh, Liu, Shokri 2024): the score formula against a hand calculation, no leakage
when membership cannot matter (null), leakage when it does, one-run ε scores that read no counted
coin, and bad parameters refused with one line and exit code 2.

Experiments are built from chosen outputs: a linear layer over one-hot record ids whose weights
are the logits we want, so run r's model gives record x exactly the logits written down (the
synthetic signals of ``test_lira``, turned into a real ``MembershipExperiment``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import attacks.catalog  # noqa: F401  (registers every attack)
from attacks.base import ATTACKS
from attacks.membership.rmia import RMIA, RMIAParams
from attacks.membership_experiment import MembershipExperiment
from audit.core.errors import UserInputError
from audit.core.schema import from_mapping


def _chosen(margins: np.ndarray, keep: np.ndarray, seed: int = 3, **extra) -> MembershipExperiment:
    """An experiment whose run r gives record x the logits (margins[r, x], 0) and label 0, i.e.
    p(x | θ_r) = sigmoid(margins[r, x])."""
    runs, records = keep.shape
    weights = [{"weight": torch.tensor(np.stack([m, np.zeros(records)]), dtype=torch.float32)} for m in margins]
    return MembershipExperiment(key="chosen", keep=keep, features=torch.eye(records),
                                labels=torch.zeros(records, dtype=torch.int64),
                                kind="tabular", model=nn.Linear(records, 2, bias=False), load_params=lambda r: weights[r],
                                seed=seed, **extra)


def _results(experiment: MembershipExperiment, **params) -> dict:
    return {result.name: result for result in RMIA(RMIAParams(**params)).run(experiment)}


# ---------------------------------------------------------------- the formula, by hand

#: p(x | θ_r): rows = runs θ0, θ1, θ2; columns = records x0 … x5
HAND_P = np.array([[0.8, 0.3, 0.5, 0.9, 0.7, 0.1],
                   [0.6, 0.8, 0.7, 0.8, 0.6, 0.1],
                   [0.5, 0.7, 0.2, 0.2, 0.7, 0.8]])
#: run 0 trained on x0, x1; run 1 on x2, x3; run 2 on x4; nobody on x5 (every record has an OUT
#: reference for every target, so no fallback is involved)
HAND_KEEP = np.zeros((3, 6), dtype=bool)
HAND_KEEP[0, [0, 1]] = HAND_KEEP[1, [2, 3]] = HAND_KEEP[2, 4] = True

# Worked through for target θ0 (references θ1, θ2; Z = non-members of run 0 = {x2, x3, x4, x5}):
#
# online, Pr(x) = mean of θ1, θ2 = (.55, .75, .45, .50, .65, .45)
#   ratio p(x|θ0)/Pr(x) = (16/11, 2/5, 10/9, 9/5, 14/13, 2/9) ≈ (1.455, .4, 1.111, 1.8, 1.077, .222)
#   γ = 1: x dominates z when ratio(x) ≥ ratio(z); a record is never its own z
#   x0: beats x2, x4, x5, not x3 → 3/4      x1: beats x5 only → 1/4
#   x2: Z∖{x2} = {x3, x4, x5}: beats x4 (1.111/1.077 = 1.03), x5 → 2/3
#   x3: beats all of x2, x4, x5 → 1          x4: beats x5 only → 1/3          x5: → 0
#
# offline, a = ½: Pr(x) = ½((1 + ½)·Pr_OUT(x) + ½) = .75·Pr_OUT(x) + .25, Pr_OUT over the OUT references:
#   x0: θ1, θ2 both OUT → .55 → Pr = 53/80;  x1: → .75 → 13/16;  x2: θ2 only (θ1 trained on it) → .2 → 2/5
#   x3: θ2 only → .2 → 2/5;  x4: θ1 only → .6 → 7/10;  x5: → .45 → 47/80
#   ratio = (64/53, 24/65, 5/4, 9/4, 1, 8/47) ≈ (1.208, .369, 1.25, 2.25, 1, .170)
#   x0: beats x4, x5 → 2/4 (the online score was 3/4: x2 now has the higher ratio)
#   x1: x5 → 1/4;  x2: x4, x5 → 2/3;  x3: → 1;  x4: x5 → 1/3;  x5: → 0
HAND_SCORES = {
    ("online", 0.3, 1.0): [[3 / 4, 1 / 4, 2 / 3, 1, 1 / 3, 0], [2 / 3, 1, 1, 3 / 4, 1 / 3, 0],
                           [1 / 2, 3 / 4, 1 / 4, 0, 3 / 5, 1]],
    ("offline", 0.5, 1.0): [[1 / 2, 1 / 4, 2 / 3, 1, 1 / 3, 0], [2 / 3, 1, 1, 1, 1 / 3, 0], [1 / 2, 3 / 4, 1 / 4, 0, 4 / 5, 1]],
    # γ = 2: x must beat z by a factor 2; for θ0 online only x3 (1.8) beats x5 (.222) by 2 …
    ("online", 0.3, 2.0): [[1 / 4, 0, 1 / 3, 1 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 3 / 4, 1 / 4, 1 / 3, 0],
                           [1 / 2, 1 / 2, 0, 0, 2 / 5, 1]],
    ("offline", 0.5, 2.0): [[1 / 4, 1 / 4, 1 / 3, 2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 4, 1 / 4, 1 / 3, 0],
                            [1 / 2, 1 / 2, 0, 0, 2 / 5, 1]],
    # a = 1: Pr(x) = Pr_OUT(x); a = 0: Pr(x) = ½(Pr_OUT(x) + 1)
    ("offline", 1.0, 1.0): [[1 / 2, 1 / 4, 2 / 3, 1, 1 / 3, 0], [1, 2 / 3, 1, 1, 1 / 3, 0], [1 / 2, 3 / 4, 1 / 4, 0, 4 / 5, 1]],
    ("offline", 0.0, 1.0): [[3 / 4, 1 / 4, 1 / 3, 1, 2 / 3, 0], [2 / 3, 1, 1, 1, 1 / 3, 0], [1 / 2, 3 / 4, 1 / 4, 0, 4 / 5, 1]],
}


@pytest.mark.parametrize("variant, a, gamma", list(HAND_SCORES))
def test_scores_match_the_hand_calculation(variant, a, gamma):
    margins = np.log(HAND_P) - np.log1p(-HAND_P)  # logits (log p − log(1 − p), 0): softmax gives p
    result = _results(_chosen(margins, HAND_KEEP), variants=[variant], a=a, gamma=gamma)[f"rmia-{variant}"]
    # every pairwise ratio above is ≥ 3 % away from γ: float32 logits cannot flip a comparison
    np.testing.assert_allclose(result.scores, HAND_SCORES[(variant, a, gamma)], atol=1e-12)
    np.testing.assert_array_equal(result.truth, HAND_KEEP)


# ---------------------------------------------------------------- null and power


def _leaky_margins(keep: np.ndarray, effect: float, seed: int = 0) -> np.ndarray:
    """Logit margins: a record's difficulty (shared by every run), a shift of ``effect`` when the
    run trained on it, and run-to-run noise."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0.0, 3.0, keep.shape[1])  # records differ a lot in how well any model fits them
    return difficulty + effect * keep + rng.normal(size=keep.shape)


def _record_experiment(effect: float, runs: int = 16, records: int = 600) -> MembershipExperiment:
    keep = np.random.default_rng(1).random((runs, records)) < 0.5
    return _chosen(_leaky_margins(keep, effect), keep, deltas={"record": 1e-5})


def test_null_shows_no_leakage():
    """Outputs that do not depend on membership: both variants' AUC intervals cover ½, and the
    one-run ε bound (valid at 95 %) stays near 0."""
    results = _results(_record_experiment(effect=0.0))
    assert set(results) == {"rmia-online", "rmia-offline"}
    for name, result in results.items():
        auc = result.metrics["auc"]
        # AUC's standard error on 9,600 independent pairs would be ≈ 1/√(3·9600) ≈ 0.006
        assert 0.47 <= auc.value <= 0.53, (name, auc)
        assert auc.low <= 0.5 <= auc.high, (name, auc)
        assert result.metrics["tpr_at_fpr_1%"].value <= 0.03, (name, result.metrics["tpr_at_fpr_1%"])
        assert result.metrics["epsilon_one_run"].value <= 0.2, (name, result.metrics["epsilon_one_run"])


def test_leakage_is_found_and_the_reference_calibration_matters():
    """Members' margins shifted by 2.5 under a record difficulty spread of 3: RMIA finds them,
    far better than a global threshold on p(x|θ) itself: Pr(x) is what removes the difficulty."""
    experiment = _record_experiment(effect=2.5)
    raw = ATTACKS.get("confidence-threshold")().run(experiment)[0].metrics["auc"].value
    assert raw < 0.75, raw
    for name, result in _results(experiment).items():
        auc = result.metrics["auc"]
        assert auc.value > 0.8 and auc.low > 0.5 and auc.value > raw + 0.08, (name, auc, raw)
        assert result.metrics["epsilon_one_run"].value > 0.5, (name, result.metrics["epsilon_one_run"])


# ---------------------------------------------------------------- client unit and the one-run ε


def test_client_unit_null_and_power():
    """Whole clients (10 records each) in or out; a client's score is its records' mean."""
    runs, clients, size = 16, 40, 10
    rng = np.random.default_rng(5)
    client_keep = np.array([rng.permutation(np.arange(clients) % 2 == 0) for _ in range(runs)])
    owners = np.arange(clients * size) // size
    keep = client_keep[:, owners]
    unit = {"unit": "client", "owners": owners, "client_keep": client_keep, "deltas": {"client": 1e-5}}
    null = _results(_chosen(_leaky_margins(keep, 0.0), keep, **unit))
    leaky = _results(_chosen(_leaky_margins(keep, 1.0), keep, **unit))
    for name in ("rmia-online", "rmia-offline"):
        assert null[name].unit == "client" and null[name].scores.shape == (runs, clients)
        n = null[name].truth.size
        se = math.sqrt((n + 1) / (3 * n ** 2))  # AUC's standard error at n/2 members and n/2 non-members
        assert abs(null[name].metrics["auc"].value - 0.5) <= max(0.05, 4 * se), name
        assert leaky[name].metrics["auc"].value > 0.8 and leaky[name].metrics["auc"].low > 0.5, name


def test_one_run_scores_read_no_counted_coin():
    """Steinke et al.'s count is valid only if the scores of the counted runs (the second half)
    use none of those runs' membership: flipping it — the target's own row included — must leave
    the scores passed as ``independent`` unchanged, while the leave-one-out scores (whose
    population is the target's non-members) do change."""
    runs, records = 8, 300
    keep = np.random.default_rng(2).random((runs, records)) < 0.5
    margins = _leaky_margins(keep, 1.0)
    flipped = keep.copy()
    flipped[runs // 2:] = ~flipped[runs // 2:]
    captured = {}

    class Capturing(RMIA):
        def result(self, variant, experiment, record_scores, notes, records=None, independent=None, run_groups=None):
            captured.setdefault(variant, []).append((record_scores, independent))
            return super().result(variant, experiment, record_scores, notes, records, independent, run_groups)

    for matrix in (keep, flipped):
        Capturing().run(_chosen(margins, matrix))  # the same models, only the membership matrix differs
    for variant, ((loo, (rows, before)), (loo_flipped, (rows_flipped, after))) in captured.items():
        np.testing.assert_array_equal(rows, np.arange(runs // 2, runs))
        np.testing.assert_array_equal(rows, rows_flipped)
        np.testing.assert_array_equal(before, after)
        assert not np.array_equal(loo[runs // 2:], loo_flipped[runs // 2:]), variant


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize("params, message", [
    ({"a": 1.5}, "params.a: must be <= 1.0"),
    ({"a": -0.1}, "params.a: must be >= 0.0"),
    ({"gamma": 0.0}, "params.gamma: must be > 0.0"),
    ({"gamma": -2}, "params.gamma: must be > 0.0"),
    ({"population": 0}, "params.population: must be >= 1"),
    ({"variants": ["online", "both"]}, "params.variants[1]: 'both' is not allowed; allowed: online, offline"),
    ({"variants": []}, "params.variants: must list at least 1"),
    ({"unit": "group"}, "params.unit: 'group' is not allowed"),
])
def test_bad_params_are_refused(params, message):
    with pytest.raises(UserInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_mapping(RMIAParams, params, "attacks[0].params")


def test_bad_params_exit_2_with_one_line(tmp_path, capsys):
    from audit.cli import main

    config = tmp_path / "rmia.yaml"
    config.write_text("dataset: {name: digits}\nattacks: [{name: rmia, params: {a: 2}}]\n")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "attacks[0].params.a: must be <= 1.0" in lines[0], lines
    assert not out.exists()


def test_registered_like_lira_and_defaults():
    assert ATTACKS.get("rmia") is RMIA
    defaults = RMIAParams()
    assert defaults.variants == ["online", "offline"] and defaults.a == 0.3 and defaults.gamma == 1.0
    assert defaults.unit == "auto" and defaults.rounds == "final"
