"""The policy file of ``dpfl-audit check``: rules to hold an audit's ``results.json`` to.

A policy is a YAML file (see ``examples/policy.yaml``)::

    version: 1                      # optional; 1 is the only version
    rules:
      - kind: no-violation          # no experiment's soundness verdict is "violation"
      - kind: max                   # an attack metric must not exceed a threshold
        attack: lira-online
        metric: auc
        value: 0.6
        experiment: dp-fedavg-eps1  # an experiment's key or label; or `defense:` for all of a defense
      - kind: min                   # a metric must be at least a threshold (utility: attack omitted or `none`)
        metric: test_accuracy
        value: 0.85
        defense: fedavg
      - kind: no-regression         # against --baseline, beyond statistical noise
        defense: dp-fedavg

Fields every rule may have: ``kind`` (required), ``name`` (default: derived from the rule),
``defense`` (a defense name, e.g. ``dp-fedavg``) and ``experiment`` (an experiment's ``key``
or ``label``); without either a rule applies to every experiment. Where a rule takes
``attack``, it names an attack entry of results.json (``lira-online``,
``attribute-inference-sex``, ...), ``none`` for the experiment's utility block
(``test_accuracy``, ``test_loss``; as in results.csv), and, when omitted, means every attack
entry and the utility block — whichever carry the metric, less those listed in
``exclude_attacks`` (e.g. ``[dirac-canaries-each-upload]``: a figure at the end of its range,
which no rule on it can fail).

* ``max`` / ``min`` (:class:`ThresholdRule`): ``metric`` and ``value`` required; ``use: value |
  ci_low | ci_high`` (default ``value``) picks which number of the estimate is compared —
  ``use: ci_high`` with ``max`` demands that the whole 95 % interval stays below the threshold,
  not only the point estimate. A missing number (no interval, no measurement) fails: the gate
  cannot vouch for it.
* ``no-violation`` (:class:`SoundnessRule`): ``warnings: ignore | fail`` (default ``ignore``);
  with ``fail`` an "estimate above claim" (a Gaussian-fit ε estimate whose interval lies above
  the claim — a warning, not a proof; reports.soundness) fails too.
* ``no-regression`` (:class:`RegressionRule`): compares with the experiment of the same ``key``
  in ``--baseline``. ``metric`` (one) or ``metrics`` (a list; default the membership metrics
  ``auc`` and ``tpr_at_fpr_1%``; ε lower bounds are held to the claim by ``no-violation``), ``tolerance`` (default 0.02, in the
  metric's own units, used only where an interval is missing), ``worse: higher | lower``
  (default: by metric — lower is worse for ``test_accuracy``, ``train_accuracy``, ``mse`` and
  ``mae``, higher is worse for everything else), ``require`` (default false: missing data is
  skipped, not failed). How rules are evaluated: :mod:`reports.gate`.

The file is read with the strict YAML loader of the config (:mod:`audit.core.strict_yaml`) and
validated by the config's schema mechanism (:func:`audit.core.schema.from_mapping`): one
dataclass per rule kind, chosen by ``kind``. Every malformed policy — unknown field, wrong
type, unknown rule kind, missing field — raises :class:`~audit.core.errors.UserInputError`
naming the field path and the allowed values, e.g.
``rules[2].kind: 'maxx' is not allowed; allowed: max, min, no-violation, no-regression``
(rules are counted from 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from audit.core.errors import UserInputError
from audit.core.schema import MAX_LABEL, coerce, from_mapping
from audit.core.strict_yaml import read_yaml_file

RuleKind = Literal["max", "min", "no-violation", "no-regression"]
DEFAULT_REGRESSION_METRICS = ("auc", "tpr_at_fpr_1%")  # ε lower bounds are held to the claim (no-violation)
DEFAULT_TOLERANCE = 0.02
UTILITY = "none"  # the attack name of utility rows in results.csv

_SCOPE = "without defense and experiment a rule applies to every experiment"


@dataclass(frozen=True, kw_only=True)
class _Rule:
    """The fields every rule has; a rule's ``name`` is derived from the rule when not given."""

    kind: str = field(metadata={"help": "max, min, no-violation or no-regression"})
    name: str = field(default="", metadata={"help": "shown in the outcome table and JUnit (default: derived)",
                                            "max_chars": MAX_LABEL})
    defense: str | None = field(default=None, metadata={"help": f"a defense name; {_SCOPE}"})
    experiment: str | None = field(default=None, metadata={"help": f"an experiment's key or label; {_SCOPE}"})

    def scope(self) -> str:
        """The rule's filters in words, e.g. ``defense dp-fedavg``; empty when it covers everything."""
        parts = [f"defense {self.defense}" if self.defense else "", f"experiment {self.experiment}" if self.experiment else ""]
        return ", ".join(p for p in parts if p)


_ATTACK_HELP = "an attack entry of results.json, `none` for utility; default: every attack and utility"
_EXCLUDE_HELP = "attack entries left out where `attack` is omitted (e.g. one whose figure is at the end of its range)"


@dataclass(frozen=True, kw_only=True)
class ThresholdRule(_Rule):
    """``max`` / ``min``: a metric must not exceed / must reach ``value``."""

    kind: Literal["max", "min"]
    attack: str | None = field(default=None, metadata={"help": _ATTACK_HELP})
    exclude_attacks: tuple[str, ...] = field(default=(), metadata={"help": _EXCLUDE_HELP})
    metric: str = field(metadata={"help": "a metric name of results.json, e.g. auc, test_accuracy"})
    value: float = field(metadata={"help": "the threshold"})
    use: Literal["value", "ci_low", "ci_high"] = field(default="value", metadata={
        "help": "which number of the estimate is compared"})

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric,)


@dataclass(frozen=True, kw_only=True)
class SoundnessRule(_Rule):
    """``no-violation``: no experiment's soundness verdict is a violation (or, if asked, a warning,
    or an audit without the power to find one)."""

    kind: Literal["no-violation"]
    warnings: Literal["ignore", "fail"] = field(default="ignore", metadata={
        "help": "fail: an 'estimate above claim' warning fails too"})
    require_power: bool = field(default=False, metadata={
        "help": "true: an 'inconclusive' verdict (no violation, but < 80 % power to detect twice the claimed ε) fails too"})


@dataclass(frozen=True, kw_only=True)
class RegressionRule(_Rule):
    """``no-regression``: no metric worse than in ``--baseline`` beyond statistical noise."""

    kind: Literal["no-regression"]
    attack: str | None = field(default=None, metadata={"help": _ATTACK_HELP})
    exclude_attacks: tuple[str, ...] = field(default=(), metadata={"help": _EXCLUDE_HELP})
    metric: str | None = field(default=None, metadata={"help": "one metric (or give metrics)"})
    metrics: tuple[str, ...] = field(default=DEFAULT_REGRESSION_METRICS, metadata={
        "min_length": 1, "help": "the metrics compared (after parsing: also a lone `metric`)"})
    tolerance: float = field(default=DEFAULT_TOLERANCE, metadata={
        "min": 0, "help": "in the metric's units; used only where an interval is missing"})
    worse: Literal["higher", "lower"] | None = field(default=None, metadata={"help": "default: by metric"})
    require: bool = field(default=False, metadata={"help": "true: missing data fails instead of being skipped"})


Rule = ThresholdRule | SoundnessRule | RegressionRule
_RULE_TYPES: dict[str, type[Rule]] = {"max": ThresholdRule, "min": ThresholdRule, "no-violation": SoundnessRule,
                                      "no-regression": RegressionRule}


@dataclass(frozen=True, kw_only=True)
class _PolicyFile:
    """The file as written; each rule is validated by the dataclass of its kind (:func:`_parse_rule`)."""

    version: Literal[1] = field(default=1, metadata={"help": "the policy format; 1 is the only version"})
    rules: list[dict[str, Any]] = field(metadata={"min_length": 1, "help": "the rules, evaluated in order"})


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    version: int = 1
    source: str = "policy"


def _derived_name(rule: Rule) -> str:
    scope = f" on {rule.defense or rule.experiment}" if (rule.defense or rule.experiment) else ""
    if rule.defense and rule.experiment:
        scope = f" on {rule.experiment} ({rule.defense})"
    if not isinstance(rule, SoundnessRule) and rule.exclude_attacks:
        scope = f"{scope} except {', '.join(rule.exclude_attacks)}"
    if isinstance(rule, ThresholdRule):
        attack = "utility" if rule.attack == UTILITY else rule.attack
        measure = " ".join(p for p in (attack, rule.metric, None if rule.use == "value" else rule.use) if p)
        return f"{measure} {'≤' if rule.kind == 'max' else '≥'} {rule.value:g}{scope}"
    if isinstance(rule, SoundnessRule):
        return f"no soundness violation{' or warning' if rule.warnings == 'fail' else ''}{scope}"
    attack = "" if rule.attack is None else f" of {'utility' if rule.attack == UTILITY else rule.attack}"
    return f"no regression{attack} in {', '.join(rule.metrics)}{scope}"


def _check_names(entry: dict[str, Any], path: str) -> None:
    """What the types cannot say: a name (of a rule, defense, experiment, attack, metric) is not blank."""
    for key, value in entry.items():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str) and not item.strip():
                where = f"{path}.{key}[{i}]" if isinstance(value, list) else f"{path}.{key}"
                raise UserInputError(f"{where}: must be a non-empty string, got {item!r}")


def _parse_rule(entry: dict[str, Any], index: int) -> Rule:
    """One rule, validated by the dataclass of its ``kind``; its name derived when not given."""
    path = f"rules[{index}]"
    if "kind" not in entry:
        raise UserInputError(f"{path}.kind: required field is missing; allowed: {', '.join(get_args(RuleKind))}")
    rule = from_mapping(_RULE_TYPES[coerce(RuleKind, entry["kind"], f"{path}.kind")], entry, path)
    _check_names(entry, path)
    if isinstance(rule, (ThresholdRule, RegressionRule)) and rule.exclude_attacks and rule.attack is not None:
        raise UserInputError(f"{path}.exclude_attacks: give either attack (one) or exclude_attacks (every other), not both")
    if isinstance(rule, RegressionRule):
        if "metric" in entry and "metrics" in entry:
            raise UserInputError(f"{path}.metrics: give either metric (one) or metrics (a list), not both")
        if len(set(rule.metrics)) != len(rule.metrics):
            raise UserInputError(f"{path}.metrics: a metric is listed twice: {', '.join(rule.metrics)}")
        if rule.metric is not None:
            rule = replace(rule, metrics=(rule.metric,))
    return rule if rule.name else replace(rule, name=_derived_name(rule))


def parse_policy(document: Any, source: str = "policy") -> Policy:
    """Validate a policy already read from YAML; raises :class:`UserInputError` on any problem."""
    if document is not None and not isinstance(document, dict):
        raise UserInputError(f"{source}: expected a mapping with 'rules', got {type(document).__name__}")
    policy = from_mapping(_PolicyFile, document)
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(policy.rules):
        rule = _parse_rule(entry, index)
        if rule.name in seen:
            if "name" in entry:
                raise UserInputError(f"rules[{index}].name: '{rule.name}' is already the name of rules[{seen[rule.name]}]")
            rule = replace(rule, name=f"{rule.name} #{index}")
        seen[rule.name] = index
        rules.append(rule)
    return Policy(rules=tuple(rules), version=int(policy.version), source=source)


def load_policy(path: str | Path, option: str = "--policy") -> Policy:
    """Read and validate a policy YAML file, strictly (:func:`audit.core.strict_yaml.read_yaml_file`: UTF-8
    text only, no duplicate keys, no lone surrogates)."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{option}: file '{path}' does not exist")
    document = read_yaml_file(path, f"{option}: '{path}' is not valid YAML")
    return parse_policy(document, str(path))
