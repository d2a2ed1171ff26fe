"""Frozen dataclasses as JSON documents: one type gives the JSON value and the JSON Schema.

A document type is a tree of dataclasses whose annotations say what JSON holds: ``bool``,
``int``, ``float``, ``str``, ``Literal[...]``, a string enum (:mod:`audit.core.vocabulary`,
written as its values), ``X | None``, ``list[X]``, ``tuple[X, ...]`` (a JSON list),
``dict[str, X]``, ``dict`` / ``dict[str, Any]`` (any object) and nested dataclasses (``$defs``
named after the class). :func:`to_json` writes an instance as plain JSON values in
field order, :func:`from_json` reads a value that :func:`json_schema`'s schema accepted back into
the types, so the writer, the reader and the published schema cannot drift apart.

Field metadata (the keys the config schema uses, :mod:`audit.core.schema`, plus three):

* ``help`` — the field's ``description``; ``min`` / ``max`` — ``minimum`` / ``maximum``;
  ``choices`` — an ``enum`` for a string field (or the members an enum field allows);
* ``omit_if_none`` — the key is left out of the JSON while the value is ``None`` (an optional key);
* ``null_means`` — JSON ``null`` stands for this value of a non-optional field (JSON has no
  infinity: a claim's ε of ``math.inf`` is written ``null``);
* ``json_schema`` — a schema fragment merged over the generated one, for what an annotation
  cannot say (a constant, a required key of a free-form object).

A class may add ``__json_schema__`` (a mapping merged into its ``$defs`` entry) for constraints
between fields. Non-finite floats are written ``null``, as :func:`audit.core.atomic.json_safe` does.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_NULL = {"type": "null"}


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = get_type_hints(cls)
    return [(spec, hints[spec.name]) for spec in dataclasses.fields(cls)]  # type: ignore[arg-type]


def to_json(value: Any) -> Any:
    """``value`` (a document dataclass, or anything inside one) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for spec in dataclasses.fields(value):
            item = getattr(value, spec.name)
            if item is None and spec.metadata.get("omit_if_none"):
                continue
            out[spec.name] = to_json(item)
        return out
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, enum.Enum):
        return value.value
    return value


def from_json(tp: Any, value: Any, metadata: typing.Mapping[str, Any] | None = None) -> Any:
    """A JSON value that :func:`json_schema` ``(tp)`` accepts, as an instance of ``tp``.

    The value is trusted to be valid (validate first): this builds the types, it does not check."""
    metadata = metadata or {}
    origin = get_origin(tp)
    if value is None:
        return metadata.get("null_means")
    if dataclasses.is_dataclass(tp):
        return tp(**{spec.name: from_json(hint, value[spec.name], spec.metadata)  # type: ignore[operator]
                     for spec, hint in _fields(typing.cast(type, tp)) if spec.name in value})
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return from_json(options[0], value)
        structured = [a for a in options if dataclasses.is_dataclass(a) or get_origin(a) in (list, tuple, dict)]
        return from_json(structured[0], value) if len(structured) == 1 and isinstance(value, (dict, list)) else value
    if origin is tuple:
        return tuple(from_json(get_args(tp)[0], v) for v in value)
    if origin is list:
        return [from_json(get_args(tp)[0], v) for v in value]
    if origin is dict:
        key, item = get_args(tp)
        return {from_json(key, k): from_json(item, v) for k, v in value.items()}
    if _is_enum(tp):
        return tp(value)
    return value  # a number stays as JSON gave it (an int where one was written), so it writes back the same


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _merge(schema: dict[str, Any], extra: typing.Mapping[str, Any] | None) -> dict[str, Any]:
    return {**schema, **extra} if extra else schema


class _Builder:
    """Collects one ``$defs`` entry per dataclass reached from the root."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}

    def of(self, tp: Any, metadata: typing.Mapping[str, Any]) -> dict[str, Any]:
        origin = get_origin(tp)
        if tp is Any:
            return {}
        if origin in (Union, types.UnionType):
            options = [a for a in get_args(tp) if a is not type(None)]
            nullable = len(options) < len(get_args(tp))
            if len(options) == 1:
                inner = self.of(options[0], metadata)
                if not nullable:
                    return inner
                if set(inner) <= {"type", "minimum", "maximum"} and isinstance(inner.get("type"), str):
                    return {**inner, "type": [inner["type"], "null"]}
                return {"anyOf": [inner, _NULL]}
            return {"anyOf": [self.of(a, metadata) for a in options] + ([_NULL] if nullable else [])}
        if origin is Literal:
            return {"enum": list(get_args(tp))}
        if _is_enum(tp):  # ``choices``: the members a field allows, in the order its schema lists them
            return {"enum": [member.value for member in metadata.get("choices", tp)]}
        if tp is bool:
            return {"type": "boolean"}
        if tp in (int, float):
            schema: dict[str, Any] = {"type": "integer" if tp is int else "number"}
            if metadata.get("min") is not None:
                schema["minimum"] = metadata["min"]
            if metadata.get("max") is not None:
                schema["maximum"] = metadata["max"]
            if "null_means" in metadata:
                schema["type"] = [schema["type"], "null"]
            return schema
        if tp is str:
            return {"enum": list(metadata["choices"])} if "choices" in metadata else {"type": "string"}
        if origin in (list, tuple):
            return {"type": "array", "items": self.of(get_args(tp)[0], {})}
        if tp is dict:
            return {"type": "object"}
        if origin is dict:
            item = self.of(get_args(tp)[1], {})
            return {"type": "object", **({"additionalProperties": item} if item else {})}
        if dataclasses.is_dataclass(tp):
            return {"$ref": f"#/$defs/{self.define(typing.cast(type, tp))}"}
        raise TypeError(f"no JSON Schema for annotation {tp!r}")

    def define(self, cls: type) -> str:
        name = cls.__name__
        if name in self.defs:
            return name
        self.defs[name] = {}  # reserved first: a type may refer to itself
        properties, required = {}, []
        for spec, hint in _fields(cls):
            schema = self.of(hint, spec.metadata)
            if spec.metadata.get("help"):
                schema = {**schema, "description": spec.metadata["help"]}
            properties[spec.name] = _merge(schema, spec.metadata.get("json_schema"))
            if not spec.metadata.get("omit_if_none"):
                required.append(spec.name)
        body: dict[str, Any] = {"type": "object"}
        if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):  # not dataclass's generated signature
            body["description"] = " ".join(cls.__doc__.split())
        body.update(required=required, properties=properties, additionalProperties=False)
        self.defs[name] = _merge(body, getattr(cls, "__json_schema__", None))
        return name


def json_schema(root: type, **top: Any) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of documents :func:`to_json` writes from ``root``; ``top``
    (``$id``, ``title``, …) goes first in the schema."""
    builder = _Builder()
    name = builder.define(root)
    body = builder.defs.pop(name)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **top, **body, "$defs": builder.defs}
