"""``dpfl-audit check``: hold an audit's ``results.json`` to a policy of rules — a CI gate.

Each rule of a policy (:mod:`reports.policy`) is evaluated against a results document and a
``--baseline`` into :class:`~reports.outcomes.Outcome` rows: printed as a table or JSON, written
as JUnit. Where a rule's figures are found: :mod:`reports.measures`; how ``no-regression`` decides:
:mod:`reports.regression`.

A rule that matches nothing in the new results (no experiment, no attack entry, no metric —
usually a typo) always fails, so a mistyped policy cannot pass silently. Within the experiments
a rule matches, an experiment without the named attack (an attack skipped for it) gives no
outcome.
"""

from __future__ import annotations

from pathlib import Path

from audit.core.atomic import dumps, write_text
from audit.core.errors import UserInputError
from audit.core.vocabulary import VerdictStatus
from reports.document import Experiment, Results
from reports.junit import junit_xml
from reports.measures import blocks, format_number, selected_experiments, selected_measures
from reports.outcomes import FAIL, PASS, SKIP, Outcome
from reports.policy import UTILITY, Policy, Rule, SoundnessRule, ThresholdRule, load_policy
from reports.regression import decide_regressions, evaluate_regression
from reports.results import load_results as read_results

__all__ = ["FAIL", "PASS", "SKIP", "check", "check_command", "evaluate_policy", "evaluate_rule", "load_results"]


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
                                    sentence, basis))
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
                                rule.value, relation, sentence, basis))
    return outcomes


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
        outcomes.append(Outcome(rule.name, rule.kind, experiment.key, verdict, status, " or ".join(failing), "not",
                                sentence))
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


def evaluate_policy(policy: Policy, results: Results, baseline: Results | None = None) -> list[Outcome]:
    """Every rule's outcomes, in policy order (then experiment, attack and metric order of the
    results); the regressions of all rules decided as one family (:func:`decide_regressions`)."""
    return decide_regressions([outcome for rule in policy.rules for outcome in evaluate_rule(rule, results, baseline)])


# --------------------------------------------------------------------------- output


def check(results: str | Path | Results, policy: str | Path | Policy,
          baseline: str | Path | Results | None = None) -> list[Outcome]:
    """The outcomes of a policy on an audit's results (public API; ``dpfl-audit check`` without
    printing): ``results``/``baseline`` a results folder, its results.json, or the document;
    ``policy`` a policy file or a parsed :class:`Policy`. The gate passes when no outcome is FAIL."""
    document = results if isinstance(results, Results) else load_results(results)
    old = baseline if baseline is None or isinstance(baseline, Results) else load_results(baseline, "--baseline")
    rules = policy if isinstance(policy, Policy) else load_policy(policy)
    return evaluate_policy(rules, document, old)


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


def summary_line(outcomes: list[Outcome]) -> str:
    tally = counts(outcomes)
    skipped = f" ({tally[SKIP]} skipped)" if tally[SKIP] else ""
    failed = failing_rules(outcomes)
    if failed:
        return (f"check FAILED: {tally[FAIL]} of {len(outcomes)} checks fail{skipped}; failing rules: "
                + "; ".join(f"'{name}'" for name in failed))
    return f"check passed: all {tally[PASS]} checks hold{skipped}"


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
                  junit_path: str | None = None, as_json: bool = False) -> bool:
    """``dpfl-audit check``: load and validate everything first (a :class:`UserInputError` leaves
    nothing written), evaluate, print a table or JSON, write JUnit XML if asked; True when every
    rule holds (skipped outcomes do not fail)."""
    if junit_path is not None:
        _check_junit_path(Path(junit_path))
    policy = load_policy(policy_path)
    results = load_results(results_path, "RESULTS")
    baseline = load_results(baseline_path, "--baseline") if baseline_path is not None else None
    outcomes = evaluate_policy(policy, results, baseline)
    passed = not failing_rules(outcomes)
    if junit_path is not None:
        write_text(junit_path, junit_xml(outcomes))
    if as_json:
        print(dumps({"passed": passed, "policy": str(policy_path), "results": str(results_path),
                     "baseline": None if baseline_path is None else str(baseline_path), "counts": counts(outcomes),
                     "failing_rules": failing_rules(outcomes), "outcomes": [o.as_dict() for o in outcomes]}))
    else:
        print(format_table(outcomes))
        print(summary_line(outcomes))
    return passed
