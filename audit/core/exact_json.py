"""Values as JSON that reads back exactly: the same types, the same bits — never a pickle.

The stage cache (:mod:`audit.stage_cache`) keeps what an attack or a diagnostic computed and must
give back a value the later stages treat exactly as the one computed: a ``numpy.float32`` stays a
``float32``, a tuple a tuple, NaN and ±inf stay themselves, an enum member its member. Plain JSON
loses all of these (:func:`audit.core.atomic.json_safe` maps NaN to ``null``), and ``pickle`` runs
whatever code a tampered file names. Here every value outside JSON's own is a small tagged object:

* ``{"$float": "nan" | "inf" | "-inf"}`` — a non-finite Python float;
* ``{"$scalar": dtype, "value": v}`` and ``{"$array": dtype, "shape": [...], "values": [...]}`` —
  numpy booleans, integers and floats only (``dtype`` as ``numpy.dtype.str``, e.g. ``"<f4"``);
* ``{"$tuple": [...]}``, ``{"$enum": name, "value": v}`` and ``{"$dataclass": name, "fields": {...}}``.

Decoding builds only the classes it is given (:func:`allowed_types`: the dataclasses and enums
a root type's annotations reach) and the loaded subclasses of those dataclasses; any other name,
dtype or shape is a :class:`NotExact` error, never an import. Values this cannot say exactly (an
object of another class, a dict with a key that is not a string or begins with ``$``) raise
:class:`NotExact` when encoded: the caller keeps no copy of them rather than an approximate one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

#: numpy kinds kept: booleans, signed and unsigned integers, floats (no objects, strings, dates)
_KINDS = frozenset("biuf")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class NotExact(ValueError):
    """A value this JSON cannot hold exactly, or a document that is not one it wrote."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode(value: Any) -> Any:
    """``value`` as plain JSON values (see the module docstring); :class:`NotExact` if it cannot be."""
    if value is None or type(value) in (bool, str, int):  # not their subclasses: a string enum is an enum
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _KINDS:
            raise NotExact(f"an array of dtype {value.dtype}")
        return {"$array": value.dtype.str, "shape": list(value.shape), "values": [encode(v) for v in value.ravel().tolist()]}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _KINDS:
            raise NotExact(f"a numpy scalar of dtype {value.dtype}")
        return {"$scalar": value.dtype.str, "value": encode(value.item())}
    if isinstance(value, enum.Enum):
        return {"$enum": _name(type(value)), "value": encode(value.value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        if any(not spec.init for spec in fields):
            raise NotExact(f"{_name(type(value))} has fields its constructor does not take")
        return {"$dataclass": _name(type(value)), "fields": {spec.name: encode(getattr(value, spec.name)) for spec in fields}}
    if isinstance(value, tuple) and type(value) is tuple:
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list) and type(value) is list:
        return [encode(v) for v in value]
    if isinstance(value, dict) and type(value) is dict:
        if not all(isinstance(k, str) and not k.startswith("$") for k in value):
            raise NotExact("a dict whose keys are not all strings without a leading '$'")
        return {k: encode(v) for k, v in value.items()}
    raise NotExact(f"a value of type {_name(type(value))}")


def _dtype(text: Any) -> np.dtype:
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _KINDS:
        raise NotExact(f"dtype {text!r} is not one this JSON writes")
    return dtype


def decode(value: Any, allowed: Mapping[str, type]) -> Any:
    """The value :func:`encode` wrote as ``value``, building only the classes in ``allowed``
    (name → class, :func:`allowed_types`); :class:`NotExact` for anything else."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, list):
        return [decode(v, allowed) for v in value]
    if not isinstance(value, dict):
        raise NotExact(f"a JSON value of type {type(value).__name__}")
    tags = [k for k in value if k.startswith("$")]
    if not tags:
        return {k: decode(v, allowed) for k, v in value.items()}
    tag = tags[0]
    try:
        if tag == "$float" and set(value) == {"$float"}:
            return _NON_FINITE[value["$float"]]
        if tag == "$tuple" and set(value) == {"$tuple"} and isinstance(value["$tuple"], list):
            return tuple(decode(v, allowed) for v in value["$tuple"])
        if tag == "$scalar" and set(value) == {"$scalar", "value"}:
            return _dtype(value["$scalar"]).type(decode(value["value"], allowed))
        if tag == "$array" and set(value) == {"$array", "shape", "values"}:
            shape = value["shape"]
            if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
                raise NotExact(f"array shape {shape!r}")
            values = [decode(v, allowed) for v in value["values"]]
            return np.array(values, dtype=_dtype(value["$array"])).reshape(shape)
        if tag in ("$enum", "$dataclass"):
            cls = allowed.get(value[tag]) or _subclass(value[tag], allowed)
            if cls is None:
                raise NotExact(f"class {value[tag]!r} is not one this document may build")
            if tag == "$enum" and set(value) == {"$enum", "value"} and issubclass(cls, enum.Enum):
                return cls(decode(value["value"], allowed))
            if tag == "$dataclass" and set(value) == {"$dataclass", "fields"} and dataclasses.is_dataclass(cls):
                fields = value["fields"]
                if not (isinstance(fields, dict) and set(fields) == {spec.name for spec in dataclasses.fields(cls)}):
                    raise NotExact(f"the fields of {value[tag]!r}")
                return cls(**{k: decode(v, allowed) for k, v in fields.items()})
    except (KeyError, TypeError, ValueError) as error:
        raise NotExact(f"{tag}: {error}") from None
    raise NotExact(f"an object tagged {tag!r} not as this JSON writes it")


def _subclass(name: Any, allowed: Mapping[str, type]) -> type | None:
    """A loaded subclass of an allowed class named ``name`` (a field annotated with a base may hold
    one); found among the classes Python already has, never imported."""
    seen: set[type] = set()
    pending = [cls for cls in allowed.values() if dataclasses.is_dataclass(cls)]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                if _name(sub) == name:
                    return sub
                seen.add(sub)
                pending.append(sub)
    return None


def _reached(annotation: Any, found: dict[str, type]) -> None:
    origin = typing.get_origin(annotation)
    if origin is not None or isinstance(annotation, types.UnionType):
        for argument in typing.get_args(annotation):
            _reached(argument, found)
        return
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        found[_name(annotation)] = annotation
    elif isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and _name(annotation) not in found:
        found[_name(annotation)] = annotation
        for hint in typing.get_type_hints(annotation).values():
            _reached(hint, found)


def allowed_types(roots: Iterable[type]) -> dict[str, type]:
    """The dataclasses and enums that ``roots`` and their fields' annotations reach (name → class):
    what :func:`decode` may build for documents of those types."""
    found: dict[str, type] = {}
    for root in roots:
        _reached(root, found)
    return found


def enums_in(module: types.ModuleType) -> list[type[enum.Enum]]:
    """The enums a module defines (e.g. :mod:`audit.core.vocabulary`), for :func:`allowed_types`
    where an annotation says ``str`` and the value is a string enum."""
    return [v for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, enum.Enum) and v.__module__ == module.__name__]
