"""One rule's verdict on one target: what ``dpfl-audit check`` prints, writes as JSON and as JUnit."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: an outcome's verdict: the rule holds, fails, or could not be checked (missing data, no baseline)
PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class Outcome:
    """The verdict of one rule on one target (an experiment, or an experiment's attack metric).

    ``value`` is the number (or soundness status) that was compared, ``threshold`` what it was
    compared with by ``relation``; ``value_basis``/``threshold_basis`` say which number each is
    (``ci_low``, ``baseline ci_high``, ...) where that is not obvious; ``sentence`` explains.
    ``metric`` names the metric compared (max, min, no-regression); ``cannot_fail`` says why the
    outcome would hold whatever was measured — its threshold lies at or beyond the end of the
    metric's range (``auc ≤ 1``), or no figure of the experiment meets a finite claim — and is
    empty when a measurement could fail it (:func:`reports.gate.rule_warnings`)."""

    rule: str
    kind: str
    target: str
    verdict: str  # PASS, FAIL or SKIP
    value: float | str | None
    threshold: float | str | None
    relation: str
    sentence: str
    value_basis: str = ""
    threshold_basis: str = ""
    #: a regression test's one-sided p-value, the Holm level it was compared with (family: the
    #: check's interval comparisons), and the standard error of the difference it rests on
    p_value: float | None = None
    level: float | None = None
    se: float | None = None
    metric: str = ""
    cannot_fail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
