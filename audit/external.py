"""Audits of systems dpfl-audit did not train: someone else's training, a Flower
deployment, or scores another tool computed — judged against the claim their owner states.

The attacks' results become the same document an audit writes (:class:`reports.document.Results`:
``results.json``, ``results.csv``, ``report.html``), with the same verdicts: every ε lower bound
of the system is one family (Holm), each verdict with its power (:mod:`reports.soundness`). What
dpfl-audit cannot know about a system it did not train — its partition, its per-round curves, its
diagnostics — is left empty, not invented; ``AuditInfo.system`` says in words what was audited.

A claim here has one figure, for the adversary its owner names (:func:`stated_claim`): the
released model for DP-SGD and the released global models for DP-FedAvg, where amplification by
sampling holds; the verdict compares with that figure only.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.attack_result import AttackResult
from attacks.membership_metrics import MEMBERSHIP_METRICS
from audit import __version__, provenance
from audit.core.atomic import write_json
from audit.core.errors import UserInputError, check_choice
from audit.core.output_folder import claim
from audit.core.vocabulary import Observer, Relation, Unit
from audit.summary import attack_records, diagnostics_summary, mean_interval
from defenses.privacy.accounting import dp_accounting_version
from defenses.privacy.claims import ADVERSARIES, ADVERSARY_TEXT, AdversaryClaim, PrivacyClaim
from reports.document import SCHEMA_VERSION, AuditInfo, Experiment, Results, Tool, Utility
from reports.figures import write_figures
from reports.html import write_report
from reports.results import rows_from_results, write_results
from reports.soundness import experiment_sentence, experiment_verdict

LOG = logging.getLogger(__name__)

#: units and relations a stated claim may name
CLAIM_UNITS = (Unit.RECORD, Unit.CLIENT)
CLAIM_RELATIONS = tuple(r for r in Relation if r != Relation.NONE)


def stated_claim(epsilon: float | None, delta: float, unit: str, relation: str = Relation.ADD_REMOVE,
                 adversary: str = Observer.RELEASED, accountant: str = "stated by the system's owner",
                 mechanism: str = "", notes: str = "", observes: str | None = None) -> PrivacyClaim:
    """The claim a system's owner states: (ε, δ)-DP for ``unit`` under ``relation`` against
    ``adversary``, computed by ``accountant``. ``epsilon`` None: no claim (the audit still measures,
    and every verdict says "no claim"). Bad values are one-line :class:`UserInputError`\\ s."""
    check_choice("claim unit", unit, CLAIM_UNITS)
    check_choice("claim relation", relation, CLAIM_RELATIONS)
    check_choice("claim adversary", adversary, ADVERSARIES)
    if not (0.0 <= delta < 1.0) or not math.isfinite(delta):
        raise UserInputError(f"claim delta: must be in [0, 1), got {delta}")
    if epsilon is None:
        return PrivacyClaim.non_private(notes or "no claim stated")
    if not (epsilon >= 0.0) or not math.isfinite(epsilon):
        raise UserInputError(f"claim epsilon: must be a finite number ≥ 0, got {epsilon}")
    observer, neighbours = Observer(adversary), Relation(relation)
    observed = observes or ADVERSARY_TEXT[observer]
    others = tuple(AdversaryClaim.not_covered(a, "the stated claim names another adversary") for a in ADVERSARIES
                   if a != observer)
    entry = AdversaryClaim(observer, float(epsilon), float(delta), neighbours, observed, accountant, notes=notes)
    return PrivacyClaim(float(epsilon), float(delta), Unit(unit), accountant, mechanism, notes, relation=neighbours,
                        adversary=observer, adversaries=(entry, *others))


@dataclass(frozen=True)
class System:
    """What was audited, as far as dpfl-audit can know it."""

    name: str  # the experiment's key and label
    description: str  # one sentence for the report: who trained what, how
    dataset: str = "external"
    source: str = "supplied by the user"
    kind: str = "tabular"  # "image" or "tabular"
    pool_size: int = 0  # candidate units the membership runs drew from
    test_size: int = 0
    clients: int = 1
    model: str = "external"
    model_parameters: int = 0
    runs: int = 1  # models (or score runs) the membership attacks compared
    unit: str = Unit.RECORD  # unit of the membership design
    params: dict[str, Any] = field(default_factory=dict)  # hyper-parameters the system states
    server_view: str = "the released model"
    test_accuracy: Sequence[float] = ()  # per trained model, where known
    seed: int = 0


def external_results(system: System, claim: PrivacyClaim, attack_results: list[AttackResult],
                     config: dict[str, Any] | None = None) -> Results:
    """The results document of an audited system: its attacks' metrics and verdicts against ``claim``."""
    attacks = attack_records(attack_results, claim)
    verdicts = [v for a in attacks for v in a.verdicts]
    experiment = Experiment(
        key=system.name, label=system.name, defense=system.name, reference=system.description,
        params=dict(system.params), training={}, target_epsilon=claim.epsilon if claim.is_private else None,
        claim=claim, server_view=system.server_view,
        utility=Utility(test_accuracy=mean_interval(list(system.test_accuracy)), test_loss=mean_interval([])),
        rounds=[], diagnostics=diagnostics_summary([], [], []), attacks=attacks,
        soundness=experiment_verdict(verdicts),
        soundness_text=experiment_sentence(verdicts, [a.attack for a in attacks for _ in a.verdicts]),
        skipped_attacks=[], runs=[], canary_runs={}, status="completed")
    audit = AuditInfo(
        name=system.name, seed=system.seed, dataset=system.dataset, dataset_source=system.source,
        kind=system.kind,  # type: ignore[arg-type]
        pool_size=system.pool_size, test_size=system.test_size, clients=system.clients, partition="external",
        model=system.model, model_parameters=system.model_parameters, membership_runs=max(1, system.runs),
        membership_unit=Unit(system.unit),
        accounting={}, metric_definitions=MEMBERSHIP_METRICS, system=system.description)
    return Results(schema_version=SCHEMA_VERSION,
                   tool=Tool(name="dpfl-audit", version=__version__, dp_accounting=dp_accounting_version()),
                   audit=audit, config=dict(config or {}), versions=provenance.versions(), experiments=[experiment],
                   rows=rows_from_results(audit, [experiment]))


def write_external(results: Results, out: str | Path) -> dict[str, str]:
    """Write results.csv, results.json, report.html and manifest.json of an external audit into
    ``out`` (each atomically); returns their paths."""
    out = claim(out)  # created and locked (audit.core.output_folder)
    paths = write_results(results, out)
    extra = {"versions": provenance.versions(), "machine": provenance.machine()}
    paths["report"] = str(write_report(results, out / "report.html", manifest_extra=extra))
    write_figures(results, out / "figures")
    paths["figures"] = str(out / "figures")
    write_json(out / "manifest.json", {"tool": {"name": "dpfl-audit", "version": __version__},
                                       "command": " ".join(sys.argv), "audited": results.audit.system, **extra})
    paths["manifest"] = str(out / "manifest.json")
    experiment = results.experiments[0]
    LOG.info("%s: %s", experiment.label, experiment.soundness_text)
    LOG.info("wrote %s", ", ".join(paths.values()))
    return paths


def audit_external(system: System, claim: PrivacyClaim, attack_results: list[AttackResult],
                   out: str | Path | None = None, config: dict[str, Any] | None = None) -> Results:
    """:func:`external_results`, written under ``out`` when given (public API)."""
    results = external_results(system, claim, attack_results, config)
    if out is not None:
        write_external(results, out)
    return results
