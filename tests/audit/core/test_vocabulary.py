"""The project's words (audit.core.vocabulary) are the published results format's words.

The expected values are read from ``reports/schema/results.schema.json`` — the contract readers
of ``results.json`` rely on — not from the code, so renaming a member's value, dropping one or
adding one the format does not know fails here. A member must also *be* its string wherever it
is written: str(), format(), f-strings, %-formatting, JSON (as a value and as a key), csv.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from audit.core.vocabulary import (
    MEMBERSHIP_UNITS,
    EpsilonKind,
    Observation,
    Observer,
    Relation,
    StrEnum310,
    Unit,
    VerdictKind,
    VerdictStatus,
)

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "reports" / "schema" / "results.schema.json")
                    .read_text(encoding="utf-8"))
DEFS = SCHEMA["$defs"]


def _enum(schema: dict) -> list:
    """The enum of a property, through a nullable ``anyOf``."""
    if "enum" in schema:
        return schema["enum"]
    (listed,) = [option["enum"] for option in schema["anyOf"] if "enum" in option]
    return listed


#: (enum, where the results schema lists its values) — in the schema's order
PUBLISHED = [
    (VerdictStatus, DEFS["Verdict"]["properties"]["status"]),
    (VerdictStatus, DEFS["Experiment"]["properties"]["soundness"]),
    (VerdictKind, DEFS["Verdict"]["properties"]["kind"]),
    (EpsilonKind, DEFS["AttackRecord"]["properties"]["epsilon_kind"]["additionalProperties"]),
    (Observation, DEFS["AttackRecord"]["properties"]["observation"]),
    (Observer, DEFS["AttackRecord"]["properties"]["adversary"]),
    (Observer, DEFS["PrivacyClaim"]["properties"]["adversary"]),
    (Observer, DEFS["AdversaryClaim"]["properties"]["adversary"]),
    (Relation, DEFS["PrivacyClaim"]["properties"]["relation"]),
    (Relation, DEFS["AdversaryClaim"]["properties"]["relation"]),
    (Unit, DEFS["PrivacyClaim"]["properties"]["unit"]),
]


@pytest.mark.parametrize("words, schema", PUBLISHED, ids=[f"{w.__name__}-{i}" for i, (w, _) in enumerate(PUBLISHED)])
def test_each_enum_has_exactly_the_schemas_values_in_its_order(words, schema):
    assert [member.value for member in words] == _enum(schema)


def test_the_membership_units_are_the_schemas():
    assert list(MEMBERSHIP_UNITS) == _enum(DEFS["AuditInfo"]["properties"]["membership_unit"])


def test_the_verdict_precedence_is_the_order_the_schema_lists_statuses_in():
    """The experiment's status is the most serious verdict: the schema lists them most serious first."""
    from reports.soundness import PRECEDENCE

    assert [s.value for s in PRECEDENCE] == DEFS["Verdict"]["properties"]["status"]["enum"]


EVERY_MEMBER = [member for words in (Unit, Relation, Observer, Observation, VerdictStatus, EpsilonKind, VerdictKind)
                for member in words]


def _written_as_its_value(member) -> None:
    value = member.value
    assert type(value) is str
    assert str(member) == value and f"{member}" == value and format(member, "") == value and "%s" % member == value  # noqa: UP031 (the %-format path)
    assert f"{member:>40}" == f"{value:>40}"
    assert json.dumps(member) == json.dumps(value) and json.dumps({member: [member]}) == json.dumps({value: [value]})
    written, expected = io.StringIO(), io.StringIO()
    csv.writer(written).writerow([member])
    csv.writer(expected).writerow([value])
    assert written.getvalue() == expected.getvalue()


@pytest.mark.parametrize("member", EVERY_MEMBER, ids=str)
def test_a_member_is_written_as_its_plain_value(member):
    _written_as_its_value(member)


@pytest.mark.parametrize("member", EVERY_MEMBER, ids=str)
def test_a_member_is_interchangeable_with_its_string(member):
    """Equal, same hash (a dict keyed by the string finds the member and back), same sort order."""
    value = member.value
    assert member == value and hash(member) == hash(value)
    assert {value: 1}[member] == 1 and {member: 1}[value] == 1
    assert type(member)(value) is member


def test_sorting_mixed_members_and_strings_is_sorting_their_values():
    words = [Observer.SERVER, "local", Observer.RELEASED, "none"]
    assert [str(w) for w in sorted(words)] == sorted(str(w) for w in words)


class _Words310(StrEnum310):
    FINAL_MODEL = "final model"
    AGGREGATE = "aggregate, participation known"


@pytest.mark.parametrize("member", list(_Words310), ids=str)
def test_the_python_310_base_writes_plain_values_too(member):
    """Python 3.10 has no enum.StrEnum: the module's own base must behave the same (run on any version)."""
    _written_as_its_value(member)
    assert member == member.value and hash(member) == hash(member.value)
