"""The estimates a rule of ``dpfl-audit check`` reads: which experiments and (attack, metric)
figures of a results document it matches, each with its 95 % interval (:mod:`reports.gate`).

A rule names an attack entry of ``results.json``, or :data:`reports.policy.UTILITY` for an
experiment's utility block; a value that is null, NaN or infinite is "no measurement".

Each metric's range — the values it can take (:data:`METRIC_RANGES`) — is defined here, beside
:class:`Measure`: a threshold at or beyond an end of the range cannot be crossed, so a rule
holding a metric to it cannot fail (:func:`cannot_fail`).
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


@dataclass(frozen=True)
class MetricRange:
    """The values a metric can take, ``low`` ≤ value ≤ ``high``. ``interval``: its 95 % interval
    stays in the range too (clipped, or exact by construction: Clopper–Pearson, a percentile
    bootstrap); otherwise only the point estimate does (a Student-t interval of a mean of
    accuracies may reach beyond 1)."""

    low: float = -math.inf
    high: float = math.inf
    interval: bool = False


_SHARE = MetricRange(0.0, 1.0, interval=True)  # a probability, an AUC, a rate: intervals clipped to [0, 1]
_EPSILON = MetricRange(0.0, math.inf, interval=True)  # ε figures: bounds and estimates are never negative
_MEAN_SHARE = MetricRange(0.0, 1.0)  # a mean over runs or images of shares (Student-t interval)
_MEAN_NON_NEGATIVE = MetricRange(0.0, math.inf)

#: metric name (or the last dotted part of one: ``black_box.advantage``) → the values it can take;
#: a metric not listed can take any number (no rule on it is called one that cannot fail)
METRIC_RANGES: dict[str, MetricRange] = {
    # membership, canary and property attacks (attacks.membership_metrics, attacks.inference.property_inference)
    "auc": _SHARE, "tpr_at_fpr_0.1%": _SHARE, "tpr_at_fpr_1%": _SHARE, "balanced_accuracy": _SHARE, "accuracy": _SHARE,
    "epsilon_one_run": _EPSILON, "epsilon_one_run_fdp": _EPSILON, "epsilon_gaussian_fit": _EPSILON,
    # attribute inference (attacks.inference.attribute_scores): accuracy above, macro-F1, advantage over the baseline
    "macro_f1": _SHARE, "advantage": MetricRange(-1.0, 1.0, interval=True),
    # utility and diagnostics (reports.document.Utility): means over the membership runs
    "test_accuracy": _MEAN_SHARE, "train_accuracy": _MEAN_SHARE, "test_loss": _MEAN_NON_NEGATIVE,
    # reconstruction (attacks.reconstruction): means over the reconstructed images
    "label_accuracy": _MEAN_SHARE, "mse": _MEAN_NON_NEGATIVE, "mae": _MEAN_NON_NEGATIVE,
    "baseline_mse": _MEAN_NON_NEGATIVE, "baseline_mae": _MEAN_NON_NEGATIVE, "ssim": MetricRange(-1.0, 1.0),
}


def metric_range(metric: str, use: str = "value") -> MetricRange:
    """The range of ``metric``'s point estimate, or of its interval bound ``use`` (``ci_low``,
    ``ci_high``) where the interval keeps to it; unbounded for a metric not in :data:`METRIC_RANGES`."""
    found = METRIC_RANGES.get(metric) or METRIC_RANGES.get(metric.rsplit(".", 1)[-1]) or MetricRange()
    return found if use == "value" or found.interval else MetricRange()


def cannot_fail(metric: str, relation: str, threshold: float, use: str = "value") -> str:
    """Why ``number relation threshold`` holds for every number ``metric`` can take — e.g.
    ``auc ≤ 1`` for a maximum of 1.082 or exactly 1 — or '' when a measurement can fail it.
    ``relation`` is ``≤`` (the figure fails above the threshold) or ``≥`` (below it)."""
    bounds = metric_range(metric, use)
    what = metric if use in ("", "value") else f"{metric} {use}"
    if relation == "≤" and threshold >= bounds.high:
        return f"{what} ≤ {bounds.high:g}"
    if relation == "≥" and threshold <= bounds.low:
        return f"{what} ≥ {bounds.low:g}"
    return ""


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
            if (rule.attack is not None and name != rule.attack) or name in rule.exclude_attacks:
                continue
            attack_matched = True
            measures += [measure_of(experiment, name, m, metrics[m]) for m in rule.metrics if m in metrics]
    return measures, names, attack_matched


def format_number(number: float | None) -> str:
    return "—" if number is None else f"{number:.4g}"


def format_interval(measure: Measure) -> str:
    return f"{format_number(measure.value)} [{format_number(measure.ci_low)}, {format_number(measure.ci_high)}]"

