"""Text a user wrote (a label, a path, a rule's name), shown where a character can act rather than be
read: spelled out as ``\\xNN`` or ``\\uNNNN`` instead.

* On a terminal and in a log, an escape sequence in a label could clear the line, set the window's
  title or plant a hyperlink (``ESC [ 2 K``, OSC 0, OSC 8), a carriage return overwrite what was
  printed, and a bidirectional override (U+202E) make text read differently from what it is
  ("Trojan Source", Boucher & Anderson 2023): C0 and C1 controls but tab and newline, DEL, and the
  bidirectional controls are spelled out (:func:`terminal_text`, :class:`VisibleStream`).
* The same rule serves the HTML report (a browser shows such characters as nothing) and, each with
  its own set, results.csv and JUnit XML (:func:`spell_out`).
"""

from __future__ import annotations

import re
from typing import TextIO

#: C0 controls but tab and newline, DEL, C1 controls, and the bidirectional marks and controls
TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def spell_out(text: str, pattern: re.Pattern[str]) -> str:
    """``text`` with each character ``pattern`` matches written as ``\\xNN`` (``\\uNNNN`` above 0xff)."""
    return pattern.sub(_spelled, text)


def terminal_text(text: str) -> str:
    """``text`` as it may be shown on a terminal, in a log or a web page (see the module docstring)."""
    return spell_out(text, TERMINAL)


class VisibleStream:
    """A text stream that writes through :func:`terminal_text` (the command line's stdout while a
    command runs: every label, path and name it prints)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(terminal_text(text))
        return len(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)
