"""The tidy results table and the files it is written to.

One row per (experiment, attack, metric) — long format, with these columns:

    run, dataset, defense, label, epsilon, delta, unit, accountant, seed, attack, metric, value, ci_low, ci_high

``run`` is the experiment key (a defense at one ε; its N membership runs are summarised);
``epsilon`` is the claimed headline ε (empty for non-private defenses); utility rows have attack
``none``; rows with attack ``claim`` give the claim per observer (metric ``epsilon_released``,
``epsilon_server``, ``epsilon_local``; an empty value: not covered). Missing intervals are empty
cells.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pandas as pd

from audit.core.atomic import dumps, update_text
from audit.core.errors import UserInputError
from audit.core.typed_json import from_json, to_json
from audit.core.visible_text import spell_out
from reports.document import SCHEMA_VERSION, AuditInfo, Experiment, Results, Row, results_schema

#: the versions ``load_results`` reads: only the one this code writes. 1.x is another layout; 2.0
#: lacks the claims per observer (the claim's ``relation``, ``adversary``, ``adversaries``), which
#: the HTML report needs. Any other version is refused rather than misread.
#: 2.2 lacks only the "conformance" verdict kind and 2.3 only the "parametric" one: every 2.2 or
#: 2.3 document is a valid 2.4 one
READABLE_SCHEMA_VERSIONS = ("2.2", "2.3", SCHEMA_VERSION)
COLUMNS = [f.name for f in fields(Row)]


def rows_from_results(audit: AuditInfo, experiments: list[Experiment]) -> list[Row]:
    rows = []
    for experiment in experiments:
        claim = experiment.claim
        row = functools.partial(
            Row, run=experiment.key, dataset=audit.dataset, defense=experiment.defense, label=experiment.label,
            epsilon=claim.epsilon if claim.is_private else None, delta=claim.delta, unit=claim.unit,
            accountant=claim.accountant, seed=audit.seed)
        for entry in claim.adversaries:  # the claim per observer; an empty value: not covered
            rows.append(row(attack="claim", metric=f"epsilon_{entry.adversary}",
                            value=entry.epsilon if entry.covered else None, ci_low=None, ci_high=None))
        for metric in fields(experiment.utility):
            estimate = getattr(experiment.utility, metric.name)
            rows.append(row(attack="none", metric=metric.name, value=estimate.value, ci_low=estimate.ci_low,
                            ci_high=estimate.ci_high))
        for attack in experiment.attacks:
            for name, result in attack.metrics.items():
                rows.append(row(attack=attack.attack, metric=name, value=result.value, ci_low=result.ci_low,
                                ci_high=result.ci_high))
        if experiment.diverged is not None:  # where it diverged: attack "training"
            where = experiment.diverged
            for name, value in (("diverged_run", where.run), ("diverged_at_round", where.round)):
                rows.append(row(attack="training", metric=name, value=value, ci_low=None, ci_high=None))
    return rows


#: the table's column types: text, a float (an empty cell is NaN), or the integer seed
TEXT_COLUMNS = [f.name for f in fields(Row) if f.type == "str"]
FLOAT_COLUMNS = [f.name for f in fields(Row) if f.type == "float | None"]


#: what a spreadsheet would evaluate as a formula at the start of a cell
FORMULA_LEADS = ("=", "+", "-", "@")
#: C0 control characters but the newline (which the CSV quotes), and DEL
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f]")


def csv_cell(text: str) -> str:
    """A text cell as results.csv writes it: control characters spelled out as ``\\xNN`` (a raw
    carriage return would split the row, a leading tab start a formula), then an apostrophe in
    front of a cell that begins with =, +, - or @ — the spreadsheets' mark for "text, not a
    formula" (OWASP's rule for CSV injection). Numbers are written as numbers; results.json keeps
    every text as it is."""
    text = spell_out(text, _CONTROL)
    return "'" + text if text.startswith(FORMULA_LEADS) else text


def _rows_frame(results: Results) -> pd.DataFrame:
    # the rows as they are, not as JSON: a one-sided bound's ci_high of +inf is written "inf" in the CSV
    return pd.DataFrame([asdict(row) for row in results.rows], columns=COLUMNS)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype({name: "float64" for name in FLOAT_COLUMNS} | {"seed": "int64"})
    for name in TEXT_COLUMNS:  # plain strings (the vocabulary's enums are their values); an empty cell is ""
        frame[name] = [("" if value is None or value != value else str(value)) for value in frame[name]]
    return frame[COLUMNS]


def _csv_frame(file: Path) -> pd.DataFrame:
    try:
        # every cell as text, numbers parsed by Python (exact for the shortest repr the CSV holds,
        # whatever pandas' own float parser does); an empty number is NaN, "inf" infinity
        frame = pd.read_csv(file, dtype=str, keep_default_na=False)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, ValueError) as error:
        raise UserInputError(f"results: '{file}': not a results.csv of `dpfl-audit run` ({error})") from None
    if list(frame.columns) != COLUMNS:
        raise UserInputError(f"results: '{file}': columns {list(frame.columns)}; a results.csv has {COLUMNS}")
    try:
        for name in FLOAT_COLUMNS:
            frame[name] = [float(cell) if cell else math.nan for cell in frame[name]]
        frame["seed"] = [int(cell) for cell in frame["seed"]]
        return _typed(frame)
    except (TypeError, ValueError) as error:
        raise UserInputError(f"results: '{file}': {error}") from None


def results_frame(source: Any) -> pd.DataFrame:
    """The results table (one row per experiment, attack and metric; the columns of ``results.csv``)
    as a pandas DataFrame, from any of:

    * an output folder of ``dpfl-audit run`` (its ``results.json``, else its ``results.csv``),
    * the path of a ``results.json`` (read strictly, as ``dpfl-audit check`` does) or a ``results.csv``,
    * a results document (:class:`reports.document.Results`, or its JSON as a dict),
    * what :func:`audit.audit` returns (an ``AuditOutcome``; its ``.frame`` is this table).

    Text columns hold strings, ``epsilon``, ``delta``, ``value``, ``ci_low`` and ``ci_high`` floats
    (an empty cell of ``results.csv`` is NaN, a one-sided bound's ``ci_high`` is ``inf``) and
    ``seed`` integers: the frame equals ``pandas.read_csv("results.csv")`` of the same audit."""
    if isinstance(source, Results):
        return _typed(_rows_frame(source))
    if isinstance(source, dict):
        validate_results(source, "results")
        return results_frame(from_json(Results, source))
    if isinstance(source, (str, Path)):
        path = Path(source)
        csv_file = path / "results.csv" if path.is_dir() else path
        if path.suffix.lower() == ".csv" or (path.is_dir() and not (path / "results.json").exists() and csv_file.is_file()):
            if not csv_file.is_file():
                raise UserInputError(f"results: '{path}' does not exist; give an output directory of `dpfl-audit run`, "
                                     "its results.json or its results.csv")
            return _csv_frame(csv_file)
        return results_frame(load_results(path)[0])
    results = getattr(source, "results", None)  # an audit's outcome
    if isinstance(results, Results):
        return results_frame(results)
    if hasattr(source, "results"):
        raise UserInputError("results: this audit wrote no results (it trained without attacking: attack=False)")
    raise UserInputError(f"results: expected an output folder, a results.json or results.csv path, a results "
                         f"document or an audit's outcome; got {type(source).__name__}")


def write_results(results: Results, out: Path) -> dict[str, str]:
    """Write ``results.csv`` and ``results.json`` atomically (a file that already holds the same
    bytes is left as it is); returns their paths."""
    csv_path, json_path = Path(out) / "results.csv", Path(out) / "results.json"
    frame = _rows_frame(results)
    for name in TEXT_COLUMNS:
        frame[name] = [csv_cell(value) if isinstance(value, str) else value for value in frame[name]]
    update_text(csv_path, frame.to_csv(index=False, lineterminator="\n"))
    update_text(json_path, dumps(to_json(results)) + "\n")
    return {"results_csv": str(csv_path), "results_json": str(json_path)}


#: the largest integer read back: the code writes counts and seeds, which are at most 2⁶⁴ − 1; a
#: larger one (Python refuses even to convert more than 4300 digits, with a ValueError that is no
#: JSON error) would reach numpy as an object, not a number
MAX_INTEGER = 2**64 - 1


class _NumberError(ValueError):
    """A JSON number this code never writes (raised from the parser's hooks, caught in :func:`_read_json`)."""


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > len(str(MAX_INTEGER)) or abs(int(text)) > MAX_INTEGER:  # the length first: int() of 5000 digits fails
        shown = text if len(text) <= 24 else f"{text[:12]}… ({digits} digits)"
        raise _NumberError(f"holds the integer {shown}; allowed: integers of magnitude at most 2^64 - 1")
    return int(text)


def _lone_surrogate(document: Any) -> str | None:
    """The first string (key or value) holding a lone surrogate ("\\ud800" is valid JSON but no
    text: it cannot be written to report.html or drawn), or None. Iterative: documents nest deeply."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return value
    return None


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NumberError(f"holds the number {text[:40]}, beyond the largest float; allowed: finite numbers")
    return value


def _no_constant(text: str) -> float:
    # the writer refuses NaN and ±Infinity (json.dumps(allow_nan=False)); a reader must not accept them
    raise _NumberError(f"holds {text}, which JSON does not allow; allowed: finite numbers (null for a missing one)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (a parser would keep one of two silently)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _NumberError(f"gives the key {json.dumps(twice)[:60]} twice in one object; allowed: each key once")
    return document


def _read_json(file: Path, option: str) -> Any:
    """A stored JSON file, strictly: UTF-8 text holding one JSON value of finite numbers (as the code
    writes them: no NaN or Infinity, no integer of thousands of digits), no key given twice in an
    object; any failure is one line."""
    try:
        text = file.read_bytes().decode("utf-8")
        document = json.loads(text, parse_int=_integer, parse_float=_finite, parse_constant=_no_constant,
                              object_pairs_hook=_unique_keys)
        broken = _lone_surrogate(document)
        if broken is not None:
            raise UserInputError(f"{option}: '{file}' holds the string {ascii(broken[:40])} with a lone surrogate "
                                 "escape (\\ud800-\\udfff alone); allowed: text that is valid Unicode")
        return document
    except _NumberError as exc:
        raise UserInputError(f"{option}: '{file}' {exc}") from None
    except OSError as exc:
        raise UserInputError(f"{option}: cannot read '{file}' ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{option}: '{file}' is not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                             "is it a file written by `dpfl-audit run`?") from None
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{option}: '{file}' is not valid JSON: {exc.msg} at line "
                             f"{exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise UserInputError(f"{option}: '{file}' is not a readable JSON document: nested too deeply") from None


def _json_path(parts) -> str:
    """``experiments[0].attacks[2].metrics['tpr_at_fpr_1%'].value`` from a path of keys and indices."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text or "the document"


def _shown(value: Any) -> str:
    """A value as an error message shows it: scalars literally (strings quoted, cut short), containers by kind."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


_TYPE_NAMES = {"number": "a number", "integer": "an integer", "string": "a string", "array": "a list",
               "object": "an object", "boolean": "true or false", "null": "null"}


def _schema_problem(error) -> str:
    """One ``jsonschema`` error as ``<JSON path>: <what is wrong; allowed values>``."""
    parts, kind, expected, value = list(error.absolute_path), error.validator, error.validator_value, error.instance
    if kind == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        return f"{_json_path(parts)}: must be {' or '.join(_TYPE_NAMES.get(n, n) for n in names)}, got {_shown(value)}"
    if kind == "required":
        missing = next(name for name in expected if name not in value)
        return f"{_json_path([*parts, missing])}: missing"
    if kind == "additionalProperties" and expected is False:
        allowed = list(error.schema.get("properties", {}))
        extra = next(name for name in value if name not in allowed)
        return f"{_json_path([*parts, extra])}: unknown field; allowed: {', '.join(allowed)}"
    if kind == "const":
        return f"{_json_path(parts)}: {_shown(value)} is not allowed; allowed: {_shown(expected)}"
    if kind == "enum":
        return f"{_json_path(parts)}: {_shown(value)} is not allowed; allowed: {', '.join(str(v) for v in expected)}"
    if kind == "maxLength":
        return f"{_json_path(parts)}: {len(value)} characters; allowed: up to {expected} characters"
    if kind in ("minimum", "maximum"):
        return f"{_json_path(parts)}: must be {'>=' if kind == 'minimum' else '<='} {expected:g}, got {_shown(value)}"
    return f"{_json_path(parts)}: {' '.join(error.message.split())[:200]}"


@functools.cache
def _validator(version: str):
    """A JSON Schema validator of results.json ``version`` (one of :data:`READABLE_SCHEMA_VERSIONS`)."""
    import jsonschema

    schema = results_schema()
    schema["properties"]["schema_version"] = {"const": version}
    return jsonschema.Draft202012Validator(schema)


def validate_results(document: Any, where: str) -> None:
    """Refuse a results.json document this code cannot read as written: an unknown or missing
    ``schema_version`` (the readable ones: :data:`READABLE_SCHEMA_VERSIONS`) or anything the schema
    in ``reports/schema`` does not allow (a number given as a string, a missing field, ...).
    The :class:`UserInputError` names ``where`` and the JSON path of the offending field."""
    allowed = ", ".join(repr(v) for v in READABLE_SCHEMA_VERSIONS)
    version = document.get("schema_version") if isinstance(document, dict) else None
    if version is None:
        raise UserInputError(f"{where}: schema_version: missing; allowed: {allowed} (is it the results.json "
                             "of `dpfl-audit run`?)")
    if not isinstance(version, str) or version not in READABLE_SCHEMA_VERSIONS:
        raise UserInputError(f"{where}: schema_version: {_shown(version)} is not supported; allowed: {allowed} "
                             "(rerun the audit with this version of dpfl-audit)")
    # the shallowest problem, the first in the document among equally deep ones
    error = min(_validator(version).iter_errors(document), default=None,
                key=lambda e: (len(e.absolute_path), [(isinstance(p, str), p) for p in e.absolute_path]))
    if error is not None:
        raise UserInputError(f"{where}: {_schema_problem(error)}")


def load_results(path: str | Path, option: str = "results") -> tuple[Results, dict[str, Any], Path]:
    """(results.json as :class:`Results`, manifest.json or {}, results folder) from a `dpfl-audit run`
    output folder or its results.json, both read strictly (:func:`validate_results`). Bad input raises
    :class:`UserInputError` naming ``option``, the file and the offending field."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        missing = f"no results.json in directory '{path}'" if path.is_dir() else f"'{path}' does not exist"
        raise UserInputError(f"{option}: {missing}; give an output directory of `dpfl-audit run` or its results.json")
    document = _read_json(file, option)
    experiments = document.get("experiments") if isinstance(document, dict) else None
    if not isinstance(experiments, list):
        raise UserInputError(f"{option}: '{file}' has no 'experiments' list; is it the results.json of `dpfl-audit run`?")
    for i, experiment in enumerate(experiments):
        if not isinstance(experiment, dict) or not isinstance(experiment.get("key"), str):
            raise UserInputError(f"{option}: '{file}': experiments[{i}] has no 'key'; is it the results.json "
                                 "of `dpfl-audit run`?")
    validate_results(document, f"{option}: '{file}'")
    manifest_file = file.parent / "manifest.json"
    manifest = _read_json(manifest_file, option) if manifest_file.is_file() else {}
    if not isinstance(manifest, dict):
        raise UserInputError(f"{option}: '{manifest_file}': must be an object, got {_shown(manifest)}")
    for key in ("versions", "machine"):
        if not isinstance(manifest.get(key, {}), dict):
            raise UserInputError(f"{option}: '{manifest_file}': {key}: must be an object, got {_shown(manifest[key])}")
    return from_json(Results, document), manifest, file.parent
