"""`dpfl-audit reproduce`: studies run end to end (shrunk), resume, and claims are judged honestly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audit.cli import main
from audit.core.errors import UserInputError
from audit.reproduce import make_study, reproduce
from audit.study import RunResult, StudyResults, compare, smaller


def _run(arm, epsilon, seed, accuracy, norm=0.5):
    return RunResult(arm, epsilon, seed, 1.0, accuracy, accuracy, accuracy + 0.01, {1: accuracy}, {1: 0.5}, norm, norm,
                     norm, 1.0, None, 0.0)


def test_compare_verdicts():
    results = StudyResults([_run("a", 1, 0, 0.80), _run("a", 1, 1, 0.82), _run("b", 1, 0, 0.79), _run("b", 1, 1, 0.83)])
    check = compare(results, "a", "b", [1])  # +1 and −1 pt: a tie on average, which "≥" allows
    assert check.holds and "the claimed way in 1 of 2 pairs" in check.detail and "within seed noise" in check.detail
    tied = StudyResults([_run("a", 1, s, 0.8) for s in (0, 1)] + [_run("b", 1, s, 0.8) for s in (0, 1)])
    assert compare(tied, "a", "b", [1]).holds and not compare(tied, "a", "b", [1], strict=True).holds
    assert not compare(results, "b", "a", [1], margin=0.01).holds
    assert compare(results, "a", "missing", [1]).holds is None
    assert compare(StudyResults([_run("a", 1, 0, 0.9), _run("b", 1, 0, 0.1)]), "a", "b", [1]).holds is None  # one seed: undecided
    norms = StudyResults([_run("a", 1, s, 0.8, norm=0.2) for s in (0, 1)] + [_run("b", 1, s, 0.8, norm=0.4) for s in (0, 1)])
    assert smaller(norms, "a", "b", [1], "update_norm_mean", "a smaller").holds


def test_at_epsilon_reads_the_last_round_within_budget():
    run = RunResult("a", None, 0, 3.0, 0.9, 0.9, 0.9, {1: 0.5, 2: 0.7, 3: 0.9}, {1: 1.0, 2: 2.0, 3: 3.0}, 1, 1, 1, 1, None, 0)
    assert StudyResults([run]).at_epsilon("a", 2.0).tolist() == [0.7]
    assert np.isnan(StudyResults([run]).at_epsilon("a", 0.5)).all()


#: the arms each shrunk study keeps (enough for its claims to be judged)
SHRUNK_ARMS = {"blur-lus": ["dp-fedavg", "blur", "lus"], "dp-fedsam": ["dp-fedavg", "dp-fedsam"],
               "fl-top": ["fl-top-5", "fl-top-dp-0.5", "fl-basic-dp-5", "fl-cs-dp-0.5", "fl-std"],
               "ldp-fl": ["ldp-fl", "noise-free"]}


@pytest.mark.parametrize("name", list(SHRUNK_ARMS))
def test_shrunk_study_end_to_end_and_resume(tmp_path, name, monkeypatch):
    study = make_study(name, quick=True, dataset="digits", data_root=None, seeds=1)
    study.config["partition"]["clients"] = 20
    study.config["training"]["rounds"] = 3
    study.config["training"]["eval_every"] = 1
    study.config["training"]["client_rate"] = min(study.config["training"]["client_rate"], 0.5)
    if name == "ldp-fl":
        study.config["training"]["local_steps"] = 1
    study.arms = [a for a in study.arms if a.key in SHRUNK_ARMS[name]]
    assert len(study.arms) == len(SHRUNK_ARMS[name])
    if name != "ldp-fl" and study.epsilons != [None]:
        study.epsilons = [8.0]
    study.delta = 1e-3
    out = tmp_path / name
    result = reproduce(study, out, quiet=True)
    for file in ("reproduction.md", "reproduction.json", "reproduction.csv"):
        assert (out / file).is_file()
    document = json.loads((out / "reproduction.json").read_text())
    private = [a for a in study.arms if a.defense not in ("fedavg", "fl-top", "fl-basic", "fl-cs", "fl-std")]
    expected = len(private) * len(study.epsilons) + len(study.arms) - len(private)
    assert len(document["runs"]) == expected and document["claims"]
    assert all(c["holds"] for c in document["claims"][: len(study.reductions)]), "the reductions are exact"
    assert "## The paper's numbers" in result["markdown"] and "## Claims" in result["markdown"]
    if name == "fl-top":  # Table 1's bandwidth is arithmetic: every cell must come out of the formula
        assert "(40 of 40 match)" in result["markdown"] and document["claims"][0]["holds"]
    if name == "ldp-fl":  # the per-weight ε is never passed off as a per-client guarantee
        assert any("d·ε" in c["detail"] and c["holds"] is False for c in document["claims"])

    import defenses.base

    monkeypatch.setattr(defenses.base.Defense, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    monkeypatch.setattr(study, "reductions", [])
    again = reproduce(study, out, quiet=True)
    assert [c.claim for c in again["claims"]] == [c["claim"] for c in
                                                  document["claims"][len(make_study(name, True, "digits", None, 1).reductions):]]


def test_bad_study_and_dataset_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(UserInputError, match="allowed: blur-lus, dp-fedsam"):
        make_study("nope", True, "digits", None, None)
    assert main(["reproduce", "blur-lus", "--quick", "--dataset", "cifar", "--out", str(tmp_path / "o")]) == 2
    assert "--dataset: 'cifar' is not allowed" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["reproduce", "dp-fedsam", "--quick", "--data-root", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()
    assert main(["reproduce", "ldp-fl", "--quick", "--dataset", "digits", "--device", "gpu0", "--out", str(tmp_path / "o")]) == 2
    assert ("device: 'gpu0' is not a device of this machine; allowed: " in capsys.readouterr().err
            and not (tmp_path / "o").exists())
