"""The results document (``results.json``) as types: one source for the file, its reader and its schema.

:class:`Results` and the frozen dataclasses under it *are* the format: ``results.json`` is
:func:`audit.core.typed_json.to_json` of a :class:`Results`, ``reports/schema/results.schema.json``
is :func:`results_schema` (a test keeps the file equal to it), and every consumer — the tidy
rows, the HTML report, the CI gate, ``reproduce`` — reads these types, not string keys.

Members are the positive class of membership metrics; every estimate carries a value and, where
one applies, a 95 % interval (``null`` when none). The claim is the defense's own
:class:`defenses.privacy.claims.PrivacyClaim` (one figure per observer).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from audit.core.atomic import dumps, write_text
from audit.core.typed_json import json_schema
from audit.core.vocabulary import MEMBERSHIP_UNITS, EpsilonKind, Observation, Observer, Unit, VerdictKind, VerdictStatus
from defenses.privacy.claims import PrivacyClaim

SCHEMA_VERSION = "2.4"
#: the published JSON Schema of results.json (:func:`results_schema`; ``python -m reports.document`` rewrites it)
SCHEMA_FILE = Path(__file__).with_name("schema") / "results.schema.json"

#: the ε figures an attack may carry, and what each is
EPSILON_METRICS = ("epsilon_one_run", "epsilon_one_run_fdp", "epsilon_gaussian_fit")
_OPTIONAL = {"omit_if_none": True}
#: a name shown in tables and figures: what the code writes is at most a label (200 characters)
#: and a suffix; an edited document's name of 100,000 characters would stall the figures
_NAME = {"json_schema": {"maxLength": 1000}}
#: the range of each figure an attack can report (its value and both ends of its interval): rates
#: and areas are probabilities, an ε lower bound and a mean squared error are not negative, SSIM
#: lies in [-1, 1] (Wang et al. 2004)
METRIC_RANGES: dict[str, tuple[float | None, float | None]] = {
    "auc": (0.0, 1.0), "tpr_at_fpr_0.1%": (0.0, 1.0), "tpr_at_fpr_1%": (0.0, 1.0), "accuracy": (0.0, 1.0),
    "balanced_accuracy": (0.0, 1.0), "label_accuracy": (0.0, 1.0), "advantage": (-1.0, 1.0), "ssim": (-1.0, 1.0),
    "mse": (0.0, None), **{name: (0.0, None) for name in EPSILON_METRICS},
}


def _within(low: float | None, high: float | None) -> dict[str, Any]:
    """The schema of an :class:`Estimate` whose numbers lie in [low, high] (null allowed)."""
    bounds = {**({"minimum": low} if low is not None else {}), **({"maximum": high} if high is not None else {})}
    return {"properties": {name: bounds for name in ("value", "ci_low", "ci_high")}}
_SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class Estimate:
    """A figure with its 95 % interval (null bounds where none applies)."""

    value: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class MeanOverRuns(Estimate):
    """The mean over the runs with a Student-t 95 % interval; ``per_run`` lists the finite values
    (written when there are two or more)."""

    runs: int = field(default=0, metadata={"min": 0, "help": "runs averaged (including runs without a finite value)"})
    per_run: list[float] | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class Utility:
    test_accuracy: MeanOverRuns
    test_loss: MeanOverRuns


@dataclass(frozen=True)
class Sharpness:
    """Mean rise of the training loss at each radius of weight perturbation (flatness: Shi et al. 2023, Fig. 3)."""

    radii: list[float] = field(metadata={"json_schema": {"minItems": 1}})
    mean_rise: list[float | None] = field(metadata={"json_schema": {"minItems": 1}})
    max_rise: list[float | None]


@dataclass(frozen=True)
class Robustness:
    """Test accuracy under Gaussian weight noise of each standard deviation."""

    stds: list[float]
    accuracy: list[float | None]
    accuracy_drop: list[float | None]


@dataclass(frozen=True)
class Diagnostics:
    """Per-experiment diagnostics (Shi et al. 2023, §6.3 and Table IV): train/test gap, clipping, update norms, flatness."""

    train_accuracy: MeanOverRuns
    generalization_gap: MeanOverRuns
    clip_fraction: MeanOverRuns
    update_norm_median_first_round: MeanOverRuns
    update_norm_median_last_round: MeanOverRuns
    bits_up_per_client_round: MeanOverRuns | None = field(default=None, metadata={
        **_OPTIONAL, "help": "exact bits a participating client sends per round (Kerkouche et al. 2021's bandwidth)"})
    bits_down_per_client_round: MeanOverRuns | None = field(default=None, metadata={
        **_OPTIONAL, "help": "exact bits a participating client receives per round (Kerkouche et al. 2021's bandwidth)"})
    sharpness: Sharpness | None = field(default=None, metadata=_OPTIONAL)
    robustness: Robustness | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class Roc:
    """A log-spaced subsample of the ROC curve (members are the positive class)."""

    fpr: list[float] = field(metadata={"max": 1.0})
    tpr: list[float] = field(metadata={"max": 1.0})


@dataclass(frozen=True)
class Figure:
    title: str
    png: str = field(metadata={"json_schema": {"contentEncoding": "base64"}})
    caption: str


@dataclass(frozen=True)
class Power:
    """What the audit could show against the bound (audit.core.audit_power): simulated with the
    design's coins against a mechanism exactly as private as the bound, and one twice as leaky."""

    canaries: int = field(metadata={"min": 0, "help": "independent coins the one-run count uses"})
    level: float = field(metadata={"min": 0.0, "max": 1.0, "help": "Bonferroni level of the family (conservative for Holm)"})
    tight_bound: float = field(metadata={"help": "median ε_LB when the mechanism is exactly as private as the bound"})
    detection: float = field(metadata={"min": 0.0, "max": 1.0,
                                       "help": "probability of a violation verdict at twice the bound's ε"})
    needed: int | None = field(metadata={"help": "coins for 80 % detection (normal approximation); null: none up to 10⁵"})
    simulations: int | None = field(default=None, metadata={
        **_OPTIONAL, "min": 0, "help": "simulated audits behind detection (batches until it is 4 standard errors from 0.80, "
                                       "at most 2,000)"})
    detection_se: float | None = field(default=None, metadata={
        **_OPTIONAL, "min": 0.0, "help": "Monte-Carlo standard error of detection"})


@dataclass(frozen=True)
class Verdict:
    """Is one ε figure — or the mechanism itself — compatible with the claim? (:mod:`reports.soundness`)"""

    metric: str
    unit: str
    kind: VerdictKind = field(metadata={"help": "lower_bound or estimate: an ε figure; conformance: the canary uploads tested "
                                                "against the claimed clip and noise; parametric: the claimed μ tested on "
                                                "Gaussian canary scores (estimate-based, gated)"})
    measured: float | None = field(metadata={"help": "the figure compared: a bound, or an estimate's interval's lower end "
                                                     "(parametric: the lower end of the ε of the canary the test is about)"})
    claimed: float | None = field(metadata={"help": "the claim's headline ε (null: no finite claim)"})
    bound: float | None = field(metadata={"help": "the ε the claim implies for this unit (null: not covered)"})
    bound_delta: float | None
    status: VerdictStatus
    text: str
    claim_relation: str | None = field(default=None, metadata={
        **_OPTIONAL, "help": "neighbouring relation of the claim (add-remove, replace-one, zero-out)"})
    design_relation: str | None = field(default=None, metadata={
        **_OPTIONAL, "help": "neighbouring relation of the measurement's design: what one inclusion coin changes"})
    p_value: float | None = field(default=None, metadata={
        **_OPTIONAL, "min": 0.0, "max": 1.0, "help": "p-value of 'the mechanism is as private as the bound' given the counts"})
    family: int | None = field(default=None, metadata={
        **_OPTIONAL, "min": 1, "help": "ε figures of the experiment corrected together (Holm–Bonferroni)"})
    level: float | None = field(default=None, metadata={
        **_OPTIONAL, "min": 0.0, "max": 1.0, "help": "the Holm-adjusted level this figure's p-value was compared with"})
    power: Power | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class AttackRecord:
    """One attack's metrics on one experiment, with a verdict per ε figure."""

    __json_schema__: ClassVar[dict[str, Any]] = {  # membership and canary attacks always report the ROC figures
        "if": {"properties": {"kind": {"enum": ["membership", "canary"]}}},
        "then": {"properties": {"metrics": {"required": ["auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%"]}}},
        # each figure within what it can be (an edited AUC of 7.5 is refused, not judged)
        "allOf": [{"properties": {"metrics": {"properties": {name: _within(*bounds) for name, bounds in METRIC_RANGES.items()},
                                              "patternProperties": {"[.](accuracy|macro_f1)$": _within(0.0, 1.0),
                                                                    "[.]advantage$": _within(-1.0, 1.0)}}}}],
    }

    attack: str = field(metadata=_NAME)
    unit: str
    notes: str
    metrics: dict[str, Estimate]
    epsilon_kind: dict[str, EpsilonKind] = field(metadata={"json_schema": {"propertyNames": {"enum": list(EPSILON_METRICS)}}})
    roc: Roc
    kind: Literal["membership", "canary", "run"]
    figures: list[Figure]
    verdicts: list[Verdict]
    observation: Observation | None = field(
        default=None, metadata={**_OPTIONAL, "help": "what the audit's statistic reads: the final model, every round's "
                                                      "global model, each canary's own upload, or the aggregate of "
                                                      "the rounds it joined"})
    adversary: Observer | None = field(default=None, metadata={
        **_OPTIONAL, "help": "the observer whose claim the verdicts compare with (null: the headline claim)"})
    statistic: str | None = field(default=None, metadata={**_OPTIONAL, "help": "the test statistic each canary is scored by"})


@dataclass(frozen=True)
class Skipped:
    attack: str
    reason: str


@dataclass(frozen=True)
class Diverged:
    """Where training diverged: the lowest-index membership run that did, the 1-based round it
    stopped at, and what was non-finite."""

    run: int = field(metadata={"min": 0})
    run_id: str
    round: int = field(metadata={"min": 1})
    what: str


@dataclass(frozen=True)
class Experiment:
    """One configuration (a defense at one ε) and its N membership runs, summarised."""

    __json_schema__: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"status": {"const": "diverged"}}, "required": ["status"]},
        "then": {"required": ["diverged"]},
    }

    key: str = field(metadata=_NAME)
    label: str = field(metadata=_NAME)
    defense: str = field(metadata=_NAME)
    reference: str
    params: dict[str, Any]
    training: dict[str, Any]
    target_epsilon: float | None
    claim: PrivacyClaim
    server_view: str
    utility: Utility
    rounds: list[dict[str, int | float | None]] = field(metadata={
        "help": "per round, the mean over runs of each metric logged (round: 1-based)",
        "json_schema": {"items": {"type": "object", "required": ["round"],
                                  "properties": {"round": {"type": "integer", "minimum": 1}},
                                  "additionalProperties": {"type": ["number", "null"]}}}})
    diagnostics: Diagnostics
    attacks: list[AttackRecord]
    soundness: VerdictStatus
    soundness_text: str
    skipped_attacks: list[Skipped]
    runs: list[str]
    canary_runs: dict[str, list[str]]
    status: Literal["completed", "diverged"] = field(metadata={
        "help": "diverged: a membership run's training turned non-finite; the experiment has no utility, "
                "attacks or diagnostics (see diverged, skipped_attacks)"})
    diverged: Diverged | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class Tool:
    name: Literal["dpfl-audit"]
    version: str
    dp_accounting: str | None


@dataclass(frozen=True)
class AuditInfo:
    """What was audited: the task, the partition, the model and the membership design."""

    name: str
    seed: int = field(metadata={"min": 0, "max": _SEED_MAX})
    dataset: str
    dataset_source: str
    kind: Literal["image", "tabular"]
    pool_size: int = field(metadata={"min": 0})
    test_size: int = field(metadata={"min": 0})
    clients: int = field(metadata={"min": 1})
    partition: str
    model: str
    model_parameters: int = field(metadata={"min": 0})
    membership_runs: int = field(metadata={"min": 1})
    membership_unit: Unit = field(metadata={"choices": MEMBERSHIP_UNITS})
    accounting: dict[str, Any]
    metric_definitions: dict[str, str]
    system: str | None = field(default=None, metadata={
        **_OPTIONAL, "help": "what was audited when dpfl-audit did not train it (audit.external): models, uploads or scores"})


@dataclass(frozen=True)
class Row:
    """One row of the tidy table (results.csv): one (experiment, attack, metric)."""

    run: str
    dataset: str
    defense: str
    label: str
    epsilon: float | None
    delta: float | None
    unit: str
    accountant: str
    seed: int
    attack: str = field(metadata={"help": "attack name, or none for utility rows"})
    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class Results:
    """What `dpfl-audit run` writes to results.json."""

    schema_version: str = field(metadata={"json_schema": {"const": SCHEMA_VERSION}})
    tool: Tool
    audit: AuditInfo
    config: dict[str, Any]
    versions: dict[str, Any]
    experiments: list[Experiment]
    rows: list[Row]


def results_schema() -> dict[str, Any]:
    """The JSON Schema of results.json, generated from :class:`Results`."""
    return json_schema(Results, **{"$id": "dpfl-audit/results.schema.json", "title": "dpfl-audit results.json"})


def write_schema(path: Path = SCHEMA_FILE) -> Path:
    """Write the published JSON Schema of results.json; returns the path."""
    write_text(path, dumps(results_schema()) + "\n")
    return path


if __name__ == "__main__":
    print(write_schema(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_FILE))
