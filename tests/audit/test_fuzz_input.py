"""Property-based fuzzing of the command line's input contract.

Malformed configs (one field of a valid tiny config replaced by a value its schema forbids, an
unknown field, an unknown component name, a non-mapping document) and malformed command-line
values (NaN, ±inf, text, negative, absurdly large) must each end with exit code 2, exactly one
line on stderr, no traceback, and nothing written — neither inside ``--out`` nor anywhere else
in the working folder. The bad values are derived from the schema's own ranges, so a field
added later is fuzzed without anyone remembering to.
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main
from audit.config import AuditConfig
from audit.core.schema import field_reference

BASE = {
    "dataset": {"name": "digits", "max_pool": 160, "max_test": 100},
    "partition": {"clients": 4},
    "training": {"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.1},
    "membership": {"runs": 4},
    "defenses": [{"name": "fedavg"}],
    "attacks": [{"name": "loss-threshold"}],
    "diagnostics": {"enabled": False},
}

#: leaf fields of the config (lists of entries are fuzzed through their first entry)
FIELDS = [row for row in field_reference(AuditConfig) if not row["field"].endswith("[]")]


def _bad_values(row: dict) -> list:
    """Values the schema must refuse for this field (never a valid one)."""
    kind, span = row["type"], row["range"]
    bad: list = [[1, 2]] if "list" not in kind else [{"a": 1}]
    if kind.startswith("an integer") or kind == "a number" or "list of" in kind:
        bad += ["text", True]
        if kind.startswith("an integer"):
            bad += [1.5, 2**70]  # above every integer bound (seeds go to 2^64 - 1)
        if kind == "a number":
            bad += [math.nan, math.inf, -math.inf]
        if span.startswith("0 <") or span.startswith("1 ≤") or span.startswith("2 ≤") or span.startswith("0 ≤"):
            bad.append(-1)
        if "list of" in kind:
            bad = [{"a": 1}, "text", [math.nan], [-1] if span else [{"a": 1}]]
    elif kind.startswith("one of"):
        bad += ["not-an-allowed-value", 3.5]
    elif kind == "a string":
        bad += [12, 0.5]
    elif kind == "true or false":
        bad += ["yes", 1]
    elif kind == "a mapping":
        bad += ["text", 3]
    return bad


def _set(document: dict, dotted: str, value) -> None:
    parts = dotted.replace("[]", "").split(".")
    node = document
    for part in parts[:-1]:
        node = node[part][0] if part in ("defenses", "attacks") else node.setdefault(part, {})
    node[parts[-1]] = value


@st.composite
def broken_configs(draw) -> object:
    how = draw(st.sampled_from(["field", "field", "field", "unknown-field", "unknown-name", "shape"]))
    document = copy.deepcopy(BASE)
    if how == "field":
        row = draw(st.sampled_from(FIELDS))
        _set(document, row["field"], draw(st.sampled_from(_bad_values(row))))
    elif how == "unknown-field":
        section = draw(st.sampled_from(["", "dataset", "training", "membership", "partition", "record"]))
        key = "zz_" + draw(st.text(alphabet="abcdefghij_", min_size=1, max_size=8))
        (document if not section else document.setdefault(section, {}))[key] = 1
    elif how == "unknown-name":
        where = draw(st.sampled_from(["dataset.name", "model.name", "defenses.name", "attacks.name", "partition.name"]))
        _set(document, where, "no-such-" + draw(st.text(alphabet="abcxyz", min_size=1, max_size=6)))
    else:
        return draw(st.sampled_from([[1, 2], "just text", 42]))
    return document


def _assert_refused(code: int, err: str, folder: Path, keep: set[Path]) -> None:
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("dpfl-audit") and "Traceback" not in err, err
    assert {p for p in folder.rglob("*")} == keep, "something was written"


@given(document=broken_configs())
@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_generated_broken_configs_are_refused_with_one_line_and_nothing_written(document, capsys):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        config = root / "fuzz.yaml"
        config.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
        code = main(["run", str(config), "--out", str(root / "out"), "--quiet"])
        _assert_refused(code, capsys.readouterr().err, root, {config})


#: (command with valid arguments, options that take a value)
COMMANDS: list[tuple[list[str], list[str]]] = [
    (["epsilon", "--noise", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     ["--noise", "--rate", "--steps", "--delta"]),
    (["epsilon", "--target-epsilon", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5"], ["--target-epsilon"]),
    (["audit-mechanism", "--mechanism", "gaussian", "--noise", "1", "--trials", "1000"],
     ["--noise", "--clip", "--dim", "--trials", "--delta", "--seed"]),
    (["conformance", "dp-fedavg", "--trials", "100"], ["--trials", "--alpha", "--delta", "--seed"]),
    (["invert", "--attack", "dlg"], ["--batch-size", "--clip", "--noise", "--iterations", "--restarts", "--images", "--seed"]),
    (["run", "CONFIG"], ["--seed", "--workers", "--batch-runs", "--max-hours"]),
    (["reproduce", "blur-lus", "--quick"], ["--seeds"]),
]
BAD_NUMBERS = ["nan", "inf", "-inf", "abc", "", "-1", "-7.5", "1e30", "99999999999999999999999999"]


@st.composite
def broken_command_lines(draw) -> tuple[list[str], str, str]:
    base, options = draw(st.sampled_from(COMMANDS))
    option = draw(st.sampled_from(options))
    value = draw(st.sampled_from(BAD_NUMBERS))
    args = list(base)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    return args, option, value


@given(case=broken_command_lines())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_generated_bad_command_line_values_are_refused(case, capsys):
    args, option, value = case
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        config = root / "tiny.yaml"
        config.write_text(yaml.safe_dump(BASE), encoding="utf-8")
        args = [str(config) if a == "CONFIG" else a for a in args]
        cwd = os.getcwd()
        os.chdir(root)  # default output folders (invert-out, reproduce-…) would land here
        try:
            code = main(args + ["--quiet"] if args[0] in ("run", "conformance", "reproduce") else args)
        finally:
            os.chdir(cwd)
        err = capsys.readouterr().err
        _assert_refused(code, err, root, {config})
        assert option in err or option.lstrip("-") in err, err


def test_the_fuzzer_covers_every_kind_of_field():
    kinds = {row["type"].split(",")[0] for row in FIELDS}
    assert {"an integer", "a number", "a string", "true or false", "a mapping"} <= kinds
    for row in FIELDS:  # every leaf has at least two values the schema must refuse
        assert len(_bad_values(row)) >= 2, row


@pytest.mark.parametrize("row", FIELDS, ids=lambda r: r["field"])
def test_each_field_refuses_each_of_its_bad_values(row, tmp_path, capsys):
    """Not random: every bad value of every field, once (the property tests above sample them)."""
    for i, value in enumerate(_bad_values(row)):
        document = copy.deepcopy(BASE)
        _set(document, row["field"], value)
        config = tmp_path / f"c{i}.yaml"
        config.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
        code = main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1, (row["field"], value, err)
        assert not (tmp_path / "out").exists()

