"""What every attack reports: an :class:`AttackResult`.

A membership attack's result holds the scores and ground truth of every (target run, unit) pair —
member = positive class, higher score = more likely member — and the metrics computed from them
(:mod:`attacks.membership_metrics`); a canary audit's and a run attack's hold metrics of their own
(:func:`run_result`: no per-unit scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from audit.core.empirical_epsilon import OneRunAudit
from audit.core.metrics import IntervalEstimate
from audit.core.parametric_gdp import ParametricGDP
from audit.core.upload_conformance import UploadConformance
from audit.core.vocabulary import AttackKind, Relation
from defenses.privacy.claims import PrivacyClaim


@dataclass
class AttackResult:
    attack: str
    variant: str
    unit: str
    scores: np.ndarray  # [targets, units]
    truth: np.ndarray  # bool [targets, units]
    metrics: dict[str, IntervalEstimate] = field(default_factory=dict)
    roc: tuple[list[float], list[float]] = ((), ())
    notes: str = ""
    #: what the ε figures of this result bound: "lower_bound" (a confidence bound) or "estimate"
    epsilon_kind: dict[str, str] = field(default_factory=dict)
    #: images for the report: {"title", "png" (base64), "caption"} — e.g. reconstruction grids
    figures: list[dict[str, str]] = field(default_factory=list)
    #: "membership" (scores per unit, ROC metrics), "canary" or "run" (metrics of their own)
    kind: str = AttackKind.MEMBERSHIP
    #: neighbouring relation of the design the scores come from (audit.tasks): one coin adds or
    #: removes a unit, or replaces one client of a pair by the other
    relation: str = Relation.ADD_REMOVE
    #: ε figure → the one-run counts behind it (their p-value against any claim; reports.soundness)
    evidence: dict[str, OneRunAudit] = field(default_factory=dict)
    #: what the scores were read from where an audit offers a choice ("final model", "all iterates", ...)
    observation: str | None = None
    #: the observer the result speaks of ("released", "server", "local") and the claim its verdicts
    #: compare with — that observer's figure (None: the experiment's headline claim)
    adversary: str | None = None
    claim: PrivacyClaim | None = None
    #: the test statistic each canary is scored by, named for the reader
    statistic: str | None = None
    #: the canaries' uploads tested against the claimed clip and noise (server view; None: not tested)
    conformance: UploadConformance | None = None
    #: the gated parametric test of the claimed μ on the canaries' scores (an estimate-based
    #: verdict, audit.core.parametric_gdp; None: not run)
    parametric: ParametricGDP | None = None

    @property
    def name(self) -> str:
        return f"{self.attack}-{self.variant}" if self.variant else self.attack


def run_result(label: str, variant: str, unit: str, metrics, notes: str, figures=None) -> AttackResult:
    """The result of a run attack (attribute, model and property inference, gradient inversion):
    metrics of its own, no per-unit scores."""
    return AttackResult(label, variant, unit, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), dict(metrics), ((), ()),
                        notes, figures=list(figures or []), kind=AttackKind.RUN)
