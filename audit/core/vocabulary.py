"""The project's words: the closed sets of names a claim, an audit and a verdict speak in.

Each set is a :class:`StrEnum` whose values are the strings ``results.json``, ``results.csv``
and the report write (``reports/schema/results.schema.json`` lists them as ``enum``s): a member
*is* its string — it compares, hashes, sorts, formats and serialises as the plain value — so a
name is written once, here, and misspelling it is an ``AttributeError`` instead of a silent
mismatch.

* :class:`Unit` — what neighbouring datasets differ in: one client, one record, one weight of
  an upload (local DP), or nothing (no claim).
* :class:`Relation` — the neighbouring relation: one unit added or removed, one unit's data
  replaced, or one unit's data replaced by data that contributes nothing, its participation
  known (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021, §2).
* :class:`Observer` — who sees what the guarantee protects: the released models, the server,
  one upload alone.
* :class:`Observation` — what an audit's test statistic reads.
* :class:`AttackKind` — what an attack reads and how its result is scored.
* :class:`VerdictStatus` — what a verdict says of one ε figure against the claim, most serious
  first (:mod:`reports.soundness`).
"""

from __future__ import annotations

import enum
import sys


class StrEnum310(str, enum.Enum):
    """:class:`enum.StrEnum` (Python 3.11) for Python 3.10: a member is its value for str(),
    format() and f-strings (a plain ``(str, Enum)`` mixin would print ``Unit.CLIENT``); JSON and
    csv write the string itself either way."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str(self), format_spec)


if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    StrEnum = StrEnum310


class Unit(StrEnum):
    """What two neighbouring datasets differ in."""

    CLIENT = "client"
    RECORD = "record"
    WEIGHT = "weight"
    NONE = "none"


#: the units a membership audit includes at random (a run's inclusion coins)
MEMBERSHIP_UNITS: tuple[Unit, ...] = (Unit.RECORD, Unit.CLIENT)


class Relation(StrEnum):
    """The neighbouring relation of a claim, or of an audit's design (what one inclusion coin changes)."""

    ADD_REMOVE = "add-remove"
    REPLACE_ONE = "replace-one"
    ZERO_OUT = "zero-out"
    NONE = "none"


class Observer(StrEnum):
    """Who an (ε, δ) figure protects against."""

    RELEASED = "released"
    SERVER = "server"
    LOCAL = "local"


class Observation(StrEnum):
    """What an audit's test statistic reads."""

    FINAL_MODEL = "final model"
    ALL_ITERATES = "all iterates"
    EACH_UPLOAD = "each upload"
    AGGREGATE = "aggregate, participation known"
    EVERY_STEP = "every local step"  # white box: each local DP-SGD step's noisy gradient, participation hidden


class AttackKind(StrEnum):
    """What an attack reads and how its result is scored."""

    MEMBERSHIP = "membership"  # scores per unit of the membership runs; ROC metrics and ε bounds
    CANARY = "canary"  # canaries planted in runs of its own; one-run ε bounds over the coins
    RUN = "run"  # one trained run (inversion, attribute inference); metrics of its own


class VerdictStatus(StrEnum):
    """A verdict on one figure against the claim, most serious first (the order an experiment's status is chosen in)."""

    VIOLATION = "violation"
    ESTIMATE_ABOVE = "estimate above claim"
    CONSISTENT = "consistent"
    INCONCLUSIVE = "inconclusive"
    NOT_COVERED = "not covered"
    VACUOUS = "vacuous"
    NO_CLAIM = "no claim"
    NO_MEASUREMENT = "no measurement"


class EpsilonKind(StrEnum):
    """What an ε figure is: a confidence lower bound, or an estimate (which is not a bound)."""

    LOWER_BOUND = "lower_bound"
    ESTIMATE = "estimate"


class VerdictKind(StrEnum):
    """What a verdict judges: an ε figure, the uploads' conformance with the claimed mechanism, or
    a parametric test of the claimed μ on Gaussian-by-construction canary statistics."""

    LOWER_BOUND = "lower_bound"
    ESTIMATE = "estimate"
    CONFORMANCE = "conformance"
    PARAMETRIC = "parametric"


class ConformanceStatus(StrEnum):
    """What the mechanism audit says of a defense, or of one observer's claim: its releases carry
    the claimed clip and noise, they do not, the defense claims nothing, or it cannot be checked."""

    CONFORMS = "conforms"
    VIOLATES = "violates"
    NOT_APPLICABLE = "not applicable"
    NO_PROBE = "no probe"
    UNCHECKED = "unchecked"
