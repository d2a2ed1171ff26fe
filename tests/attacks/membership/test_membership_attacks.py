"""Every membership attack on real trained models: no leakage when membership cannot matter
(null), leakage when it does (power), for records and for whole clients, final model or trajectory.

Models: an MLP 64→128→10 on scikit-learn digits, trained full-batch with Adam until it
memorises its records. Null: each run trains on records *outside* the scored pool, so the
membership matrix cannot influence the models. Power: each run trains on the pool records its
membership row keeps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import attacks.catalog  # noqa: F401  (registers every attack)
from attacks.base import ATTACKS
from attacks.membership.canary_queries import CanaryQueryParams
from attacks.membership.lira import LiRAParams
from attacks.membership.shokri import ShokriParams
from attacks.membership.threshold import EntropyParams, ThresholdParams
from attacks.membership_experiment import MembershipExperiment

POOL = 400
RUNS = 16
CLIENT_SIZE = 10  # client unit: records 10c..10c+9 form candidate client c
STEPS = (60, 120, 200)  # global models kept along the "trajectory"


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _train(x: torch.Tensor, y: torch.Tensor, seed: int) -> list[dict[str, torch.Tensor]]:
    """Full-batch Adam; the parameters after each of STEPS steps."""
    torch.manual_seed(seed)
    model = _model()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    snapshots = []
    for step in range(1, STEPS[-1] + 1):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
        if step in STEPS:
            snapshots.append({k: v.detach().clone() for k, v in model.named_parameters()})
    return snapshots


def _experiment(leaky: bool, unit: str) -> MembershipExperiment:
    digits = load_digits()
    x = torch.as_tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.as_tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(y))
    pool, outside = order[:POOL], order[POOL:]
    rng = np.random.default_rng(1)
    owners = np.arange(POOL) // CLIENT_SIZE
    client_keep = None
    if unit == "client":
        client_keep = np.array([rng.permutation(np.arange(POOL // CLIENT_SIZE) % 2 == 0) for _ in range(RUNS)])
        keep = client_keep[:, owners]
    else:
        keep = np.array([rng.permutation(np.arange(POOL) % 2 == 0) for _ in range(RUNS)])
    trajectories = []
    for r in range(RUNS):
        chosen = pool[keep[r]] if leaky else rng.choice(outside, POOL // 2, replace=False)
        trajectories.append(_train(x[chosen], y[chosen], seed=100 + r))
    return MembershipExperiment(
        key="test", keep=keep, features=x[pool], labels=y[pool], kind="tabular", model=_model(),
        load_params=lambda r: trajectories[r][-1], seed=7, unit=unit,
        owners=owners if unit == "client" else None, client_keep=client_keep,
        load_round=lambda r, t: trajectories[r][t - 1], rounds=len(STEPS), deltas={"record": 1e-5, "client": 1e-5})


#: every membership attack, with settings small enough for a test (canary queries are costly)
ATTACK_SETTINGS = {
    "lira": LiRAParams(),
    "shokri": ShokriParams(),
    "loss-threshold": ThresholdParams(),
    "confidence-threshold": ThresholdParams(),
    "entropy-threshold": EntropyParams(),
    "canary-queries": CanaryQueryParams(queries=4, iterations=10, max_records=120),
}


def _results(experiment: MembershipExperiment) -> dict[str, dict]:
    out = {}
    for name, params in ATTACK_SETTINGS.items():
        for result in ATTACKS.get(name)(params).run(experiment):
            out[result.name] = result
    return out


@pytest.fixture(scope="module")
def null_record():
    return _results(_experiment(leaky=False, unit="record"))


@pytest.fixture(scope="module")
def leaky_record():
    return _results(_experiment(leaky=True, unit="record"))


def test_registry_lists_the_membership_and_canary_attacks():
    assert {"lira", "shokri", "loss-threshold", "confidence-threshold", "entropy-threshold", "canary-queries",
            "record-canaries", "client-canaries", "gradient-canaries"} <= set(ATTACKS.names())


def _assert_null(results):
    for name, result in results.items():
        m = result.metrics
        pairs = result.truth.size
        # AUC's standard error on independent pairs is ≈ 1/√(12·n₊n₋/(n₊+n₋)); the band [0.45, 0.55] below
        # is wider than 3 standard errors for every attack here (≥ 1920 pairs)
        assert 3 / math.sqrt(3 * pairs) < 0.05, name
        assert 0.45 <= m["auc"].value <= 0.55, (name, m["auc"].value)
        assert m["tpr_at_fpr_1%"].value <= 0.02, (name, m["tpr_at_fpr_1%"].value)
        # the two-way intervals cover chance (the pairs are correlated; DeLong's intervals did not)
        assert m["auc"].low <= 0.5 <= m["auc"].high, (name, m["auc"])
        # a one-run bound exceeds 0 under the null with probability ≤ 5 %; with 0.2 for the odd exceedance
        assert m["epsilon_one_run"].value <= 0.2, (name, m["epsilon_one_run"])
        assert 0.45 <= m["accuracy"].value <= 0.55, (name, m["accuracy"])


def test_null_calibration_records(null_record):
    assert set(null_record) == {"lira-online", "lira-offline", "shokri", "loss-threshold", "confidence-threshold",
                                "entropy-threshold", "canary-queries-online", "canary-queries-offline"}
    _assert_null(null_record)


def test_power_on_overfit_digits_and_the_lira_ordering(leaky_record):
    tpr = {name: r.metrics["tpr_at_fpr_1%"].value for name, r in leaky_record.items()}
    for name, result in leaky_record.items():
        m = result.metrics
        assert m["auc"].low > 0.5, (name, m["auc"])  # beats chance with 95 % confidence
        assert m["epsilon_one_run"].value > 0, name
    # the LiRA paper's ordering at low FPR (Carlini et al. 2022, Fig. 4/Table 1); measured here, not tuned
    thresholds = max(tpr["loss-threshold"], tpr["confidence-threshold"], tpr["entropy-threshold"])
    assert tpr["lira-online"] >= tpr["lira-offline"] >= thresholds, tpr


def test_client_unit_null_and_power():
    null = _results(_experiment(leaky=False, unit="client"))
    for result in null.values():
        assert result.unit == "client" and result.truth.shape[1] <= POOL // CLIENT_SIZE
    # fewer units (40 clients × 16 runs): the AUC band widens; the check uses 4 standard errors
    for name, result in null.items():
        n = result.truth.size
        se = math.sqrt((n + 1) / (3 * n ** 2))  # AUC's standard error at n/2 members and n/2 non-members
        assert abs(result.metrics["auc"].value - 0.5) <= max(0.05, 4 * se), name
    leaky = _results(_experiment(leaky=True, unit="client"))
    for name, result in leaky.items():
        assert result.metrics["auc"].value > null[name].metrics["auc"].value, name
        assert result.metrics["auc"].low > 0.5, (name, result.metrics["auc"])


def test_record_scores_aggregate_to_clients():
    experiment = _experiment(leaky=True, unit="client")
    scores = np.random.default_rng(0).normal(size=(RUNS, POOL))
    clients = experiment.to_unit(scores, "client")
    np.testing.assert_allclose(clients[:, 3], scores[:, 30:40].mean(1))
    assert experiment.truth("client").shape == (RUNS, POOL // CLIENT_SIZE)
    assert experiment.truth("record").shape == (RUNS, POOL)


def test_trajectory_rounds():
    experiment = _experiment(leaky=True, unit="record")
    assert experiment.round_list("all") == [1, 2, 3]
    assert experiment.round_list([1, 3]) == [1, None]  # the last round is the final model
    final = ATTACKS.get("loss-threshold")(ThresholdParams(rounds="final")).run(experiment)[0]
    early = ATTACKS.get("loss-threshold")(ThresholdParams(rounds=[1])).run(experiment)[0]
    every = ATTACKS.get("loss-threshold")(ThresholdParams(rounds="all")).run(experiment)[0]
    # the average over rounds equals the mean of the per-round scores
    per_round = [ATTACKS.get("loss-threshold")(ThresholdParams(rounds=[t])).run(experiment)[0].scores for t in (1, 2, 3)]
    np.testing.assert_allclose(every.scores, np.mean(per_round, axis=0), rtol=1e-6)
    # memorisation grows with training: the early model leaks less than the final one
    assert early.metrics["auc"].value < final.metrics["auc"].value
    lira = ATTACKS.get("lira")(LiRAParams(rounds="all")).run(experiment)
    assert all("3 rounds" in r.notes for r in lira) and all(r.metrics["auc"].value > 0.6 for r in lira)


def test_shokri_classifiers_and_bad_unit():
    from audit.core.errors import UserInputError

    experiment = _experiment(leaky=True, unit="record")
    for classifier in ("logistic", "gradient-boosting"):
        result = ATTACKS.get("shokri")(ShokriParams(classifier=classifier)).run(experiment)[0]
        assert result.metrics["auc"].value > 0.6, classifier
    with pytest.raises(UserInputError, match="membership.unit: client"):
        ATTACKS.get("loss-threshold")(ThresholdParams(unit="client")).run(experiment)
