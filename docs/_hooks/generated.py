"""mkdocs hook: the docs' generated reference.

A page line ``<!-- generated: NAME -->`` is replaced, before the page's Markdown is rendered, by
Markdown generated from the code and the recorded files themselves, so the reference cannot drift
from what the tool does:

- ``cli``: every command of ``dpfl-audit`` walked from its argparse parser (:mod:`audit.cli_parser`);
- ``configuration``: every config field (:func:`audit.core.schema.field_reference` of ``AuditConfig``,
  what ``dpfl-audit config --reference`` prints) and every defense's and attack's parameters;
- ``results-schema``: ``reports/schema/results.schema.json`` as tables, with results.csv's columns;
- ``scores-schema``: ``reports/schema/scores.schema.json`` (what ``dpfl-audit scores`` reads);
- ``api``: every name of ``audit.__all__`` with its signature and docstring;
- ``performance``: the recorded benchmark files ``benchmarks/results/*.json`` (``benchmarks/run_all.py``),
  the latest per machine, each figure with its file's date and machine.

Inline, ``<!-- figure: NAME -->`` anywhere in a line is replaced by one recorded figure of the
reference machine (the latest CPU file), e.g. ``<!-- figure: default-audit-seconds -->`` → ``127 s``:
prose quotes the same files as the tables (:data:`FIGURES` names them).

The functions are plain (Markdown in, Markdown out) so that ``tests/test_docs.py`` calls them
directly; mkdocs calls :func:`on_page_markdown`. Only ``api`` imports torch (through the modules
that define the API); the others load the parser, the config schema and JSON files.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import inspect
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repository's packages, as the tests import them
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- generated: ([a-z][a-z-]*) -->[ \t]*$", re.MULTILINE)
RESULTS_SCHEMA = ROOT / "reports" / "schema" / "results.schema.json"
SCORES_SCHEMA = ROOT / "reports" / "schema" / "scores.schema.json"
BENCHMARKS = ROOT / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------------
# Markdown helpers


def rest_to_markdown(text: str) -> str:
    """A docstring's reST-ish markup in Markdown: ``code`` → `code`, :role:`target` → `target`,
    a paragraph ending in ``::`` followed by an indented block → a fenced code block, ``\\ `` dropped."""
    text = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = text.replace("\\ ", "")
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 1 < len(lines):
            # the indented block after it (blank lines inside allowed) is code
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            indent = len(lines[j]) - len(lines[j].lstrip()) if j < len(lines) else 0
            base = len(line) - len(line.lstrip())
            if j < len(lines) and indent > base:
                stripped = line.rstrip()[:-2].rstrip()
                if stripped.strip():
                    out.append(stripped + ":")
                out.extend(["", "```python" if _looks_like_python(lines, j, indent) else "```text"])
                k = j
                block: list[str] = []
                while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) >= indent):
                    block.append(lines[k][indent:])
                    k += 1
                while block and not block[-1].strip():
                    block.pop()
                out.extend([*block, "```", ""])
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def _looks_like_python(lines: list[str], start: int, indent: int) -> bool:
    first = lines[start][indent:]
    return bool(re.match(r"(import |from |[A-Za-z_][\w.]*\s*=|[A-Za-z_][\w.]*\()", first))


def cell(text: Any) -> str:
    """``text`` made safe for one Markdown table cell: no line breaks, and outside `code spans`
    ``|`` and the characters Markdown or HTML would read as markup escaped."""
    text = " ".join(str(text).split())
    parts = re.split(r"(`[^`]*`)", text)
    for n, part in enumerate(parts):
        if n % 2 == 0:
            part = part.replace("\\", "\\\\").replace("<", "&lt;").replace("*", "\\*").replace("_", "\\_")
            part = part.replace("[", "\\[").replace("|", "\\|")
        parts[n] = part  # a pipe inside a code span does not end the cell (Python-Markdown's tables)
    return "".join(parts)


def code(text: Any) -> str:
    """Inline code of ``text`` (backticks inside it taken care of); '' stays ''."""
    text = str(text)
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# cli: the parser, walked


def _help_text(action: argparse.Action, prog: str) -> str:
    """An action's help with argparse's %(default)s-style fields filled in, as --help prints it."""
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    for key in ("default", "choices", "type"):
        value = params.get(key)
        if key == "choices" and value is not None:
            params[key] = ", ".join(str(c) for c in value)
        elif key == "type" and value is not None:
            params[key] = getattr(value, "__name__", str(value))
    try:
        return action.help % params
    except (KeyError, TypeError, ValueError):
        return action.help


def _allowed(action: argparse.Action) -> str:
    """What an option accepts: its choices, or the range its bounded type checks."""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return ", ".join(code(c) for c in action.choices)
    parse = action.type
    if callable(parse) and getattr(parse, "__closure__", None):
        cells = dict(zip(parse.__code__.co_freevars, parse.__closure__))
        span = cells.get("span")
        kind = cells.get("kind")
        if span is not None:
            what = {int: "integer", float: "number"}.get(kind.cell_contents if kind is not None else None, "value")
            return f"{what} in {span.cell_contents}"
    if parse in (int, float):
        return {int: "integer", float: "number"}[parse]
    return ""


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction,
                           argparse._VersionAction, argparse._HelpAction)):
        return ""
    default = action.default
    if default is None or default is argparse.SUPPRESS or default == []:
        return ""
    return code(default)


def _option_name(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return code(names)
        choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
        metavar = action.metavar or choices or action.dest.upper()
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        return code(f"{names} {metavar}")
    name = action.metavar or action.dest
    return code(name if isinstance(name, str) else " ".join(name))


def _option_rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[list[str]]:
    rows = []
    required_groups = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings and set(action.option_strings) & skip:
            continue
        notes = []
        if not action.option_strings:
            notes.append("positional" + (", optional" if action.nargs in ("?", "*") else ""))
            if action.nargs in ("*", "+"):
                notes.append("one or more" if action.nargs == "+" else "any number")
        elif action.required:
            notes.append("required")
        elif id(action) in required_groups:
            others = [a.option_strings[0] for g in parser._mutually_exclusive_groups if action in g._group_actions
                      for a in g._group_actions if a is not action]
            notes.append("required unless " + " or ".join(code(o) for o in others))
        if isinstance(action, (argparse._AppendAction, argparse._CountAction)) and action.option_strings:
            notes.append("repeatable")
        allowed = _allowed(action)
        rows.append([_option_name(action), cell(_help_text(action, parser.prog)), allowed, _default(action),
                     cell("; ".join(notes))])
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)  # type: ignore[assignment]
    return parser.format_usage().strip()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order --help lists them."""
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]


def cli_parser() -> argparse.ArgumentParser:
    from audit.cli_parser import build_parser

    return build_parser()


OPTION_HEADER = ["option", "what it does", "accepts", "default", "notes"]


def cli_markdown() -> str:
    """Every command of ``dpfl-audit``: usage, what it does, each option's help, accepted values,
    default; the options every command takes once at the top."""
    parser = cli_parser()
    common = [a for a in parser._actions if a.option_strings and a.default is argparse.SUPPRESS
              and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
    common_names = {name for a in common for name in a.option_strings}
    commands = _subcommands(parser)
    usage = re.sub(r"\{[\w,-]+\}\s*\.\.\.", "COMMAND ...", _usage(parser))  # not the list of every command
    out = [cell(parser.description or ""), "", "```text", re.sub(r"\s*\n\s+", " ", usage), "```", "",
           "| command | what it does |", "|---|---|"]
    out += [f"| [{code('dpfl-audit ' + name)}](#dpfl-audit-{name}) | {cell(text)} |" for name, text, _ in commands]
    out += ["", "## Options of every command", "",
            "These options go before or after the command's name, e.g. `dpfl-audit -v run` or `dpfl-audit run -v`; "
            "`dpfl-audit --version` prints the version and `-h`/`--help` after any command prints its usage.", "",
            table(OPTION_HEADER, [row for row in _option_rows(parser, set())
                                  if row[0].strip("`").split(",")[0].split()[0] in common_names])]
    for name, text, sub in commands:
        out += ["", f"## `dpfl-audit {name}`", "", cell(text) + ("." if text and not text.endswith(".") else ""), "",
                "```text", _usage(sub), "```", ""]
        rows = _option_rows(sub, common_names)
        out.append(table(OPTION_HEADER, rows) if rows else "No options beyond those of every command.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# configuration: the config schema


def config_rows() -> list[dict[str, Any]]:
    from audit.config import AuditConfig
    from audit.core.schema import field_reference

    return field_reference(AuditConfig)


def _field_row(path: str, kind: str, default: Any, span: str, text: str) -> list[str]:
    return [code(path), cell(kind), cell(span), code(json_value(default)), cell(rest_to_markdown(text))]


FIELD_HEADER = ["field", "type", "allowed", "default", "description"]


def configuration_markdown() -> str:
    """Every config field by section (type, allowed range, default, description), the limits
    every field shares, and every registered defense's and attack's ``params``."""
    import attacks.catalog  # noqa: F401  (registers the attacks)
    import defenses.catalog  # noqa: F401  (registers the defenses)
    from attacks.base import ATTACKS
    from audit.config import preset_names
    from audit.core.schema import MAX_FLOAT, MAX_INT, MAX_LIST, field_help
    from defenses.base import DEFENSES

    sections: dict[str, list[dict[str, Any]]] = {}
    for row in config_rows():
        head = re.split(r"[.\[]", row["field"], maxsplit=1)[0]
        sections.setdefault(head if ("." in row["field"] or "[" in row["field"]) else "", []).append(row)
    out = [f"Numbers must be finite; an integer without its own bound is at most {MAX_INT:,}, a number at most "
           f"{MAX_FLOAT:g} in magnitude; a list holds at most {MAX_LIST:,} values. A field left out takes its default; "
           "`section: null` means the section's defaults. Unknown fields are errors that name the allowed ones. "
           "`dpfl-audit config --reference` prints the same table.", "",
           "Presets (`--preset NAME`): " + ", ".join(code(p) for p in preset_names()) + "."]
    for head, rows in sections.items():
        title = "Top level" if not head else f"`{head}`"
        anchor_text = head or "top-level"
        out += ["", f"## {title} {{#{anchor_text.replace('_', '-')}}}", "",
                table(FIELD_HEADER, [_field_row(r["field"], r["type"], r["default"], r["range"], r["help"]) for r in rows])]
    for kind, registry in (("defense", DEFENSES), ("attack", ATTACKS)):
        out += ["", f"## Parameters of each {kind} {{#{kind}-params}}", "",
                f"A {kind} entry's `params:` mapping (`{kind}s[].params`); `dpfl-audit list` prints the same. "
                "The same rules as above apply."]
        for name in registry.names():
            entry = registry.get(name)
            summary = getattr(entry, "summary", "") or ""
            reference = getattr(entry, "reference", "") or ""
            rows = field_help(entry.Params)
            out += ["", f"### `{name}` {{#{kind}-{name}}}", "",
                    cell(rest_to_markdown(summary)) + (f" ({cell(reference)})" if reference else ""), ""]
            if rows:
                out.append(table(["param", "type", "default", "description"],
                                 [[code(n), cell(t), code(json_value(d)), cell(rest_to_markdown(h))] for n, t, d, h in rows]))
            else:
                out.append("No parameters.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# results-schema and scores-schema: the JSON Schemas as tables


def _anchor(name: str, prefix: str = "schema") -> str:
    """The id of a schema definition's heading: ``schema-NAME`` for results.json, ``scores-NAME`` for score files."""
    return f"{prefix}-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _schema_type(spec: dict[str, Any], prefix: str = "schema") -> str:
    """A reader's name for a JSON Schema node (a link for a $ref)."""
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name, prefix)})"
    if "const" in spec:
        return code(json_value(spec["const"]))
    if "enum" in spec:
        return "one of " + ", ".join(code(json_value(v)) for v in spec["enum"])
    for key in ("anyOf", "oneOf"):
        if key in spec:
            return " or ".join(_schema_type(s, prefix) for s in spec[key])
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    names = []
    for k in kinds:
        if k == "array":
            names.append("array of " + _schema_type(spec["items"], prefix) if spec.get("items") else "array")
        elif k == "object" and isinstance(spec.get("additionalProperties"), dict) and not spec.get("properties"):
            names.append("object of " + _schema_type(spec["additionalProperties"], prefix))
        else:
            names.append(cell(k))
    return " or ".join(names) if names else "any"


def _schema_range(spec: dict[str, Any]) -> str:
    parts = []
    for key, text in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
                      ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"), ("maxItems", "items ≤")):
        if key in spec:
            parts.append(f"{text} {spec[key]}")
    if "pattern" in spec:
        parts.append("pattern " + code(spec["pattern"]))
    for key in ("anyOf", "oneOf"):
        for option in spec.get(key, []):
            if _schema_range(option):
                parts.append(_schema_range(option))
    return ", ".join(parts)


def _properties_table(spec: dict[str, Any], prefix: str = "schema") -> str:
    required = set(spec.get("required", []))
    rows = []
    for name, prop in spec.get("properties", {}).items():
        description = prop.get("description", "")
        if prop.get("type") == "object" and prop.get("properties") and not description:
            description = "an object with: " + ", ".join(code(p) for p in prop["properties"])
        rows.append([code(name), _schema_type(prop, prefix), "yes" if name in required else "", cell(_schema_range(prop)),
                     cell(rest_to_markdown(description))])
    return table(["field", "type", "required", "range", "description"], rows)


def _schema_sections(schema: dict[str, Any], level: str, prefix: str = "schema") -> list[str]:
    out = []
    for name, spec in schema.get("$defs", {}).items():
        out += ["", f"{level} {name} {{#{_anchor(name, prefix)}}}", ""]
        if spec.get("description"):
            out += [cell(rest_to_markdown(spec["description"])), ""]
        if spec.get("properties"):
            out.append(_properties_table(spec, prefix))
            extra = spec.get("additionalProperties")
            if isinstance(extra, dict):
                out += ["", f"Other fields: {_schema_type(extra, prefix)}."]
        else:
            out.append(f"A value of type {_schema_type(spec, prefix)}.")
    return out


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def results_schema_markdown() -> str:
    """results.json's schema, field by field, and results.csv's columns."""
    schema = load_json(RESULTS_SCHEMA)
    version = schema["properties"]["schema_version"].get("const", "")
    out = [cell(rest_to_markdown(schema.get("description", ""))) + f" Schema version {code(version)}; the JSON Schema "
           "itself ships with the package as `reports/schema/results.schema.json` (`dpfl-audit check` and "
           "`dpfl-audit report` validate against it).", "",
           "## results.json {#schema-results-json}", "", _properties_table(schema)]
    out += _schema_sections(schema, "###")
    out += ["", "## results.csv {#schema-results-csv}", "", results_csv_markdown(schema)]
    return "\n".join(out) + "\n"


def results_csv_markdown(schema: dict[str, Any]) -> str:
    """results.csv's columns: the ``Row`` definition of the schema (one row of the CSV each) and
    what :mod:`reports.results` says of them."""
    import audit
    from reports import results

    row = schema["$defs"]["Row"]
    # the docstring's paragraphs after its title line, less its list of the columns (the table gives them)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", (results.__doc__ or "").strip())[1:]]
    paragraphs = [rest_to_markdown(p) for p in paragraphs if not p.startswith(", ".join(results.COLUMNS[:3]))]
    rows = [[code(name), _schema_type(spec), cell(rest_to_markdown(spec.get("description", "")))]
            for name, spec in row["properties"].items() if name in results.COLUMNS]
    frame = (["`audit.results_frame` returns this table as a pandas DataFrame."] if "results_frame" in audit.__all__ else [])
    return "\n\n".join([*paragraphs[:1], table(["column", "type", "description"], rows), *paragraphs[1:], *frame])


def scores_schema_markdown() -> str:
    """The score file's row schema (what ``dpfl-audit scores`` reads)."""
    schema = load_json(SCORES_SCHEMA)
    out = [cell(rest_to_markdown(schema.get("description", "")))]
    out += _schema_sections(schema, "###", prefix="scores")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# api: the public names


def _format_default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    return repr(value)


def signature_text(name: str, obj: Any) -> str:
    """``name(param: annotation = default, ...) -> return`` as written in the source (string
    annotations unquoted, enum defaults as their values); one parameter a line when long."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    parts: list[str] = []
    kinds = [p.kind for p in signature.parameters.values()]
    for n, parameter in enumerate(signature.parameters.values()):
        if parameter.kind is parameter.KEYWORD_ONLY and (n == 0 or kinds[n - 1] not in (parameter.KEYWORD_ONLY,
                                                                                      parameter.VAR_POSITIONAL)):
            parts.append("*")
        text = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "") + parameter.name
        if parameter.annotation is not parameter.empty:
            text += f": {_annotation(parameter.annotation)}"
        if parameter.default is not parameter.empty:
            text += f" = {_format_default(parameter.default)}"
        parts.append(text)
        if parameter.kind is parameter.POSITIONAL_ONLY and (n + 1 == len(kinds) or kinds[n + 1] is not parameter.POSITIONAL_ONLY):
            parts.append("/")
    returns = ""
    if signature.return_annotation is not signature.empty:
        returns = " -> " + _annotation(signature.return_annotation)
    one_line = f"{name}({', '.join(parts)}){returns}"
    if len(one_line) <= 90:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + f"){returns}"


def _annotation(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def api_names() -> list[str]:
    import audit

    return [name for name in audit.__all__ if not name.startswith("_")]


def api_markdown() -> str:
    """Every public name of ``audit``: where it is defined, its signature, its docstring."""
    import audit

    out = [f"`import audit` loads each name below on first use (version {code(audit.__version__)}, "
           "`audit.__version__`); the module docstring's tour:", "",
           "```python", _tour(audit.__doc__ or ""), "```"]
    for name in api_names():
        try:
            with warnings.catch_warnings():  # Flower's CLI libraries warn on import; the site's build log is not the place
                warnings.simplefilter("ignore", DeprecationWarning)
                obj = getattr(audit, name)
        except ImportError as error:  # e.g. audit.audit_flower needs flwr
            raise ImportError(f"audit.{name} cannot be imported ({error}): build the docs in an environment with "
                              "the dev extra, pip install -e '.[dev]'") from error
        module = getattr(obj, "__module__", "") or ""
        qualified = f"{module}.{getattr(obj, '__qualname__', name)}"
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
        doc = inspect.getdoc(obj) if callable(obj) else None
        out += ["", f"## `audit.{name}` {{#audit-{name.replace('_', '-')}}}", "",
                "```python", signature_text(name, obj) if callable(obj) else f"{name} = {obj!r}", "```", "",
                f"*{kind}, defined as `{qualified}`*", "", rest_to_markdown(doc) if doc else "No docstring."]
        returned = [f"[`{t.__name__}`](#type-{t.__name__.lower()})" for t in returned_types(obj)]
        if returned:
            out += ["", "Returns: " + ", ".join(returned) + "."]
    types = {t: None for name in api_names() for t in returned_types(getattr(audit, name))}
    if types:
        out += ["", "## Types the API returns {#types}"]
    for kind in types:
        doc = inspect.getdoc(kind) or ""
        if doc.startswith(kind.__name__ + "("):  # the signature dataclasses write when a class has no docstring
            doc = ""
        out += ["", f"### `{kind.__name__}` {{#type-{kind.__name__.lower()}}}", "",
                f"*class `{kind.__module__}.{kind.__qualname__}`*", "", rest_to_markdown(doc) if doc else ""]
        note = TYPE_NOTES.get(kind.__name__)
        if note:
            out += ["", note]
        fields = [f for f in dataclasses.fields(kind) if not f.name.startswith("_")]
        if fields:
            out += ["", table(["field", "type"], [[code(f.name), code(_annotation(f.type))] for f in fields])]
    return "\n".join(out) + "\n"


#: where a returned type is described in full
TYPE_NOTES = {
    "AuditConfig": "Its fields and their defaults: [Configuration](configuration.md).",
    "Results": "The results document, as written to results.json: [Results files](results.md).",
}


def returned_types(obj: Any) -> list[type]:
    """The dataclasses a public function's return annotation names (looked up in its module)."""
    try:
        annotation = inspect.signature(obj).return_annotation
    except (TypeError, ValueError):
        return []
    if annotation is inspect.Signature.empty:
        return []
    names = re.findall(r"\b[A-Z]\w*", _annotation(annotation))
    module_globals = getattr(obj, "__globals__", {})
    found = [module_globals.get(name) for name in names]
    return [t for t in found if isinstance(t, type) and dataclasses.is_dataclass(t)]


def _tour(docstring: str) -> str:
    """The indented example block of the package docstring (after its first ``::``)."""
    lines = docstring.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith("::")), None)
    if start is None:
        return ""
    block = []
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip("\n")


# ---------------------------------------------------------------------------------------------
# performance: the recorded benchmark files


@dataclasses.dataclass(frozen=True)
class Record:
    """One recorded ``benchmarks/run_all.py`` output file."""

    path: Path
    date: str
    data: dict[str, Any]

    @property
    def machine(self) -> str:
        """The machine in words: the GPU when the run used one, else the CPU and its cores."""
        m = self.data["machine"]
        if self.data.get("device", "cpu") != "cpu" and m.get("gpu"):
            return f"{m['gpu']} ({m['cpu']}, {m['cores']} cores)"
        return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, no GPU used"

    @property
    def baseline(self) -> bool:
        """A baseline measured before a change (``-before`` in its name): kept for comparison."""
        return self.path.stem.endswith("-before")

    @property
    def label(self) -> str:
        return f"{self.machine.split(' (')[0].split(',')[0]} · {self.date}"


def benchmark_records(folder: Path = BENCHMARKS) -> list[Record]:
    """Every ``run_all.py`` output in ``folder`` (``YYYY-MM-DD-*.json`` holding ``machine`` and
    ``workloads``: older layouts and the other benchmarks' files are left out), oldest first."""
    records = []
    for path in sorted(folder.glob("*.json")):
        match = re.match(r"(\d{4}-\d{2}-\d{2})-", path.name)
        if not match:
            continue
        data = load_json(path)
        if isinstance(data, dict) and "machine" in data and isinstance(data.get("workloads"), dict) and not data.get("quick"):
            records.append(Record(path, match.group(1), data))
    return records


def latest_per_machine(records: list[Record]) -> list[Record]:
    """The latest record of each (machine, device): the latest date; on one date a measurement
    after the change over its ``-before`` baseline; then the last name."""
    best: dict[tuple[str, str], Record] = {}
    for record in sorted(records, key=lambda r: (r.date, not r.baseline, r.path.name)):
        best[(record.machine, record.data.get("device", "cpu"))] = record
    return sorted(best.values(), key=lambda r: (r.data.get("device", "cpu") != "cpu", r.machine))


def _number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


#: (figure, how to read it from a workload's entry) — the recorded values, ratios as recorded
WORKLOAD_FIGURES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("batched engine, client updates/s", lambda w: _number(w.get("batched_updates_per_second"))),
    ("plain per-client PyTorch loop, client updates/s", lambda w: _number(w.get("loop_updates_per_second"))),
    ("batched ÷ loop", lambda w: _ratio(w.get("batched_vs_loop"))),
    ("Flower simulation (the faster engine), client updates/s",
     lambda w: (f"{_number(w['flower_updates_per_second'])} ({code(w.get('flower_engine', ''))})"
                if w.get("flower_updates_per_second") is not None else _skipped(_get(w, "flower", "error")))),
    ("batched ÷ Flower", lambda w: _ratio(w.get("batched_vs_flower"))),
    ("test accuracy after the rounds (batched engine)", lambda w: _number(_get(w, "engine", "batched", "test_accuracy"), 3)),
    ("batched engine, fraction of the roofline bound min(P, I·B)",
     lambda w: _percent(_get(w, "roofline", "engines", "batched", "fraction_of_bound"))),
    ("plain loop, fraction of the roofline bound",
     lambda w: _percent(_get(w, "roofline", "engines", "loop", "fraction_of_bound"))),
    ("64-run membership experiment trained together, s", lambda w: _seconds(_get(w, "membership", "together_seconds"), w)),
    ("one run alone, s", lambda w: _seconds(_get(w, "membership", "one_run_seconds"), w, 2)),
    ("together ÷ one run", lambda w: _ratio(_get(w, "membership", "together_vs_one_run"))),
]


def _ratio(value: float | None) -> str:
    """A recorded ratio: 3 significant figures up to 100 (1.06×, 10.7×), whole numbers above."""
    if value is None:
        return "–"
    return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f}×"


def _percent(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f} %" if 100 * value >= 1 else f"{100 * value:.2g} %"


def _seconds(value: float | None, workload: dict[str, Any], digits: int = 1) -> str:
    if value is None:
        return _skipped(_get(workload, "membership", "error"))
    return f"{value:,.{digits}f}"


def _skipped(error: str | None) -> str:
    if not error:
        return "–"
    return "not run" + (" (" + cell(error.removeprefix("skipped").strip(" ()")) + ")" if "skipped" in error else "")


def _whole_run_figures(record: Record) -> list[tuple[str, str]]:
    d = record.data
    mem, calib = d.get("memory") or {}, d.get("calibration") or {}
    canaries, resume = d.get("canaries") or {}, d.get("resume") or {}
    rows = [
        ("default audit (`dpfl-audit run`), wall time, s",
         _number(mem.get("wall_seconds")) if "wall_seconds" in mem else _skipped(mem.get("error"))),
        ("default audit, peak memory, MiB", _number(mem.get("peak_mib")) if "peak_mib" in mem else _skipped(mem.get("error"))),
        ("smoke preset, first run, s", _number(resume.get("first_run_seconds"), 1) if resume else "not run"),
        ("smoke preset, rerun of a finished audit (read back from the cache), s",
         _number(resume.get("rerun_median_seconds"), 2) if resume else "not run"),
        ("σ for ε = 1 at 10⁴ rounds: ours, s", _number(calib.get("ours_seconds"), 3) if "ours_seconds" in calib
         else _skipped(calib.get("error"))),
        ("σ for ε = 1 at 10⁴ rounds: opacus `get_noise_multiplier`, s",
         _number(calib.get("opacus_seconds"), 3) if "opacus_seconds" in calib else _skipped(calib.get("error"))),
        ("10⁴ Dirac canary clients a round, time ÷ without",
         _ratio(_get(canaries, "dirac", "ratio")) if canaries else "not run"),
        ("10⁴ dense canary clients a round, time ÷ without",
         _ratio(_get(canaries, "dense", "ratio")) if canaries else "not run"),
    ]
    return rows


def _machine_rows(record: Record) -> list[tuple[str, str]]:
    d, m = record.data, record.data["machine"]
    peak = _get(d, "roofline", "matmul_peak", "peak_flops")
    bandwidth = _get(d, "roofline", "bandwidth", "bandwidth")
    idle = [d.get(k) or {} for k in ("idle_before", "idle_after")]
    return [
        ("file", code("benchmarks/results/" + record.path.name)),
        ("date", record.date + (" (a baseline measured before the latest engine changes)" if record.baseline else "")),
        ("machine", cell(record.machine)),
        ("device the engines trained on", code(d.get("device", "cpu"))),
        ("Python, torch (threads)", cell(f"{m.get('python')}, {m.get('torch')} ({m.get('torch_threads')})")),
        ("fp32 matrix-multiply peak P", "–" if peak is None else f"{peak / 1e9:,.1f} GFLOP/s"),
        ("memory bandwidth B", "–" if bandwidth is None else f"{bandwidth / 1e9:,.1f} GB/s"),
        ("cores busy before / after",
         " / ".join("–" if "busy_share" not in i else f"{100 * i['busy_share']:.1f} %" for i in idle)),
    ]


def performance_markdown(folder: Path = BENCHMARKS) -> str:
    """The latest recorded benchmark per machine: the machines, one table per workload, one for
    the whole-audit figures; each column names its file's machine and date."""
    records = latest_per_machine(benchmark_records(folder))
    if not records:
        raise ValueError(f"no recorded benchmark (run_all.py output) in {folder}")
    header = ["", *[f"{cell(r.label)}" for r in records]]
    out = ["Each column is one recorded file of `benchmarks/run_all.py`, the latest per machine; every figure "
           "below is read from it as recorded.", "", "### Machines", "",
           table(header, [[name, *[dict(_machine_rows(r))[name] for r in records]] for name, _ in _machine_rows(records[0])])]
    workloads: dict[str, str] = {}
    for record in records:
        for name, entry in record.data["workloads"].items():
            workloads.setdefault(name, entry.get("description", ""))
    for name, description in workloads.items():
        out += ["", f"### Workload `{name}`", "", cell(description) + ".", ""]
        rows = []
        for figure, read in WORKLOAD_FIGURES:
            values = []
            for record in records:
                entry = record.data["workloads"].get(name)
                values.append(read(entry) if entry is not None else "not run")
            rows.append([cell(figure), *values])
        out.append(table(["figure", *header[1:]], rows))
    out += ["", "### Whole audits and accounting", "",
            table(["figure", *header[1:]],
                  [[cell(figure) if "`" not in figure else figure, *[dict(_whole_run_figures(r))[figure] for r in records]]
                   for figure, _ in _whole_run_figures(records[0])])]
    return "\n".join(out) + "\n"


def reference_record(folder: Path = BENCHMARKS) -> Record:
    """The latest record measured on a CPU (the reference machine the docs' figures quote)."""
    cpu = [r for r in latest_per_machine(benchmark_records(folder)) if r.data.get("device", "cpu") == "cpu"]
    if not cpu:
        raise ValueError(f"no recorded CPU benchmark (run_all.py output) in {folder}")
    return max(cpu, key=lambda r: (r.date, r.path.name))


#: figures a page quotes inline, ``<!-- figure: NAME -->``, from :func:`reference_record`
FIGURES: dict[str, Callable[[Record], str]] = {
    "reference-machine": lambda r: f"{r.machine.removesuffix(', no GPU used')}, {r.date}",
    "benchmark-date": lambda r: r.date,
    "default-audit-seconds": lambda r: f"{r.data['memory']['wall_seconds']:,.0f} s",
    "default-audit-peak-memory": lambda r: f"{r.data['memory']['peak_mib']:,.0f} MiB",
    "smoke-seconds": lambda r: f"{r.data['resume']['first_run_seconds']:,.0f} s",
    "smoke-rerun-seconds": lambda r: f"{r.data['resume']['rerun_median_seconds']:,.1f} s",
    "mlp-batched-vs-loop": lambda r: _ratio(r.data["workloads"]["mlp"]["batched_vs_loop"]),
    "mlp-batched-vs-flower": lambda r: _ratio(r.data["workloads"]["mlp"].get("batched_vs_flower")),
    "cnn-batched-vs-loop": lambda r: _ratio(r.data["workloads"]["cnn"]["batched_vs_loop"]),
    "cnn-batched-vs-flower": lambda r: _ratio(r.data["workloads"]["cnn"].get("batched_vs_flower")),
}
FIGURE = re.compile(r"<!-- figure: ([a-z0-9-]+) -->")


@functools.cache
def figure(name: str) -> str:
    if name not in FIGURES:
        raise KeyError(f"unknown figure '{name}'; known: {', '.join(FIGURES)}")
    return FIGURES[name](reference_record())


# ---------------------------------------------------------------------------------------------
# the hook


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "configuration": configuration_markdown,
    "results-schema": results_schema_markdown,
    "scores-schema": scores_schema_markdown,
    "api": api_markdown,
    "performance": performance_markdown,
}


@functools.cache
def generated(name: str) -> str:
    if name not in GENERATORS:
        raise KeyError(f"unknown generated section '{name}'; known: {', '.join(GENERATORS)}")
    return GENERATORS[name]().rstrip("\n")


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its generated Markdown
    and every ``<!-- figure: NAME -->`` by the recorded figure."""
    markdown = MARKER.sub(lambda match: generated(match.group(1)), markdown)
    return FIGURE.sub(lambda match: figure(match.group(1)), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    try:
        return expand(markdown)
    except Exception as error:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"docs/_hooks/generated.py on {page.file.src_uri}: {error}") from error
