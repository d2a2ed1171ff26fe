"""results.json against its published schema; `dpfl-audit report` regenerates the report byte for byte."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from audit.cli import main
from reports.results import SCHEMA_VERSION


def _schema() -> dict:
    return json.loads(resources.files("reports").joinpath("schema/results.schema.json").read_text(encoding="utf-8"))


def test_results_json_validates_against_the_packaged_schema(smoke_runs):
    _, (out, _) = smoke_runs
    document = json.loads((out / "results.json").read_text())
    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
    assert document["schema_version"] == SCHEMA_VERSION == schema["properties"]["schema_version"]["const"]


def test_schema_rejects_what_it_should(smoke_runs):
    _, (out, _) = smoke_runs
    document = json.loads((out / "results.json").read_text())
    broken = json.loads(json.dumps(document))
    broken["experiments"][0]["soundness"] = "probably fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _schema(), cls=jsonschema.Draft202012Validator)
    broken = json.loads(json.dumps(document))
    broken["rows"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _schema(), cls=jsonschema.Draft202012Validator)


def test_report_command_regenerates_identical_files(smoke_runs, tmp_path, capsys):
    _, (out, _) = smoke_runs
    first, second = tmp_path / "one.html", tmp_path / "two.html"
    assert main(["report", str(out), "--out", str(first)]) == 0
    assert main(["report", str(out / "results.json"), "--out", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == (out / "report.html").read_bytes()  # the same as `run` wrote
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "results: " in capsys.readouterr().err
