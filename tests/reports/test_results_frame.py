"""The results table as a DataFrame (audit.results_frame, AuditOutcome.frame): from every source
it accepts — the output folder, results.json, results.csv, the document, its JSON, the outcome —
it equals what pandas reads from the results.csv the audit wrote, with typed columns."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import audit
from audit.core.errors import UserInputError
from reports.results import COLUMNS, FLOAT_COLUMNS, TEXT_COLUMNS
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frame")
    config = folder / "tiny.yaml"
    # a non-private and a private defense (empty and filled ε cells), a membership attack with
    # intervals and a canary audit with one-run ε bounds
    config.write_text(tiny_config(defenses=[{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}],
                                  attacks=[{"name": "loss-threshold"}, {"name": "record-canaries"}]))
    return audit.audit(audit.load_config(config), folder / "out", quiet=True)


def test_every_column_has_a_type():
    assert sorted([*TEXT_COLUMNS, *FLOAT_COLUMNS, "seed"]) == sorted(COLUMNS)


def test_the_frame_equals_results_csv_read_by_pandas(outcome):
    frame = audit.results_frame(outcome.out)
    written = pd.read_csv(outcome.out / "results.csv")
    pd.testing.assert_frame_equal(frame, written, check_exact=False, rtol=1e-15)
    assert list(frame.columns) == COLUMNS and len(frame) == len(outcome.results.rows)
    assert all(frame[name].dtype == np.float64 for name in FLOAT_COLUMNS) and frame["seed"].dtype == np.int64
    assert all(frame[name].map(type).eq(str).all() for name in TEXT_COLUMNS)
    # what the cells say: the non-private defense has no ε (NaN), the private one its claim
    by_defense = frame.groupby("defense")["epsilon"]
    assert by_defense.apply(lambda e: e.isna().all())["fedavg"]
    (claimed,) = by_defense.unique()["dp-fedavg"]
    assert claimed == pytest.approx(8.0, abs=1e-3)  # the claim's ε as calibrated (just under the target)
    assert {"none", "claim", "loss-threshold", "record-canaries"} <= set(frame["attack"])
    auc = frame[(frame["attack"] == "loss-threshold") & (frame["metric"] == "auc")]
    assert len(auc) == 2 and ((auc["ci_low"] <= auc["value"]) & (auc["value"] <= auc["ci_high"])).all()


def test_every_source_gives_the_same_frame(outcome):
    expected = audit.results_frame(outcome.out)
    document = json.loads((outcome.out / "results.json").read_text(encoding="utf-8"))
    sources = {"outcome.frame": outcome.frame, "outcome": audit.results_frame(outcome),
               "document": audit.results_frame(outcome.results), "json dict": audit.results_frame(document),
               "results.json": audit.results_frame(outcome.out / "results.json"),
               "results.json as str": audit.results_frame(str(outcome.out / "results.json")),
               "results.csv": audit.results_frame(outcome.out / "results.csv")}
    for name, frame in sources.items():
        pd.testing.assert_frame_equal(frame, expected, check_exact=True, obj=name)


def test_a_folder_with_only_results_csv_is_read_from_it(outcome, tmp_path):
    (tmp_path / "results.csv").write_bytes((outcome.out / "results.csv").read_bytes())
    pd.testing.assert_frame_equal(audit.results_frame(tmp_path), audit.results_frame(outcome.out), check_exact=True)


def test_an_infinite_bound_and_empty_cells_survive_the_csv(outcome, tmp_path):
    """A one-sided interval's ci_high is +inf (written "inf"), a claim's uncovered observer an empty
    value: both read back as the floats they were, not as text."""
    csv = (outcome.out / "results.csv").read_text(encoding="utf-8").splitlines()
    header, first = csv[0], csv[1].split(",")
    first[COLUMNS.index("ci_high")], first[COLUMNS.index("value")] = "inf", ""
    (tmp_path / "results.csv").write_text("\n".join([header, ",".join(first), *csv[2:]]) + "\n", encoding="utf-8")
    frame = audit.results_frame(tmp_path / "results.csv")
    assert frame["ci_high"].iloc[0] == math.inf and math.isnan(frame["value"].iloc[0])
    assert frame["value"].dtype == np.float64


def test_bad_sources_are_one_line_errors(tmp_path, outcome):
    with pytest.raises(UserInputError, match="no results.json"):
        audit.results_frame(tmp_path)
    with pytest.raises(UserInputError, match="does not exist"):
        audit.results_frame(tmp_path / "missing.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="columns"):
        audit.results_frame(tmp_path / "other.csv")
    with pytest.raises(UserInputError, match="expected an output folder"):
        audit.results_frame(42)
    trained_only = audit.audit(audit.load_config(outcome.out / "config.yaml"), tmp_path / "trained", attack=False,
                               quiet=True)
    with pytest.raises(UserInputError, match="wrote no results"):
        _ = trained_only.frame
