"""``dpfl-audit check``: hold an audit's ``results.json`` to a policy of rules — a CI gate.

Each rule of a policy (:mod:`reports.policy`) is evaluated against a results document and a
``--baseline`` into :class:`~reports.outcomes.Outcome` rows: printed as a table or JSON, written as JUnit.

**Why a test with the intervals' standard errors decides a regression.** An audit's leakage
figures are estimates from a finite number of membership runs, targets and canaries: change
anything upstream — a seed, a refactor that draws random numbers in a different order, a new
dependency version — and AUC moves by a few hundredths with no change in the privacy of the
algorithm. A gate that compares point estimates therefore flakes. Every estimate in results.json
carries its 95 % interval, and those intervals include the randomness that two honest audits
differ by: the two-way bootstrap of the membership metrics resamples runs (training randomness)
and units (which records or clients were drawn), validated by simulation
(``benchmarks/coverage.py``); utility has a Student-t interval over runs. Each comparison is a
one-sided z-test of "the new figure is worse": the difference over
SE = √(SE_new² + SE_old²), each SE recovered from its interval as the wider half-width / 1.96
(conservative where the interval is a t interval or clipped at 0 or 1). All interval comparisons
of one check form one family, decided by Holm's step-down procedure at 5 %
(:func:`audit.core.multiplicity.holm`): two audits of the same code with different seeds fail
the gate with probability at most 5 %, however many metrics the policy compares (measured in
``benchmarks/gate_false_alarms.py``). Where an estimate has no two-sided interval (``ci_low`` or
``ci_high`` null or NaN — e.g. ``epsilon_one_run`` is a one-sided bound), the values are compared
with the absolute ``tolerance``, which has no noise model: ε lower bounds are judged against the
claim by ``no-violation`` and are not compared by default. Each outcome's sentence says which
test was used.

**Missing data.** An experiment, attack or metric of the new results that the baseline lacks
(a new defense, a new attack) or a missing value on either side gives a *skipped* outcome —
reported, not failed — and so does a no-regression rule as a whole when no ``--baseline`` is
given (one outcome for the rule, e.g. on the first CI run, before a baseline exists), unless
the rule says ``require: true``, which turns each of these into a failure. A rule that matches
nothing in the new results (no experiment, no attack entry, no metric — usually a typo) always
fails, so a mistyped policy cannot pass silently. Within the experiments a rule matches, an
experiment without the named attack (an attack skipped for it) gives no outcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from scipy.stats import norm

from audit.core.atomic import dumps, write_text
from audit.core.errors import UserInputError
from audit.core.multiplicity import holm
from reports.document import Estimate, Experiment, Results
from reports.junit import junit_xml
from reports.outcomes import Outcome
from reports.policy import (
    UTILITY,
    Policy,
    RegressionRule,
    Rule,
    SoundnessRule,
    ThresholdRule,
    load_policy,
)
from reports.results import load_results as read_results

#: metrics (or the last dotted part of one) for which a lower value is worse: utility, and
#: reconstruction errors (a smaller error means a better reconstruction, i.e. more leakage)
LOWER_IS_WORSE = frozenset({"test_accuracy", "train_accuracy", "mse", "mae"})

PASS, FAIL, SKIP = "pass", "fail", "skip"
#: family-wise error rate of one check's regression comparisons; the z of a two-sided 95 % interval
FAMILY_ALPHA, Z_95 = 0.05, float(norm.ppf(0.975))
VIOLATION, ESTIMATE_ABOVE, INCONCLUSIVE = "violation", "estimate above claim", "inconclusive"


# --------------------------------------------------------------------------- results


def load_results(path: str | Path, option: str = "RESULTS") -> Results:
    """A results document from a results directory (holding ``results.json``) or the file itself,
    validated against the results schema (:func:`reports.results.load_results`)."""
    return read_results(path, option)[0]


def _number_or_none(value: Any) -> float | None:
    """A finite float, or None for null, NaN, ±inf and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class _Measure:
    """One estimate of one metric of one experiment: (attack, metric) with its interval."""

    experiment: Experiment
    attack: str  # UTILITY for the utility block
    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None

    @property
    def target(self) -> str:
        return f"{self.experiment.key}/{'utility' if self.attack == UTILITY else self.attack}/{self.metric}"

    @property
    def described(self) -> str:
        where = "utility" if self.attack == UTILITY else self.attack
        return f"{self.metric} of {where} on {self.experiment.label or self.experiment.key}"

    def number(self, use: str) -> float | None:
        return {"value": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high}[use]

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None


def _blocks(experiment: Experiment) -> Iterator[tuple[str, dict[str, Estimate]]]:
    """(attack name, {metric: estimate}) for the utility block, then every attack entry, in file order."""
    yield UTILITY, {f.name: getattr(experiment.utility, f.name) for f in fields(experiment.utility)}
    for entry in experiment.attacks:
        yield entry.attack, entry.metrics


def _measure(experiment: Experiment, attack: str, metric: str, estimate: Estimate) -> _Measure:
    return _Measure(experiment, attack, metric, _number_or_none(estimate.value), _number_or_none(estimate.ci_low),
                    _number_or_none(estimate.ci_high))


def _find(experiment: Experiment | None, attack: str, metric: str) -> _Measure | None:
    if experiment is None:
        return None
    for name, metrics in _blocks(experiment):
        if name == attack and metric in metrics:
            return _measure(experiment, attack, metric, metrics[metric])
    return None


# --------------------------------------------------------------------------- evaluation


def _selected_experiments(rule: Rule, results: Results) -> list[Experiment]:
    return [e for e in results.experiments
            if (rule.defense is None or e.defense == rule.defense)
            and (rule.experiment is None or rule.experiment in (e.key, e.label))]


def _selected_measures(rule: ThresholdRule | RegressionRule,
                       experiments: list[Experiment]) -> tuple[list[_Measure], set[str], bool]:
    """The rule's (attack, metric) estimates in ``experiments``, in file order of experiments and
    attacks and rule order of metrics; also every block name seen and whether the attack matched."""
    measures, names, attack_matched = [], set(), False
    for experiment in experiments:
        for name, metrics in _blocks(experiment):
            names.add(name)
            if rule.attack is not None and name != rule.attack:
                continue
            attack_matched = True
            measures += [_measure(experiment, name, m, metrics[m]) for m in rule.metrics if m in metrics]
    return measures, names, attack_matched


def _format(number: float | None) -> str:
    return "—" if number is None else f"{number:.4g}"


def _interval(measure: _Measure) -> str:
    return f"{_format(measure.value)} [{_format(measure.ci_low)}, {_format(measure.ci_high)}]"


def _unmatched(rule: Rule, results: Results) -> Outcome | None:
    """A failing outcome when ``rule`` matches nothing in ``results`` (most often a typo), else None."""
    experiments = _selected_experiments(rule, results)
    if not experiments:
        available = ", ".join(sorted({e.key for e in results.experiments})) or "none"
        defenses = ", ".join(sorted({e.defense for e in results.experiments})) or "none"
        reason = (f"rule matched no experiment ({rule.scope()}); experiments: {available}; defenses: {defenses}")
        return Outcome(rule.name, rule.kind, rule.scope() or "all experiments", FAIL, None, None, "", reason)
    if isinstance(rule, SoundnessRule):
        return None
    measures, names, attack_matched = _selected_measures(rule, experiments)
    if measures:
        return None
    scope = f" in {rule.scope()}" if rule.scope() else ""
    if not attack_matched:
        listed = ", ".join(sorted(names - {UTILITY}) + ["none (utility)"])
        reason = f"rule matched no attack '{rule.attack}'{scope}; attacks: {listed}"
    else:
        metrics = sorted({m for e in experiments for n, block in _blocks(e)
                          if rule.attack is None or n == rule.attack for m in block})
        where = f" of {rule.attack}" if rule.attack else ""
        reason = f"rule matched no metric {', '.join(rule.metrics)}{where}{scope}; metrics: {', '.join(metrics) or 'none'}"
    target = " ".join(p for p in (rule.scope(), rule.attack and f"attack {rule.attack}",
                                  f"metric {', '.join(rule.metrics)}") if p)
    return Outcome(rule.name, rule.kind, target, FAIL, None, None, "", reason)


def _evaluate_threshold(rule: ThresholdRule, experiments: list[Experiment]) -> list[Outcome]:
    outcomes = []
    measures, _, _ = _selected_measures(rule, experiments)
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
            sentence = f"{what} is {_format(number)}, within the {bound} {rule.value:g}"
        else:
            sentence = f"{what} is {_format(number)}, {'above' if is_max else 'below'} the {bound} {rule.value:g}"
        if rule.use == "value" and measure.has_interval:
            sentence += f" (95 % interval [{_format(measure.ci_low)}, {_format(measure.ci_high)}])"
        outcomes.append(Outcome(rule.name, rule.kind, measure.target, PASS if holds else FAIL, number,
                                rule.value, relation, sentence, basis))
    return outcomes


def _evaluate_soundness(rule: SoundnessRule, experiments: list[Experiment]) -> list[Outcome]:
    failing: tuple[str, ...] = (VIOLATION, ESTIMATE_ABOVE) if rule.warnings == "fail" else (VIOLATION,)
    if rule.require_power:
        failing += (INCONCLUSIVE,)
    outcomes = []
    for experiment in experiments:
        status, name = experiment.soundness, experiment.label or experiment.key
        verdict = FAIL if status in failing else PASS
        because = experiment.soundness_text
        sentence = f"{name}: soundness {status}" + (f" — {because}" if because else "")
        if verdict == PASS and status == ESTIMATE_ABOVE:
            sentence += " (a warning; this rule fails on warnings only with `warnings: fail`)"
        if verdict == PASS and status == INCONCLUSIVE:
            sentence += " (no violation, but too little power to find one; this rule fails on it with `require_power: true`)"
        outcomes.append(Outcome(rule.name, rule.kind, experiment.key, verdict, status, " or ".join(failing), "not",
                                sentence))
    return outcomes


def _lower_is_worse(rule: RegressionRule, metric: str) -> bool:
    if rule.worse is not None:
        return rule.worse == "lower"
    return metric in LOWER_IS_WORSE or metric.rsplit(".", 1)[-1] in LOWER_IS_WORSE


def _standard_error(measure: _Measure) -> float:
    """The SE a 95 % interval implies: its wider half-width / 1.96 (the wider side, because an
    interval clipped at 0 or 1 is narrower on that side)."""
    assert measure.value is not None and measure.ci_low is not None and measure.ci_high is not None
    return max(measure.ci_high - measure.value, measure.value - measure.ci_low, 0.0) / Z_95


def _compare_with_baseline(rule: RegressionRule, new: _Measure, old: _Measure) -> Outcome:
    """One metric against its baseline: a one-sided test with the intervals' standard errors
    where both have one (decided later with the check's family, :func:`decide_regressions`), else
    the absolute ``rule.tolerance``."""
    lower_worse = _lower_is_worse(rule, new.metric)
    direction = "lower is worse" if lower_worse else "higher is worse"
    assert new.value is not None and old.value is not None
    if new.has_interval and old.has_interval:
        se = math.hypot(_standard_error(new), _standard_error(old))
        worse_by = old.value - new.value if lower_worse else new.value - old.value
        p_value = float(norm.sf(worse_by / se)) if se > 0 else (0.0 if worse_by > 0 else 1.0)
        comparison = (f"{new.described}: {_interval(new)} vs baseline {_interval(old)} ({direction}; worse by "
                      f"{_format(worse_by)}, SE of the difference {_format(se)}, one-sided p = {p_value:.2g})")
        return Outcome(rule.name, rule.kind, new.target, PASS, new.value, old.value, "≥" if lower_worse else "≤",
                       comparison, "", "baseline", p_value=p_value, se=se)
    tolerance = rule.tolerance
    if lower_worse:
        threshold, relation, regressed = old.value - tolerance, "≥", new.value < old.value - tolerance
    else:
        threshold, relation, regressed = old.value + tolerance, "≤", new.value > old.value + tolerance
    lacking = ("neither result has a two-sided interval" if not (new.has_interval or old.has_interval)
               else "the new result has no two-sided interval" if not new.has_interval
               else "the baseline has no two-sided interval")
    comparison = (f"{new.described}: {_format(new.value)} vs baseline {_format(old.value)} ({direction}; "
                  f"{lacking}, so the absolute tolerance {tolerance:g} was used)")
    verdict_text = (f"regression: worse by more than the tolerance {tolerance:g}" if regressed
                    else f"no regression beyond the tolerance {tolerance:g}")
    sign = "-" if lower_worse else "+"
    return Outcome(rule.name, rule.kind, new.target, FAIL if regressed else PASS, new.value, threshold, relation,
                   f"{comparison}: {verdict_text}", "", f"baseline {sign} tolerance {tolerance:g}")


def decide_regressions(outcomes: list[Outcome], alpha: float = FAMILY_ALPHA) -> list[Outcome]:
    """Holm's procedure at ``alpha`` over every interval comparison among ``outcomes`` (those with
    a p-value): a rejection is a regression. Each decided outcome's threshold becomes the baseline
    value plus the one-sided critical difference at its Holm level."""
    tested = [i for i, o in enumerate(outcomes) if o.p_value is not None and o.level is None]
    decisions = holm([float(outcomes[i].p_value or 0.0) for i in tested], alpha)
    decided = list(outcomes)
    for i, (rejected, level) in zip(tested, decisions):
        o = outcomes[i]
        assert isinstance(o.threshold, float) and o.se is not None
        margin = float(norm.isf(level)) * o.se
        threshold = o.threshold + (margin if o.relation == "≤" else -margin)
        side = "above" if o.relation == "≤" else "below"
        test = f"Holm level {level:.2g} over the check's {len(tested)} interval comparison(s)"
        text = (f"regression beyond statistical noise: p ≤ {test}" if rejected
                else f"no regression beyond statistical noise: p > {test}")
        decided[i] = replace(o, verdict=FAIL if rejected else PASS, threshold=threshold, level=level,
                             sentence=f"{o.sentence}: {text} (a regression needs a value {side} the threshold)",
                             threshold_basis=f"baseline {'+' if o.relation == '≤' else '-'} critical difference")
    return decided


def _evaluate_regression(rule: RegressionRule, experiments: list[Experiment], baseline: Results | None) -> list[Outcome]:
    measures, _, _ = _selected_measures(rule, experiments)
    missing_verdict = FAIL if rule.require else SKIP
    consequence = "fails because the rule has `require: true`" if rule.require else "skipped"
    if baseline is None:  # one outcome for the whole rule rather than one per comparison not made
        sentence = f"no --baseline given: {len(measures)} comparisons not made; {consequence}"
        return [Outcome(rule.name, rule.kind, rule.scope() or "all experiments", missing_verdict, None, None, "",
                        sentence, "", "no --baseline given")]
    old_by_key = {e.key: e for e in baseline.experiments}
    outcomes = []
    for new in measures:
        old_experiment = old_by_key.get(new.experiment.key)
        old = _find(old_experiment, new.attack, new.metric)
        reason = ("not in baseline: no experiment with this key" if old_experiment is None
                  else "not in baseline: the baseline experiment has no such attack metric" if old is None
                  else "no measurement in the baseline" if old.value is None
                  else "no measurement in the new results" if new.value is None else "")
        if reason:
            outcomes.append(Outcome(rule.name, rule.kind, new.target, missing_verdict, new.value, None, "",
                                    f"{new.described}: {reason}; {consequence}", "", reason.split(":")[0]))
            continue
        assert old is not None
        outcomes.append(_compare_with_baseline(rule, new, old))
    return outcomes


def evaluate_rule(rule: Rule, results: Results, baseline: Results | None = None) -> list[Outcome]:
    """The outcomes of one rule: one per matched target, or one failure when it matches nothing."""
    unmatched = _unmatched(rule, results)
    if unmatched is not None:
        return [unmatched]
    experiments = _selected_experiments(rule, results)
    if isinstance(rule, ThresholdRule):
        return _evaluate_threshold(rule, experiments)
    if isinstance(rule, SoundnessRule):
        return _evaluate_soundness(rule, experiments)
    return _evaluate_regression(rule, experiments, baseline)


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
    text = number if isinstance(number, str) else _format(number)
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
