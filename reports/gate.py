"""``dpfl-audit check``: hold an audit's ``results.json`` to a policy of rules — a CI gate.

Each rule of a policy (:mod:`reports.policy`) is evaluated against a results document and a
``--baseline`` into :class:`~reports.outcomes.Outcome` rows: printed as a table or JSON, written
as JUnit. Where a rule's figures are found: :mod:`reports.measures`; how ``no-regression`` decides:
:mod:`reports.regression`.

A rule that matches nothing in the new results (no experiment, no attack entry, no metric —
usually a typo) always fails, so a mistyped policy cannot pass silently. Within the experiments
a rule matches, an experiment without the named attack (an attack skipped for it) gives no
outcome.

**A rule that cannot fail is reported.** A threshold at or beyond the end of its metric's range
(:data:`reports.measures.METRIC_RANGES`: ``max auc 1.0``, or a no-regression threshold that the
baseline's noise puts at AUC 1.082), a no-violation rule over experiments none of whose ε figures
meets a finite claim, or a rule whose every comparison was skipped holds whatever the audit
measures. :func:`rule_warnings` names each such rule and why; ``check`` prints them, and the JSON
and JUnit outputs carry them. With ``strict`` (``--strict``) the outcomes that cannot fail fail,
so the check does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from audit.core.atomic import dumps, write_text
from audit.core.errors import UserInputError
from audit.core.vocabulary import VerdictStatus
from reports.document import Experiment, Results
from reports.junit import junit_xml
from reports.measures import blocks, cannot_fail, format_number, selected_experiments, selected_measures
from reports.outcomes import FAIL, PASS, SKIP, Outcome
from reports.policy import UTILITY, Policy, Rule, SoundnessRule, ThresholdRule, load_policy
from reports.regression import decide_regressions, evaluate_regression
from reports.results import load_results as read_results

__all__ = ["FAIL", "PASS", "SKIP", "RuleWarning", "check", "check_command", "evaluate_policy", "evaluate_rule",
           "load_results", "rule_warnings"]


# --------------------------------------------------------------------------- results


def load_results(path: str | Path, option: str = "RESULTS") -> Results:
    """A results document from a results directory (holding ``results.json``) or the file itself,
    validated against the results schema (:func:`reports.results.load_results`)."""
    return read_results(path, option)[0]


# --------------------------------------------------------------------------- evaluation


def _unmatched(rule: Rule, results: Results) -> Outcome | None:
    """A failing outcome when ``rule`` matches nothing in ``results`` (most often a typo), else None."""
    experiments = selected_experiments(rule, results)
    if not experiments:
        available = ", ".join(sorted({e.key for e in results.experiments})) or "none"
        defenses = ", ".join(sorted({e.defense for e in results.experiments})) or "none"
        reason = (f"rule matched no experiment ({rule.scope()}); experiments: {available}; defenses: {defenses}")
        return Outcome(rule.name, rule.kind, rule.scope() or "all experiments", FAIL, None, None, "", reason)
    if isinstance(rule, SoundnessRule):
        return None
    measures, names, attack_matched = selected_measures(rule, experiments)
    if measures:
        return None
    scope = f" in {rule.scope()}" if rule.scope() else ""
    if not attack_matched:
        listed = ", ".join(sorted(names - {UTILITY}) + ["none (utility)"])
        reason = f"rule matched no attack '{rule.attack}'{scope}; attacks: {listed}"
    else:
        metrics = sorted({m for e in experiments for n, block in blocks(e)
                          if rule.attack is None or n == rule.attack for m in block})
        where = f" of {rule.attack}" if rule.attack else ""
        reason = f"rule matched no metric {', '.join(rule.metrics)}{where}{scope}; metrics: {', '.join(metrics) or 'none'}"
    target = " ".join(p for p in (rule.scope(), rule.attack and f"attack {rule.attack}",
                                  f"metric {', '.join(rule.metrics)}") if p)
    return Outcome(rule.name, rule.kind, target, FAIL, None, None, "", reason)


def _evaluate_threshold(rule: ThresholdRule, experiments: list[Experiment]) -> list[Outcome]:
    outcomes = []
    measures, _, _ = selected_measures(rule, experiments)
    is_max = rule.kind == "max"
    relation, bound = ("≤", "maximum") if is_max else ("≥", "minimum")
    basis = "" if rule.use == "value" else rule.use
    for measure in measures:
        number = measure.number(rule.use)
        if number is None:
            missing = "no measurement" if measure.value is None else f"no {rule.use} (no interval)"
            sentence = f"{measure.described}: {missing}, so the {bound} {rule.value:g} cannot be checked"
            outcomes.append(Outcome(rule.name, rule.kind, measure.target, FAIL, None, rule.value, relation,
                                    sentence, basis, metric=measure.metric))
            continue
        holds = number <= rule.value if is_max else number >= rule.value
        what = measure.described if rule.use == "value" else f"the {rule.use} of {measure.described}"
        if holds:
            sentence = f"{what} is {format_number(number)}, within the {bound} {rule.value:g}"
        else:
            sentence = f"{what} is {format_number(number)}, {'above' if is_max else 'below'} the {bound} {rule.value:g}"
        if rule.use == "value" and measure.has_interval:
            sentence += f" (95 % interval [{format_number(measure.ci_low)}, {format_number(measure.ci_high)}])"
        outcomes.append(Outcome(rule.name, rule.kind, measure.target, PASS if holds else FAIL, number,
                                rule.value, relation, sentence, basis, metric=measure.metric))
    return outcomes


#: an experiment's soundness statuses under which none of its ε figures was compared with a finite
#: claim (no claim — an infinite ε —, a claim that rules out nothing, a claim for another unit or
#: relation, no figure): no-violation can never fail on it
UNTESTED = (VerdictStatus.NO_CLAIM, VerdictStatus.VACUOUS, VerdictStatus.NOT_COVERED, VerdictStatus.NO_MEASUREMENT)


def _evaluate_soundness(rule: SoundnessRule, experiments: list[Experiment]) -> list[Outcome]:
    failing: tuple[VerdictStatus, ...] = (VerdictStatus.VIOLATION,)
    if rule.warnings == "fail":
        failing += (VerdictStatus.ESTIMATE_ABOVE,)
    if rule.require_power:
        failing += (VerdictStatus.INCONCLUSIVE,)
    outcomes = []
    for experiment in experiments:
        status, name = experiment.soundness, experiment.label or experiment.key
        verdict = FAIL if status in failing else PASS
        because = experiment.soundness_text
        sentence = f"{name}: soundness {status}" + (f" — {because}" if because else "")
        if verdict == PASS and status == VerdictStatus.ESTIMATE_ABOVE:
            sentence += " (a warning; this rule fails on warnings only with `warnings: fail`)"
        if verdict == PASS and status == VerdictStatus.INCONCLUSIVE:
            sentence += " (no violation, but too little power to find one; this rule fails on it with `require_power: true`)"
        untested = f"{experiment.key}: {status}" if status in UNTESTED else ""
        outcomes.append(Outcome(rule.name, rule.kind, experiment.key, verdict, status, " or ".join(failing), "not",
                                sentence, cannot_fail=untested))
    return outcomes



def evaluate_rule(rule: Rule, results: Results, baseline: Results | None = None) -> list[Outcome]:
    """The outcomes of one rule: one per matched target, or one failure when it matches nothing."""
    unmatched = _unmatched(rule, results)
    if unmatched is not None:
        return [unmatched]
    experiments = selected_experiments(rule, results)
    if isinstance(rule, ThresholdRule):
        return _evaluate_threshold(rule, experiments)
    if isinstance(rule, SoundnessRule):
        return _evaluate_soundness(rule, experiments)
    return evaluate_regression(rule, experiments, baseline)


def _marked(outcome: Outcome) -> Outcome:
    """A measured max/min/no-regression outcome with ``cannot_fail`` set when its threshold lies at
    or beyond the end of its metric's range (after Holm has fixed the regression thresholds)."""
    if (outcome.verdict == SKIP or not outcome.metric or outcome.value is None or outcome.relation not in ("≤", "≥")
            or isinstance(outcome.threshold, (bool, str)) or outcome.threshold is None):
        return outcome
    use = outcome.value_basis if outcome.kind in ("max", "min") else "value"
    return replace(outcome, cannot_fail=cannot_fail(outcome.metric, outcome.relation, float(outcome.threshold),
                                                    use or "value"))


def evaluate_policy(policy: Policy, results: Results, baseline: Results | None = None,
                    strict: bool = False) -> list[Outcome]:
    """Every rule's outcomes, in policy order (then experiment, attack and metric order of the
    results); the regressions of all rules decided as one family (:func:`decide_regressions`);
    each outcome that holds whatever was measured marked (``cannot_fail``). With ``strict``, the
    outcomes behind each of :func:`rule_warnings` fail."""
    return judge_policy(policy, results, baseline, strict)[0]


def judge_policy(policy: Policy, results: Results, baseline: Results | None = None,
                 strict: bool = False) -> tuple[list[Outcome], list[RuleWarning]]:
    """:func:`evaluate_policy`'s outcomes and the :func:`rule_warnings` they give (read before
    ``strict`` turns the outcomes behind them into failures)."""
    outcomes = decide_regressions([outcome for rule in policy.rules for outcome in evaluate_rule(rule, results, baseline)])
    outcomes = [_marked(outcome) for outcome in outcomes]
    warnings = rule_warnings(policy, outcomes)
    return (strict_outcomes(outcomes, warnings) if strict else outcomes), warnings


# --------------------------------------------------------------------------- rules that cannot fail


@dataclass(frozen=True)
class RuleWarning:
    """A rule that cannot fail, wholly or in part: its place in the policy (``rules[index]``, as the
    policy's error messages count), name, and why; ``targets``: the outcomes it concerns."""

    index: int
    rule: str
    text: str
    targets: tuple[str, ...]

    @property
    def line(self) -> str:
        return f"warning: rules[{self.index}] ({self.rule}): {self.text}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets)}


def _listed(items: list[str], most: int = 3) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _warning(index: int, rule: Rule, outcomes: list[Outcome]) -> RuleWarning | None:
    checked = [o for o in outcomes if o.verdict != SKIP]
    untested = [o for o in checked if o.cannot_fail]
    if not checked:
        why = ", ".join(dict.fromkeys(o.threshold_basis or "missing data" for o in outcomes))
        return RuleWarning(index, rule.name, f"cannot fail: it checked nothing, every comparison was skipped ({why})",
                           tuple(o.target for o in outcomes))
    reasons = list(dict.fromkeys(o.cannot_fail for o in untested))
    if untested and len(untested) == len(checked):
        if isinstance(rule, SoundnessRule):
            text = f"cannot fail: no ε figure meets a finite claim ({_listed(reasons)})"
        else:
            text = f"cannot fail, {_listed(reasons)}"
        return RuleWarning(index, rule.name, text, tuple(o.target for o in untested))
    if untested and not isinstance(rule, SoundnessRule):  # a no-claim reference beside claimed experiments is expected
        thresholds = [f"{o.target} {o.relation} {format_number(o.threshold)}" for o in untested]  # type: ignore[arg-type]
        return RuleWarning(index, rule.name, f"{len(untested)} of {len(checked)} checks cannot fail: "
                                             f"{_listed(thresholds)} ({_listed(reasons)})", tuple(o.target for o in untested))
    return None


def rule_warnings(policy: Policy, outcomes: list[Outcome]) -> list[RuleWarning]:
    """The rules of ``policy`` that cannot fail on these outcomes, in policy order: every outcome
    (or, for max, min and no-regression, some) holds whatever the audit measures — a threshold at or
    beyond the end of the metric's range (``auc ≤ 1``), a no-violation rule on experiments without a
    finite claim — or the rule checked nothing (every comparison skipped). A rule that matches
    nothing at all is not among them: it fails outright."""
    by_rule: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_rule.setdefault(outcome.rule, []).append(outcome)
    found = [_warning(index, rule, by_rule[rule.name]) for index, rule in enumerate(policy.rules) if rule.name in by_rule]
    return [warning for warning in found if warning is not None]


def strict_outcomes(outcomes: list[Outcome], warnings: list[RuleWarning]) -> list[Outcome]:
    """``--strict``: each outcome one of ``warnings`` concerns fails, its sentence saying why."""
    concerned = {(w.rule, target): w for w in warnings for target in w.targets}
    failed = []
    for outcome in outcomes:
        warning = concerned.get((outcome.rule, outcome.target))
        if warning is not None and outcome.verdict != FAIL:
            why = f"it cannot fail ({outcome.cannot_fail})" if outcome.cannot_fail else "its rule checked nothing"
            outcome = replace(outcome, verdict=FAIL, sentence=f"{outcome.sentence} — fails under --strict: {why}")
        failed.append(outcome)
    return failed


# --------------------------------------------------------------------------- output


def check(results: str | Path | Results, policy: str | Path | Policy,
          baseline: str | Path | Results | None = None, strict: bool = False) -> list[Outcome]:
    """The outcomes of a policy on an audit's results (public API; ``dpfl-audit check`` without
    printing): ``results``/``baseline`` a results folder, its results.json, or the document;
    ``policy`` a policy file or a parsed :class:`Policy`. The gate passes when no outcome is FAIL.
    An outcome that holds whatever was measured carries the reason in ``cannot_fail``
    (:func:`rule_warnings` names the rules); with ``strict`` it fails instead."""
    document = results if isinstance(results, Results) else load_results(results)
    old = baseline if baseline is None or isinstance(baseline, Results) else load_results(baseline, "--baseline")
    rules = policy if isinstance(policy, Policy) else load_policy(policy)
    return evaluate_policy(rules, document, old, strict=strict)


def _cell(number: float | str | None, basis: str) -> str:
    text = number if isinstance(number, str) else format_number(number)
    return f"{text} ({basis})" if basis else text


def format_table(outcomes: list[Outcome]) -> str:
    """A plain-text table — verdict, rule, target, value, threshold — then one line per failing
    outcome with its sentence (a skipped outcome's reason is in its threshold cell)."""
    header = ("verdict", "rule", "target", "value", "threshold")
    rows = [(o.verdict.upper(), o.rule, o.target, _cell(o.value, o.value_basis),
             f"{o.relation} {_cell(o.threshold, o.threshold_basis)}".strip() if o.threshold is not None or o.threshold_basis
             else "—") for o in outcomes]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    notes = [f"{o.verdict.upper()} {o.rule} — {o.target}: {o.sentence}" for o in outcomes if o.verdict == FAIL]
    return "\n".join(lines + ([""] + notes if notes else []))


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    return {verdict: sum(o.verdict == verdict for o in outcomes) for verdict in (PASS, FAIL, SKIP)}


def failing_rules(outcomes: list[Outcome]) -> list[str]:
    """Names of the rules with at least one failing outcome, in policy order, each once."""
    return list(dict.fromkeys(o.rule for o in outcomes if o.verdict == FAIL))


def summary_line(outcomes: list[Outcome], warnings: list[RuleWarning] | None = None) -> str:
    tally = counts(outcomes)
    skipped = f" ({tally[SKIP]} skipped)" if tally[SKIP] else ""
    failed = failing_rules(outcomes)
    toothless = (f"; {len(warnings)} rule{'s' if len(warnings) > 1 else ''} cannot fail (warnings above)"
                 if warnings else "")
    if failed:
        # the total counts the checks that were decided, as "all N checks hold" does: a skipped one is neither
        return (f"check FAILED: {tally[FAIL]} of {tally[PASS] + tally[FAIL]} checks fail{skipped}; failing rules: "
                + "; ".join(f"'{name}'" for name in failed) + toothless)
    return f"check passed: all {tally[PASS]} checks hold{skipped}{toothless}"


def _check_junit_path(path: Path) -> None:
    """``--junit FILE`` must name a file in a folder that exists: the check creates no folders
    (the atomic writer would), so a typo cannot scatter files outside what the user named."""
    if path.is_dir():
        raise UserInputError(f"--junit: '{path}' is a directory; give a file name such as junit.xml")
    folder = path.parent
    if not folder.exists():
        raise UserInputError(f"--junit: folder '{folder}' does not exist; create it or give a file in an existing folder")
    if not folder.is_dir():
        raise UserInputError(f"--junit: '{folder}' is not a folder; give a file in an existing folder")


def check_command(results_path: str, policy_path: str, baseline_path: str | None = None,
                  junit_path: str | None = None, as_json: bool = False, strict: bool = False) -> bool:
    """``dpfl-audit check``: load and validate everything first (a :class:`UserInputError` leaves
    nothing written), evaluate, print a table or JSON — with a warning for each rule that cannot
    fail —, write JUnit XML if asked; True when every rule holds (skipped outcomes do not fail;
    with ``strict``, a rule that cannot fail does)."""
    if junit_path is not None:
        _check_junit_path(Path(junit_path))
    policy = load_policy(policy_path)
    results = load_results(results_path, "RESULTS")
    baseline = load_results(baseline_path, "--baseline") if baseline_path is not None else None
    outcomes, warnings = judge_policy(policy, results, baseline, strict)
    passed = not failing_rules(outcomes)
    if junit_path is not None:
        write_text(junit_path, junit_xml(outcomes))
    if as_json:
        print(dumps({"passed": passed, "strict": strict, "policy": str(policy_path), "results": str(results_path),
                     "baseline": None if baseline_path is None else str(baseline_path), "counts": counts(outcomes),
                     "failing_rules": failing_rules(outcomes), "warnings": [w.as_dict() for w in warnings],
                     "outcomes": [o.as_dict() for o in outcomes]}))
    else:
        print(format_table(outcomes))
        for warning in warnings:
            print(warning.line)
        print(summary_line(outcomes, warnings))
    return passed
