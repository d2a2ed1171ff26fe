"""Validate plain mappings (parsed YAML) into typed dataclasses, with one-line errors.

A dataclass *is* the schema: field names, type annotations (``int``, ``float``, ``bool``,
``str``, ``Literal[...]``, ``X | None``, ``list[X]``, ``dict``, nested dataclasses, unions of
these) and ``field(metadata={"min": .., "max": .., "min_exclusive": .., "help": ..})``.
Errors name the full field path and the allowed values, e.g.

    training.rouns: unknown field; allowed: rounds, sampling, ...
    defenses[1].params.noise_placement: 'clients' is not allowed; allowed: client, aggregate

Why not pydantic: we tried pydantic v2 models for the config and kept this module. Strict mode
refuses nested sections, and lax mode accepts ``true`` for a float and ``'8'`` for an int (both
errors here); its errors come in another order and one per union member (rebuilding today's
one-line messages takes more code than this module); ``section: null`` ("the defaults") is refused;
validating on every construction breaks ``dataclasses.replace`` of a section; and the same
validator also checks every defense's and attack's ``Params`` dataclass, plugins' included, and
the results document (:mod:`audit.core.typed_json`, whose JSON Schema and bytes must not change).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from audit.core.errors import UserInputError

T = TypeVar("T")

#: longest list any field accepts unless its metadata says otherwise (a config is not a data file)
MAX_LIST = 10_000
#: largest integer a field accepts unless its metadata says otherwise: counts of iterations,
#: queries, epochs … beyond this are typos, and refusing them beats a run that never ends
MAX_INT = 1_000_000
#: largest magnitude a number accepts unless its metadata says otherwise: training computes in
#: float32 (largest ≈ 3.4e38), where a learning rate or noise multiplier of 1e308 overflows with an
#: error instead of a result; up to this bound a run that blows up ends as a diverged result
MAX_FLOAT = 1e30
#: longest text a field accepts unless its metadata says otherwise (``max_chars``): a path or a
#: ``file.py:callable`` reference fits (PATH_MAX); text this long is a mistake or an attack
MAX_TEXT = 4096
#: longest name shown in reports, tables and figures (labels, a policy rule's name)
MAX_LABEL = 200


def check_text(value: str, path: str, limit: int = MAX_TEXT) -> str:
    """Refuse text longer than ``limit`` characters or holding a NUL (no file name, label or
    reference has one, and C-based readers cut the text there); returns it."""
    if len(value) > limit:
        raise UserInputError(f"{path}: {len(value)} characters; allowed: up to {limit} characters")
    if "\0" in value:
        raise UserInputError(f"{path}: contains a NUL character; allowed: text without NUL")
    return value


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
    allowed = f"; allowed: {describe_range(metadata)}"
    if low is not None:
        if metadata.get("min_exclusive") and not value > low:
            raise UserInputError(f"{path}: must be > {low}, got {value}{allowed}")
        if not metadata.get("min_exclusive") and not value >= low:
            raise UserInputError(f"{path}: must be >= {low}, got {value}{allowed}")
    if high is not None:
        if metadata.get("max_exclusive") and not value < high:
            raise UserInputError(f"{path}: must be < {high}, got {value}{allowed}")
        if not metadata.get("max_exclusive") and not value <= high:
            raise UserInputError(f"{path}: must be <= {high}, got {value}{allowed}")


def _allowed(tp: Any, metadata: typing.Mapping[str, Any]) -> str:
    """The '; allowed: …' tail of a type error: the type and its range, e.g. 'a number, 0 < x ≤ 1'."""
    span = describe_range(metadata, tp) if tp is not bool else ""
    if tp is str and "choices" in metadata:
        return f"; allowed: {', '.join(metadata['choices'])}"
    return f"; allowed: {describe(tp)}" + (f", {span}" if span else "")


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
            raise UserInputError(f"{path}: must be {describe(tp)}, got null{_allowed(tp, metadata)}")
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
        raise UserInputError(f"{path}: must be {describe(tp)}, got {value!r}{_allowed(tp, metadata)}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise UserInputError(f"{path}: {value!r} is not allowed; allowed: {', '.join(str(a) for a in allowed)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserInputError(f"{path}: must be true or false, got {value!r}; allowed: true, false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(f"{path}: must be an integer, got {value!r}{_allowed(tp, {'max': MAX_INT, **metadata})}")
        _check_range(value, {"max": MAX_INT, **metadata}, path)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise UserInputError(f"{path}: must be a number, got {value!r}{_allowed(tp, metadata)}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"{path}: must be a number, got {value!r}{_allowed(tp, metadata)}")
        value = float(value)
        if math.isnan(value):
            raise UserInputError(f"{path}: must be a number, got NaN{_allowed(tp, metadata)}")
        if math.isinf(value) and not metadata.get("allow_inf"):
            raise UserInputError(f"{path}: must be a finite number, got {value}{_allowed(tp, metadata)}")
        if math.isfinite(value):
            _check_range(value, {"min": -MAX_FLOAT, "max": MAX_FLOAT, **metadata}, path)
        else:
            _check_range(value, metadata, path)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise UserInputError(f"{path}: must be a string, got {value!r}{_allowed(tp, metadata)}")
        check_text(value, path, metadata.get("max_chars", MAX_TEXT))
        if "choices" in metadata and value not in metadata["choices"]:
            raise UserInputError(f"{path}: '{value}' is not allowed; allowed: {', '.join(metadata['choices'])}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise UserInputError(f"{path}: must be a mapping, got {value!r}; allowed: a mapping")
        return dict(value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserInputError(f"{path}: must be a list, got {value!r}{_allowed(tp, metadata)}")
        if len(value) < metadata.get("min_length", 0):
            raise UserInputError(f"{path}: must list at least {metadata['min_length']} value(s), got an empty list; "
                                 f"allowed: a list of {metadata['min_length']} or more")
        if len(value) > metadata.get("max_length", MAX_LIST):
            raise UserInputError(f"{path}: at most {metadata.get('max_length', MAX_LIST)} values, got {len(value)}")
        item_type = get_args(tp)[0]
        items = [coerce(item_type, v, f"{path}[{i}]", metadata) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return from_mapping(typing.cast(type, tp), value, path)
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


def describe_range(metadata: typing.Mapping[str, Any], tp: Any = None) -> str:
    """The documented range of a numeric field, e.g. ``1 ≤ x ≤ 100000`` or ``x > 0`` ('' if none)."""
    low, high = metadata.get("min"), metadata.get("max")
    if high is None and _is_int(tp):
        high = MAX_INT
    elif high is None and _is_float(tp) and not metadata.get("allow_inf"):
        high = MAX_FLOAT
    parts = []
    if low is not None:
        parts.append(f"{_number(low)} {'<' if metadata.get('min_exclusive') else '≤'} ")
    parts.append("x")
    if high is not None:
        parts.append(f" {'<' if metadata.get('max_exclusive') else '≤'} {_number(high)}")
    text = "".join(parts)
    return "" if text == "x" else text


def _is_int(tp: Any) -> bool:
    return tp is int or (get_origin(tp) in (Union, types.UnionType, list) and any(_is_int(a) for a in get_args(tp)))


def _is_float(tp: Any) -> bool:
    return tp is float or (get_origin(tp) in (Union, types.UnionType, list) and any(_is_float(a) for a in get_args(tp)))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e21 else f"{value:g}"


def _default(spec: dataclasses.Field) -> Any:
    """A field's default value (its factory called), or None when it has none."""
    if spec.default is not dataclasses.MISSING:
        return spec.default
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else None


def field_reference(cls: type, path: str = "") -> list[dict[str, Any]]:
    """Every field of ``cls`` and its nested dataclasses: path, type, default, range, help."""
    hints = get_type_hints(cls)
    rows = []
    for spec in dataclasses.fields(cls):
        tp = hints[spec.name]
        full = _join(path, spec.name)
        nested = typing.cast("type | None", next((a for a in (tp, *get_args(tp)) if dataclasses.is_dataclass(a)), None))
        if nested is not None and get_origin(tp) is not list:
            rows.extend(field_reference(nested, full))
            continue
        default = _default(spec)
        rows.append({"field": full + ("[]" if get_origin(tp) is list and nested else ""), "type": describe(tp),
                     "default": to_mapping(default), "range": describe_range(spec.metadata, tp),
                     "help": spec.metadata.get("help", "")})
        if nested is not None:
            rows.extend(field_reference(nested, full + "[]"))
    return rows


def field_help(cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, type description, default, help) of each field, for documentation and ``list``."""
    hints = get_type_hints(cls)
    rows = []
    for spec in dataclasses.fields(cls):
        default = _default(spec)
        span = describe_range(spec.metadata, hints[spec.name])
        rows.append((spec.name, describe(hints[spec.name]) + (f", {span}" if span else ""), to_mapping(default),
                     spec.metadata.get("help", "")))
    return rows


def check_options(function: Any, options: dict[str, Any], path: str) -> dict[str, Any]:
    """``options`` (keyword arguments from a config) checked against the annotations of the
    loader or factory ``function`` that takes them, as :func:`coerce` checks a field: a YAML list
    where a string belongs (``split: [letters]``) or ``hidden: [.inf]`` is a one-line error
    naming ``path.<option>``, not a TypeError deep inside the function. Options without an
    annotation this schema understands (``Sequence``, a plugin's own types) pass unchecked."""
    if not inspect.isfunction(function):  # a class's hints are its attributes', not its parameters'
        return dict(options)
    try:
        hints = get_type_hints(function)
    except Exception:  # a plugin's annotations may name types that do not resolve here
        return dict(options)
    checked = dict(options)
    for key, value in options.items():
        if key not in hints:
            continue
        try:
            checked[key] = coerce(hints[key], value, _join(path, key))
        except TypeError:  # an annotation coerce does not support
            continue
    return checked
