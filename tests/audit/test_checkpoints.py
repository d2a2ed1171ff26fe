"""Membership attacks on checkpoints trained elsewhere: models trained here by
plain PyTorch — not by dpfl-audit — saved as safetensors and scored through the public API."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import audit
from audit.core.errors import UserInputError
from audit.core.models import build_model

MODELS, RECORDS = 6, 240


def _factory():
    return build_model("mlp", (1, 8, 8), 10, {"hidden": [64]})


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    """Six MLPs, each fitted (full batch, 300 Adam steps) to its own random half of 240 digits."""
    folder = tmp_path_factory.mktemp("checkpoints")
    features, labels = digits.train.features[:RECORDS], digits.train.labels[:RECORDS]
    keep = np.random.default_rng(0).random((MODELS, RECORDS)) < 0.5
    paths = []
    for m in range(MODELS):
        torch.manual_seed(m)
        model = _factory()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        rows = torch.as_tensor(np.flatnonzero(keep[m]))
        for _ in range(300):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(features[rows]), labels[rows]).backward()
            optimizer.step()
        path = folder / f"model{m}.safetensors"
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
        paths.append(path)
    return paths, keep, features, labels


def test_lira_and_rmia_find_the_members_of_overfit_checkpoints(trained):
    """Leaky: every model fits its ≈ 120 records perfectly and generalises far less, so the
    attacks must separate members from non-members — every AUC interval above ½."""
    paths, keep, features, labels = trained
    results = audit.score_checkpoints(_factory, paths, keep, features, labels, attacks=["lira", "rmia"])
    assert [r.name for r in results] == ["lira-online", "lira-offline", "rmia-online", "rmia-offline"]
    for result in results:
        assert result.scores.shape == (MODELS, RECORDS) and result.unit == "record"
        assert result.metrics["auc"].low > 0.5, (result.name, result.metrics["auc"])
        assert {"epsilon_one_run", "epsilon_one_run_fdp"} <= set(result.metrics)


def test_membership_that_is_not_the_training_data_shows_nothing(trained):
    """Null: the same checkpoints, but ``keep`` replaced by coins drawn independently of what the
    models trained on — no attack can beat chance (AUC interval covers ½, no ε lower bound)."""
    paths, _, features, labels = trained
    unrelated = np.random.default_rng(1).random((MODELS, RECORDS)) < 0.5
    for result in audit.score_checkpoints(_factory, paths, unrelated, features, labels, attacks=["lira"]):
        assert result.metrics["auc"].low < 0.5 < result.metrics["auc"].high, (result.name, result.metrics["auc"])
        assert result.metrics["epsilon_one_run"].value < 0.5


def test_a_pickle_or_a_mismatched_checkpoint_is_a_one_line_error(trained, tmp_path):
    paths, keep, features, labels = trained
    pickled = tmp_path / "model.pt"
    torch.save(_factory().state_dict(), pickled)  # a pickle: never loaded
    with pytest.raises(UserInputError, match=r"model\.pt: not a safetensors file") as caught:
        audit.score_checkpoints(_factory, [pickled, *paths[1:]], keep, features, labels)
    assert "\n" not in str(caught.value)
    wrong = tmp_path / "wrong.safetensors"
    save_file({k: v for k, v in build_model("mlp", (1, 8, 8), 10, {"hidden": [32]}).state_dict().items()}, str(wrong))
    with pytest.raises(UserInputError, match=r"wrong\.safetensors: parameter '\S+' has shape \(32, 64\)"):
        audit.score_checkpoints(_factory, [wrong, *paths[1:]], keep, features, labels)
    with pytest.raises(UserInputError, match=r"keep: shape \(6, 239\)"):
        audit.score_checkpoints(_factory, paths, keep[:, 1:], features, labels)
    with pytest.raises(UserInputError, match=r"attacks\[0\]\.params\.gamma"):
        audit.score_checkpoints(_factory, paths, keep, features, labels, attacks=[{"name": "rmia", "params": {"gamma": -1}}])
    with pytest.raises(UserInputError, match=r"no such file"):
        audit.score_checkpoints(_factory, [tmp_path / "absent.safetensors", *paths[1:]], keep, features, labels)
