"""Exact JSON (audit.core.exact_json): values read back with their types and bits; only the classes
a document may build are built; what cannot be said exactly is refused, not approximated."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from audit.core import exact_json, vocabulary
from audit.core.exact_json import NotExact, allowed_types, decode, encode
from audit.core.vocabulary import Relation


@dataclass(frozen=True)
class Inner:
    value: float
    relation: Relation = Relation.ADD_REMOVE


@dataclass
class Outer:
    inner: Inner
    items: dict[str, Inner] = field(default_factory=dict)
    pair: tuple[list[float], list[float]] = ((), ())
    scores: np.ndarray | None = None


@dataclass(frozen=True)
class Special(Inner):
    extra: int = 0


ALLOWED = allowed_types([Outer])


def _through_text(value):
    """Encoded, written as strict JSON text, read and decoded: what a cache entry goes through."""
    return decode(json.loads(json.dumps(encode(value), allow_nan=False)), ALLOWED)


def test_types_and_bits_survive():
    value = Outer(Inner(np.float32(0.1), Relation.REPLACE_ONE), {"a": Inner(math.nan), "b": Inner(-math.inf)},
                  ([0.1, 1e-300], [math.inf]), np.array([[1.5, np.nan], [0.25, -0.0]], dtype=np.float32))
    back = _through_text(value)
    assert type(back.inner.value) is np.float32 and back.inner.value == np.float32(0.1)
    assert back.inner.relation is Relation.REPLACE_ONE
    assert math.isnan(back.items["a"].value) and back.items["b"].value == -math.inf
    assert type(back.pair) is tuple and back.pair == ([0.1, 1e-300], [math.inf])
    assert back.scores.dtype == np.float32 and back.scores.shape == (2, 2)
    assert np.array_equal(back.scores, value.scores, equal_nan=True) and math.copysign(1, back.scores[1, 1]) == -1
    assert encode(back) == encode(value)


def test_integers_booleans_and_numpy_scalars_keep_their_types():
    value = [1, True, np.int64(2**62), np.bool_(True), np.uint8(7), np.array([], dtype=bool)]
    back = _through_text(value)
    assert [type(v) for v in back[:5]] == [int, bool, np.int64, np.bool_, np.uint8]
    assert back[2] == 2**62 and back[5].dtype == bool and back[5].shape == (0,)


def test_a_subclass_of_an_allowed_class_is_built_but_no_other_class():
    assert type(_through_text(Outer(Special(1.0, extra=2))).inner) is Special
    encoded = encode(Outer(Inner(1.0)))
    encoded["fields"]["inner"]["$dataclass"] = "os._wrap_close"  # a class that exists, but not one a document holds
    with pytest.raises(NotExact):
        decode(encoded, ALLOWED)
    with pytest.raises(NotExact):
        decode({"$array": "|O", "shape": [1], "values": [1]}, ALLOWED)  # object arrays: never
    with pytest.raises(NotExact):
        decode({"$float": "nan", "extra": 1}, ALLOWED)


def test_values_it_cannot_say_exactly_are_refused():
    for value in (object(), {1: "a"}, {"$float": 1.0}, np.array(["text"]), {1, 2}, np.datetime64("2020-01-01")):
        with pytest.raises(NotExact):
            encode(value)


def test_the_vocabulary_enums_are_found():
    assert {Relation, vocabulary.Unit, vocabulary.Observer} <= set(exact_json.enums_in(vocabulary))
