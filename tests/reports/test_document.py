"""results.json is its types: the file, the reader and the published JSON Schema
come from one set of frozen dataclasses, so they cannot drift apart.

The schema expectations below are written from the JSON Schema specification (draft 2020-12)
and the document's meaning, not read off the generator."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Literal

import jsonschema
import pytest

from audit.core.atomic import dumps
from audit.core.typed_json import from_json, json_schema, to_json
from defenses.privacy.claims import PrivacyClaim
from reports.document import SCHEMA_FILE, Experiment, Results, results_schema


@dataclass(frozen=True)
class Point:
    x: float = field(metadata={"min": 0, "help": "abscissa"})
    label: Literal["a", "b"]
    note: str | None = field(default=None, metadata={"omit_if_none": True})


@dataclass(frozen=True)
class Curve:
    """A curve."""

    name: str
    points: list[Point]
    extent: float = field(default=math.inf, metadata={"null_means": math.inf})
    tags: dict[str, int] = field(default_factory=dict)


def _valid(schema: dict, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_a_small_type_tree_has_the_schema_json_schema_prescribes():
    schema = json_schema(Curve)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["name", "points", "extent", "tags"] and schema["additionalProperties"] is False
    assert schema["description"] == "A curve."
    assert schema["properties"]["points"] == {"type": "array", "items": {"$ref": "#/$defs/Point"}}
    assert schema["properties"]["extent"]["type"] == ["number", "null"]  # null stands for +inf
    assert schema["properties"]["tags"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    point = schema["$defs"]["Point"]
    assert point["required"] == ["x", "label"]  # note is optional: omitted while None
    assert point["properties"]["x"] == {"type": "number", "minimum": 0, "description": "abscissa"}
    assert point["properties"]["label"] == {"enum": ["a", "b"]}
    assert point["properties"]["note"] == {"type": ["string", "null"]}


def test_a_small_type_tree_round_trips_and_the_schema_refuses_what_the_types_cannot_hold():
    schema = json_schema(Curve)
    curve = Curve("c", [Point(0.5, "a"), Point(2.0, "b", note="n")], tags={"k": 3})
    value = to_json(curve)
    assert value == {"name": "c", "points": [{"x": 0.5, "label": "a"}, {"x": 2.0, "label": "b", "note": "n"}],
                     "extent": None, "tags": {"k": 3}}
    assert list(value) == ["name", "points", "extent", "tags"]  # field order is the key order
    assert _valid(schema, value) and from_json(Curve, value) == curve
    assert from_json(Curve, {**value, "extent": 3}) == Curve("c", curve.points, 3.0, {"k": 3})
    for broken in ({**value, "extra": 1}, {k: v for k, v in value.items() if k != "name"},
                   {**value, "points": [{"x": -1, "label": "a"}]}, {**value, "points": [{"x": 1, "label": "c"}]},
                   {**value, "points": [{"x": "1", "label": "a"}]}, {**value, "points": [{"x": None, "label": "a"}]},
                   {**value, "tags": {"k": 1.5}}, {**value, "name": None}):
        assert not _valid(schema, broken), broken


def test_the_published_schema_is_the_one_the_types_generate():
    """reports/schema/results.schema.json is generated: `python -m reports.document` rewrites it."""
    assert SCHEMA_FILE.read_text(encoding="utf-8") == dumps(results_schema()) + "\n", \
        "regenerate the schema with: python -m reports.document"


def test_results_json_is_the_types_written_out(smoke_runs):
    """The document the audit wrote reads into the types and writes back byte for byte; the
    reader builds real types (a claim with ε = ∞ for no claim), not dicts."""
    _, (out, _) = smoke_runs
    text = (out / "results.json").read_text(encoding="utf-8")
    document = json.loads(text)
    results = from_json(Results, document)
    assert isinstance(results, Results) and all(isinstance(e, Experiment) for e in results.experiments)
    assert dumps(to_json(results)) + "\n" == text
    claims = {e.key: e.claim for e in results.experiments}
    assert all(isinstance(c, PrivacyClaim) for c in claims.values())
    non_private = [e for e in results.experiments if e.defense == "fedavg"]
    assert non_private and all(e.claim.epsilon == math.inf and not e.claim.is_private for e in non_private)
    assert [e.claim.epsilon for e in results.experiments if e.claim.is_private] == \
        [e["claim"]["epsilon"] for e in document["experiments"] if e["claim"]["epsilon"] is not None]


def _first_verdict(document: dict) -> list:
    return next(["experiments", i, "attacks", j, "verdicts", 0]
                for i, e in enumerate(document["experiments"]) for j, a in enumerate(e["attacks"]) if a["verdicts"])


@pytest.mark.parametrize("path, value", [
    (["experiments", 0, "claim", "unit"], "household"),
    ("verdict", "guess"),
    (["experiments", 0, "utility", "test_accuracy", "runs"], -1),
    (["audit", "seed"], 2**64),
    (["tool", "surprise"], 1),
], ids=["claim-unit", "verdict-kind", "negative-runs", "seed-beyond-64-bits", "unknown-field"])
def test_the_generated_schema_refuses_values_outside_the_types(smoke_runs, path, value):
    _, (out, _) = smoke_runs
    document = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert _valid(results_schema(), document)
    if path == "verdict":
        path = [*_first_verdict(document), "kind"]
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    assert not _valid(results_schema(), document)
