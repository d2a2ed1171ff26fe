"""JUnit XML for ``dpfl-audit check``, so CI systems show each rule's outcome as a test.

One ``<testsuite name="dpfl-audit check">`` holds one ``<testcase>`` per outcome: its
``classname`` is the rule's name, its ``name`` the target (experiment/attack/metric), a failing
outcome carries ``<failure message="...">`` and a skipped one ``<skipped message="...">``, each
with the outcome's sentence; one that holds whatever was measured (a threshold beyond its
metric's range, :func:`reports.gate.rule_warnings`) says so in its ``<system-out>``. There are no
timestamps, durations or host names, so the same results and policy give the same bytes — the
file can be diffed and cached. XML 1.0 has no way to write most control characters (NUL, ESC,
U+0001 …), not even as character references: a rule name or label holding one is written with
the character spelled out (``\x1b``), so the document always parses.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from audit.core.visible_text import spell_out
from reports.outcomes import Outcome

SUITE_NAME = "dpfl-audit check"

#: characters XML 1.0 cannot hold (its Char production): C0 controls but tab, newline and
#: carriage return; lone surrogates; U+FFFE and U+FFFF
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 cannot hold spelled out (``\x1b``, ``\ufffe``)."""
    return spell_out(text, _NOT_XML)


def _details(outcome: Outcome) -> str:
    """The body of a failure/skip element: the numbers compared, then the sentence."""
    def cell(number, basis: str) -> str:
        text = "—" if number is None else number if isinstance(number, str) else f"{number:.6g}"
        return f"{text} ({basis})" if basis else text

    return (f"rule: {outcome.rule} ({outcome.kind})\ntarget: {outcome.target}\n"
            f"value: {cell(outcome.value, outcome.value_basis)}\n"
            f"threshold: {outcome.relation} {cell(outcome.threshold, outcome.threshold_basis)}".rstrip()
            + f"\n{outcome.sentence}")


def junit_xml(outcomes: list[Outcome], suite_name: str = SUITE_NAME) -> str:
    """The outcomes as a JUnit XML document (a string with an XML declaration)."""
    failures = sum(o.verdict == "fail" for o in outcomes)
    skipped = sum(o.verdict == "skip" for o in outcomes)
    suite = ET.Element("testsuite", {"name": xml_text(suite_name), "tests": str(len(outcomes)), "failures": str(failures),
                                     "errors": "0", "skipped": str(skipped)})
    for outcome in outcomes:
        case = ET.SubElement(suite, "testcase", {"classname": xml_text(outcome.rule), "name": xml_text(outcome.target)})
        if outcome.verdict == "fail":
            ET.SubElement(case, "failure", {"message": xml_text(outcome.sentence),
                                            "type": xml_text(outcome.kind)}).text = xml_text(_details(outcome))
        elif outcome.verdict == "skip":
            ET.SubElement(case, "skipped", {"message": xml_text(outcome.sentence)})
        elif outcome.cannot_fail:
            ET.SubElement(case, "system-out").text = xml_text(f"warning: this check cannot fail: {outcome.cannot_fail}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
