"""The ``no-regression`` rule of ``dpfl-audit check``: a metric of the new results against the
same experiment's in ``--baseline`` (:mod:`reports.gate`).

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
the rule says ``require: true``, which turns each of these into a failure.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from audit.core.multiplicity import holm
from reports.document import Experiment, Results
from reports.measures import Measure, find_measure, format_interval, format_number, selected_measures
from reports.outcomes import FAIL, PASS, SKIP, Outcome
from reports.policy import RegressionRule

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

#: metrics (or the last dotted part of one) for which a lower value is worse: utility, and
#: reconstruction errors (a smaller error means a better reconstruction, i.e. more leakage)
LOWER_IS_WORSE = frozenset({"test_accuracy", "train_accuracy", "mse", "mae"})
#: family-wise error rate of one check's regression comparisons; the z of a two-sided 95 % interval
FAMILY_ALPHA, Z_95 = 0.05, 1.959963984540054  # Φ⁻¹(0.975), written out: `check` loads no scipy.stats


def _lower_is_worse(rule: RegressionRule, metric: str) -> bool:
    if rule.worse is not None:
        return rule.worse == "lower"
    return metric in LOWER_IS_WORSE or metric.rsplit(".", 1)[-1] in LOWER_IS_WORSE


def _standard_error(measure: Measure) -> float:
    """The SE a 95 % interval implies: its wider half-width / 1.96 (the wider side, because an
    interval clipped at 0 or 1 is narrower on that side)."""
    assert measure.value is not None and measure.ci_low is not None and measure.ci_high is not None
    return max(measure.ci_high - measure.value, measure.value - measure.ci_low, 0.0) / Z_95


def _compare_with_baseline(rule: RegressionRule, new: Measure, old: Measure) -> Outcome:
    """One metric against its baseline: a one-sided test with the intervals' standard errors
    where both have one (decided later with the check's family, :func:`decide_regressions`), else
    the absolute ``rule.tolerance``."""
    lower_worse = _lower_is_worse(rule, new.metric)
    direction = "lower is worse" if lower_worse else "higher is worse"
    assert new.value is not None and old.value is not None
    if new.has_interval and old.has_interval:
        se = math.hypot(_standard_error(new), _standard_error(old))
        worse_by = old.value - new.value if lower_worse else new.value - old.value
        p_value = float(stats.norm.sf(worse_by / se)) if se > 0 else (0.0 if worse_by > 0 else 1.0)
        comparison = (f"{new.described}: {format_interval(new)} vs baseline {format_interval(old)} ({direction}; worse by "
                      f"{format_number(worse_by)}, SE of the difference {format_number(se)}, one-sided p = {p_value:.2g})")
        return Outcome(rule.name, rule.kind, new.target, PASS, new.value, old.value, "≥" if lower_worse else "≤",
                       comparison, "", "baseline", p_value=p_value, se=se, metric=new.metric)
    tolerance = rule.tolerance
    if lower_worse:
        threshold, relation, regressed = old.value - tolerance, "≥", new.value < old.value - tolerance
    else:
        threshold, relation, regressed = old.value + tolerance, "≤", new.value > old.value + tolerance
    lacking = ("neither result has a two-sided interval" if not (new.has_interval or old.has_interval)
               else "the new result has no two-sided interval" if not new.has_interval
               else "the baseline has no two-sided interval")
    comparison = (f"{new.described}: {format_number(new.value)} vs baseline {format_number(old.value)} ({direction}; "
                  f"{lacking}, so the absolute tolerance {tolerance:g} was used)")
    verdict_text = (f"regression: worse by more than the tolerance {tolerance:g}" if regressed
                    else f"no regression beyond the tolerance {tolerance:g}")
    sign = "-" if lower_worse else "+"
    return Outcome(rule.name, rule.kind, new.target, FAIL if regressed else PASS, new.value, threshold, relation,
                   f"{comparison}: {verdict_text}", "", f"baseline {sign} tolerance {tolerance:g}", metric=new.metric)


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
        margin = float(stats.norm.isf(level)) * o.se
        threshold = o.threshold + (margin if o.relation == "≤" else -margin)
        side = "above" if o.relation == "≤" else "below"
        test = f"Holm level {level:.2g} over the check's {len(tested)} interval comparison(s)"
        text = (f"regression beyond statistical noise: p ≤ {test}" if rejected
                else f"no regression beyond statistical noise: p > {test}")
        decided[i] = replace(o, verdict=FAIL if rejected else PASS, threshold=threshold, level=level,
                             sentence=f"{o.sentence}: {text} (a regression needs a value {side} the threshold)",
                             threshold_basis=f"baseline {'+' if o.relation == '≤' else '-'} critical difference")
    return decided


def evaluate_regression(rule: RegressionRule, experiments: list[Experiment], baseline: Results | None) -> list[Outcome]:
    measures, _, _ = selected_measures(rule, experiments)
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
        old = find_measure(old_experiment, new.attack, new.metric)
        reason = ("not in baseline: no experiment with this key" if old_experiment is None
                  else "not in baseline: the baseline experiment has no such attack metric" if old is None
                  else "no measurement in the baseline" if old.value is None
                  else "no measurement in the new results" if new.value is None else "")
        if reason:
            outcomes.append(Outcome(rule.name, rule.kind, new.target, missing_verdict, new.value, None, "",
                                    f"{new.described}: {reason}; {consequence}", "", reason.split(":")[0],
                                    metric=new.metric))
            continue
        assert old is not None
        outcomes.append(_compare_with_baseline(rule, new, old))
    return outcomes
