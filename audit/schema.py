"""Validate plain mappings (parsed YAML) into typed dataclasses, with one-line errors.

A dataclass *is* the schema: field names, type annotations (``int``, ``float``, ``bool``,
``str``, ``Literal[...]``, ``X | None``, ``list[X]``, ``dict``, nested dataclasses, unions of
these) and ``field(metadata={"min": .., "max": .., "min_exclusive": .., "help": ..})``.
Errors name the full field path and the allowed values, e.g.

    training.rouns: unknown field; allowed: rounds, sampling, ...
    defenses[1].params.noise_placement: 'clients' is not allowed; allowed: client, aggregate
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from audit.errors import UserInputError

T = TypeVar("T")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def describe(tp: Any) -> str:
    """A reader's name for a type annotation."""
    origin = get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is dict or origin is dict:
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {describe(get_args(tp)[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(tp) if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _check_range(value: float, metadata: typing.Mapping[str, Any], path: str) -> None:
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None:
        if metadata.get("min_exclusive") and not value > low:
            raise UserInputError(f"{path}: must be > {low}, got {value}")
        if not metadata.get("min_exclusive") and not value >= low:
            raise UserInputError(f"{path}: must be >= {low}, got {value}")
    if high is not None:
        if metadata.get("max_exclusive") and not value < high:
            raise UserInputError(f"{path}: must be < {high}, got {value}")
        if not metadata.get("max_exclusive") and not value <= high:
            raise UserInputError(f"{path}: must be <= {high}, got {value}")


def coerce(tp: Any, value: Any, path: str, metadata: typing.Mapping[str, Any] | None = None) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in canonical form."""
    metadata = metadata or {}
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise UserInputError(f"{path}: must be {describe(tp)}, got null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(option, value, path, metadata)
            except UserInputError as exc:
                errors.append(str(exc))
        if len(errors) == 1:
            raise UserInputError(errors[0])
        raise UserInputError(f"{path}: must be {describe(tp)}, got {value!r}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise UserInputError(f"{path}: {value!r} is not allowed; allowed: {', '.join(str(a) for a in allowed)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserInputError(f"{path}: must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(f"{path}: must be an integer, got {value!r}")
        _check_range(value, metadata, path)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise UserInputError(f"{path}: must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"{path}: must be a number, got {value!r}")
        value = float(value)
        if math.isnan(value):
            raise UserInputError(f"{path}: must be a number, got NaN")
        _check_range(value, metadata, path)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise UserInputError(f"{path}: must be a string, got {value!r}")
        if "choices" in metadata and value not in metadata["choices"]:
            raise UserInputError(f"{path}: '{value}' is not allowed; allowed: {', '.join(metadata['choices'])}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise UserInputError(f"{path}: must be a mapping, got {value!r}")
        return dict(value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserInputError(f"{path}: must be a list, got {value!r}")
        item_type = get_args(tp)[0]
        items = [coerce(item_type, v, f"{path}[{i}]", metadata) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, path)
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def from_mapping(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown fields and bad values."""
    if data is None:
        data = {}
    if dataclasses.is_dataclass(data) and isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise UserInputError(f"{path or 'config'}: must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise UserInputError(f"{_join(path, str(key))}: unknown field; allowed: {', '.join(fields)}")
    values = {}
    for name, spec in fields.items():
        if name in data:
            values[name] = coerce(hints[name], data[name], _join(path, name), spec.metadata)
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise UserInputError(f"{_join(path, name)}: required field is missing")
    return cls(**values)


def to_mapping(instance: Any) -> Any:
    """A dataclass (nested) back to plain data: the inverse of :func:`from_mapping`."""
    if dataclasses.is_dataclass(instance):
        return {f.name: to_mapping(getattr(instance, f.name)) for f in dataclasses.fields(instance)}
    if isinstance(instance, (list, tuple)):
        return [to_mapping(v) for v in instance]
    if isinstance(instance, dict):
        return {k: to_mapping(v) for k, v in instance.items()}
    return instance


def field_help(cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, type description, default, help) of each field, for documentation and ``list``."""
    hints = get_type_hints(cls)
    rows = []
    for spec in dataclasses.fields(cls):
        default = spec.default if spec.default is not dataclasses.MISSING else (
            spec.default_factory() if spec.default_factory is not dataclasses.MISSING else None)
        rows.append((spec.name, describe(hints[spec.name]), to_mapping(default), spec.metadata.get("help", "")))
    return rows
