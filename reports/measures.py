"""The estimates a rule of ``dpfl-audit check`` reads: which experiments and (attack, metric)
figures of a results document it matches, each with its 95 % interval (:mod:`reports.gate`).

A rule names an attack entry of ``results.json``, or :data:`reports.policy.UTILITY` for an
experiment's utility block; a value that is null, NaN or infinite is "no measurement".
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from reports.document import Estimate, Experiment, Results
from reports.policy import UTILITY, RegressionRule, Rule, ThresholdRule


def number_or_none(value: Any) -> float | None:
    """A finite float, or None for null, NaN, ±inf and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Measure:
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


def blocks(experiment: Experiment) -> Iterator[tuple[str, dict[str, Estimate]]]:
    """(attack name, {metric: estimate}) for the utility block, then every attack entry, in file order."""
    yield UTILITY, {f.name: getattr(experiment.utility, f.name) for f in fields(experiment.utility)}
    for entry in experiment.attacks:
        yield entry.attack, entry.metrics


def measure_of(experiment: Experiment, attack: str, metric: str, estimate: Estimate) -> Measure:
    return Measure(experiment, attack, metric, number_or_none(estimate.value), number_or_none(estimate.ci_low),
                    number_or_none(estimate.ci_high))


def find_measure(experiment: Experiment | None, attack: str, metric: str) -> Measure | None:
    if experiment is None:
        return None
    for name, metrics in blocks(experiment):
        if name == attack and metric in metrics:
            return measure_of(experiment, attack, metric, metrics[metric])
    return None



def selected_experiments(rule: Rule, results: Results) -> list[Experiment]:
    return [e for e in results.experiments
            if (rule.defense is None or e.defense == rule.defense)
            and (rule.experiment is None or rule.experiment in (e.key, e.label))]


def selected_measures(rule: ThresholdRule | RegressionRule,
                       experiments: list[Experiment]) -> tuple[list[Measure], set[str], bool]:
    """The rule's (attack, metric) estimates in ``experiments``, in file order of experiments and
    attacks and rule order of metrics; also every block name seen and whether the attack matched."""
    measures, names, attack_matched = [], set(), False
    for experiment in experiments:
        for name, metrics in blocks(experiment):
            names.add(name)
            if rule.attack is not None and name != rule.attack:
                continue
            attack_matched = True
            measures += [measure_of(experiment, name, m, metrics[m]) for m in rule.metrics if m in metrics]
    return measures, names, attack_matched


def format_number(number: float | None) -> str:
    return "—" if number is None else f"{number:.4g}"


def format_interval(measure: Measure) -> str:
    return f"{format_number(measure.value)} [{format_number(measure.ci_low)}, {format_number(measure.ci_high)}]"

