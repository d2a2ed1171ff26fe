"""Read YAML a user wrote, strictly: UTF-8 text, no duplicate keys, valid Unicode.

``yaml.safe_load`` builds no objects but is lenient where a silent guess changes an audit:
a key given twice keeps the last value, and a ``"\\ud800"`` escape yields a string that
cannot be written back out. Here both are one-line errors naming the source and line, as
are files that are not UTF-8 text (binary, Latin-1, UTF-16).

Anchors and aliases (``&name`` … ``*name``) are refused too. A config is data, a few screens
long, and has no use for them; but each alias is expanded in place, so a few lines of nested
aliases (the "billion laughs") grow to gigabytes, and an alias inside its own anchor is a cycle.
Refusing them at composition, before anything is built, bounds the work by the text's length,
which :data:`MAX_YAML_BYTES` bounds in turn.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from audit.core.errors import UserInputError

#: largest YAML file read (configs and policies are a few kilobytes; a larger file is not one)
MAX_YAML_BYTES = 1 << 20
_WRITE_OUT = "allowed: plain YAML, every value written out in full"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases, duplicate mapping keys and strings with lone surrogates."""

    def compose_node(self, parent, index):  # type: ignore[override]
        # checked on the event, before the composer looks the anchor up or registers it: an
        # alias is refused whether its anchor exists, comes later or encloses it (a cycle)
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed; {_WRITE_OUT}",
                event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, f"YAML anchors (&{event.anchor}) and aliases (*{event.anchor}) are not allowed; {_WRITE_OUT}",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first given on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_str(self, node):  # type: ignore[override]
        value = super().construct_yaml_str(node)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a string holds a lone surrogate (e.g. \\ud800), which is not valid Unicode",
                node.start_mark) from None
        return value

    def construct_yaml_int(self, node):  # type: ignore[override]
        # Python refuses to convert an integer of more than 4,300 digits (a guard against
        # quadratic-time conversion); no field of a config or policy needs one
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} characters is too long; allowed: integers of up to "
                f"{sys.get_int_max_str_digits() or 4300} digits", node.start_mark) from None


    def refuse_tag(self, node):
        raise yaml.constructor.ConstructorError(
            None, None, f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed; allowed: plain "
            "YAML values (text, numbers, booleans, null, lists and mappings)", node.start_mark)


_StrictLoader.add_constructor("tag:yaml.org,2002:str", _StrictLoader.construct_yaml_str)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
# only values JSON has: SafeLoader also builds bytes, sets, ordered pairs and dates, which no field
# takes and which broke code that writes the config back out (a sweep's point labels)
for _tag in ("binary", "set", "omap", "pairs", "timestamp"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader.refuse_tag)
# and an unquoted 2001-12-14 is text (a name, a label), not a date
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def decode_text(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text (a UTF-8 byte-order mark is allowed), or a one-line error."""
    if b"\x00" in data:
        raise UserInputError(f"{source}: not a text file (it holds NUL bytes); expected UTF-8 YAML")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{source}: not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}); "
                             "save the file as UTF-8") from None


def parse_yaml(text: str, source: str) -> Any:
    """Parse ``text`` strictly; errors name ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserInputError(f"{source}:{where} {problem}") from None
    except RecursionError:
        raise UserInputError(f"{source}: nested too deeply") from None


def read_yaml_file(path: str | Path, source: str | None = None) -> Any:
    """Read and parse a user's YAML file strictly (missing file, bad encoding, bad YAML: one line)."""
    file = Path(path)
    source = source or str(path)
    if not file.is_file():
        raise UserInputError(f"{source}: file does not exist")
    try:
        size = file.stat().st_size
        if size > MAX_YAML_BYTES:  # checked before reading: the whole file is held in memory
            raise UserInputError(f"{source}: the file has {size} bytes, more than the {MAX_YAML_BYTES} a YAML "
                                 f"config or policy may have; allowed: up to {MAX_YAML_BYTES} bytes")
        data = file.read_bytes()
    except OSError as exc:
        raise UserInputError(f"{source}: cannot read ({exc.strerror})") from None
    return parse_yaml(decode_text(data, source), source)
