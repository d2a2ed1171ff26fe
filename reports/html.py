"""The self-contained HTML report: inline CSS, plots embedded as base64 PNG, no network access.

The page reads top-down: the header; the headline — one row per configuration
(:func:`headline_rows`: utility, the claim per adversary, one verdict with its power, the strongest
leakage), then the findings in words; the figures (:func:`report_figures`); the detail tables,
where each ε figure gets one short phrase (:func:`short_verdict`) and its full sentence sits in a
``<details>`` element, closed until clicked (native HTML: no script needed); diagnostics,
definitions, provenance. The stylesheet is ``templates/style.css.j2``, shared with the sweep page.

Rendered by jinja2 with autoescaping on, so any text that comes from a config (names, labels,
notes) is shown, never interpreted.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import yaml

from audit.core.atomic import update_text
from audit.core.audit_power import POWER_TARGET
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import EpsilonKind, Observer, Unit, VerdictKind, VerdictStatus
from defenses.privacy.claims import PrivacyClaim
from reports.document import Experiment, Power, Results, Verdict

if TYPE_CHECKING:
    from reports import plots
else:  # matplotlib is imported with the first figure (audit.core.lazy_modules)
    plots = lazy_module("reports.plots")

TEMPLATES = Path(__file__).with_name("templates")
MAIN_ATTACK_ORDER = ("lira-online", "lira-offline")
#: short names of the ε figures in the attack tables
EPSILON_NAMES = {"epsilon_one_run": "one-run", "epsilon_one_run_fdp": "one-run f-DP", "epsilon_gaussian_fit": "Gaussian fit",
                 "upload_conformance": "uploads' mechanism"}
#: the observers a claim speaks of, in words
OBSERVER_NAMES = {Observer.RELEASED: "released models", Observer.SERVER: "the server", Observer.LOCAL: "one upload alone"}


def _percent(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.1f} %"
    return "0.0 %" if text == "-0.0 %" else text


def _significant(value: Any, digits: int = 3) -> str:
    """A number to ``digits`` significant figures (``–`` for none, ``∞`` for infinity)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def template_environment() -> jinja2.Environment:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["num"] = plots.format_number
    environment.filters["pct"] = _percent
    environment.filters["sig"] = _significant
    environment.filters["power"] = power_percent
    environment.filters["short"] = short_verdict
    return environment


def _leak_metric(experiment: Experiment) -> tuple[str, float] | None:
    for name in MAIN_ATTACK_ORDER:
        for attack in experiment.attacks:
            if attack.attack == name and "auc" in attack.metrics and attack.metrics["auc"].value is not None:
                return name, attack.metrics["auc"].value
    return None


def _best_trade_off(experiments: list[Experiment]) -> str | None:
    """The private configuration with the best accuracy among those whose claim no measurement
    contradicts, and the smallest claimed ε that reaches within 1 point of it."""
    private = [e for e in experiments if e.claim.is_private and e.utility.test_accuracy.value is not None
               and e.soundness != VerdictStatus.VIOLATION]
    if not private:
        return None
    # compared as floats: an integer accuracy from a hand-edited results.json (2⁶⁴ − 1) rounds up
    # when 0.01 is subtracted, and the best itself would no longer be "near" the best
    best = max(float(typing.cast(float, e.utility.test_accuracy.value)) for e in private)
    near = [e for e in private if float(typing.cast(float, e.utility.test_accuracy.value)) >= best - 0.01]
    choice = min(near, key=lambda e: e.claim.epsilon)
    return (f"Best privacy–utility trade-off: {choice.label} — test accuracy "
            f"{100 * typing.cast(float, choice.utility.test_accuracy.value):.1f} % at claimed ε = {choice.claim.epsilon:.3g} "
            f"per {choice.claim.unit} (the smallest ε within 1 point of the best private accuracy, "
            "among claims no measurement contradicts).")


def finding_lines(results: Results) -> list[str]:
    """The findings across configurations, most important first: violations, warnings, divergence,
    how many configurations are consistent or inconclusive, the most leaky one, the best trade-off."""
    lines = []
    experiments = results.experiments
    violated = [e for e in experiments if e.soundness == VerdictStatus.VIOLATION]
    warned = [e for e in experiments if e.soundness == VerdictStatus.ESTIMATE_ABOVE]
    for experiment in violated:
        lines.append(f"Soundness VIOLATION — {experiment.label}: {experiment.soundness_text}.")
    for experiment in warned:
        lines.append(f"Soundness warning — {experiment.label}: {experiment.soundness_text}.")
    for experiment in experiments:
        if experiment.diverged is not None:
            where = experiment.diverged
            lines.append(f"Training diverged — {experiment.label}: membership run {where.run} stopped at round "
                         f"{where.round} ({where.what}); its attacks were skipped.")
    checked = [e for e in experiments if e.soundness == VerdictStatus.CONSISTENT]
    if not violated and checked:
        lines.append(f"No measured ε lower bound contradicts a claim: {len(checked)} of {len(experiments)} "
                     "configurations checked and consistent, by audits with at least 80 % power to detect twice the "
                     "claimed ε.")
    unpowered = [e for e in experiments if e.soundness == VerdictStatus.INCONCLUSIVE]
    if unpowered:
        lines.append(f"Inconclusive — {', '.join(e.label for e in unpowered)}: no violation found, but the audit could "
                     "not have detected a mechanism twice as leaky as claimed with 80 % probability (see each verdict's "
                     "power), so this is not evidence that the claim holds.")
    leaks = [(e, metric) for e in experiments if (metric := _leak_metric(e)) is not None]
    if leaks:
        worst, (attack, value) = max(leaks, key=lambda item: item[1][1])
        lines.append(f"Most leaky configuration: {worst.label} ({attack} AUC {value:.3f}; 0.5 is chance).")
    trade_off = _best_trade_off(experiments)
    if trade_off:
        lines.append(trade_off)
    return lines


def configuration_lines(results: Results) -> list[str]:
    """Each configuration in one sentence (utility, claim, main leakage, soundness), plus what a
    client-level claim means for a single record."""
    lines = []
    for experiment in results.experiments:
        claim, accuracy = experiment.claim, experiment.utility.test_accuracy
        claim_text = ("no DP claim" if not claim.is_private else
                      f"claims ({claim.epsilon:.3g}, {claim.delta:.1e})-DP per {claim.unit} [{claim.accountant}]"
                      + _observers_text(claim))
        acc_text = "accuracy n/a" if accuracy.value is None else f"test accuracy {100 * accuracy.value:.1f} %"
        if experiment.diverged is not None:
            acc_text = f"training diverged at round {experiment.diverged.round}"
        leak = _leak_metric(experiment)
        leak_text = "" if leak is None else f"; {leak[0]} AUC {leak[1]:.3f}"
        lines.append(f"{experiment.label}: {acc_text}, {claim_text}{leak_text}; soundness: {experiment.soundness}.")
        if claim.is_private and claim.unit == Unit.CLIENT:
            lines.append(f"{experiment.label}: the claim protects whole clients; a single record is covered through "
                         f"group privacy (one record changes one client's data: at most 2ε = {2 * claim.epsilon:.3g}).")
    return lines


def summary_lines(results: Results) -> list[str]:
    """The verdicts in words, most important first: :func:`finding_lines`, then
    :func:`configuration_lines`."""
    return finding_lines(results) + configuration_lines(results)


def _observers_text(claim: PrivacyClaim) -> str:
    """' against the released models; against the server ε = 9.1, one upload alone ε = 60' (headline first)."""
    names = {Observer.RELEASED: "the released models", Observer.SERVER: "the server", Observer.LOCAL: "one upload alone"}
    others = []
    for entry in claim.adversaries:
        if entry.adversary == claim.adversary:
            continue
        figure = f"ε = {entry.epsilon:.3g}" if entry.covered else "not covered"
        others.append(f"{names.get(entry.adversary, entry.adversary)} {figure}")
    headline = names.get(claim.adversary, "")
    return (f" against {headline}" if headline else "") + (f"; against {', '.join(others)}" if others else "")


def power_percent(detection: float) -> str:
    """A detection probability as the report prints it: ``12 %``."""
    return f"{100 * detection:.0f} %"


def short_verdict(verdict: Verdict) -> str:
    """One ε figure's verdict in a few words, e.g. ``VIOLATION (p = 0.0004 < 0.013)`` or
    ``inconclusive (below claim, power 12 %)``; the full sentence is ``verdict.text``."""
    status = verdict.status
    if status == VerdictStatus.VIOLATION:
        if verdict.p_value is not None and verdict.level is not None:
            return f"VIOLATION (p = {verdict.p_value:.2g} < {verdict.level:.2g})"
        return f"VIOLATION (ε_LB = {plots.format_number(verdict.measured, 2)} > {plots.format_number(verdict.bound, 2)})"
    if status in (VerdictStatus.CONSISTENT, VerdictStatus.INCONCLUSIVE):
        if verdict.kind == VerdictKind.CONFORMANCE:
            return "consistent (clip and noise as claimed)" if status == VerdictStatus.CONSISTENT else \
                "inconclusive (no departure found, power < 80 %)"
        if verdict.kind == VerdictKind.ESTIMATE:
            return f"{status} (estimate within claim, not a test)"
        below = ("below claim" if verdict.measured is None or verdict.bound is None or verdict.measured <= verdict.bound
                 else "above claim, not significant after Holm")
        if verdict.power is None:
            return f"{status} ({below}, no counts: power unknown)"
        return f"{status} ({below}, power {power_percent(verdict.power.detection)})"
    if status == VerdictStatus.ESTIMATE_ABOVE:
        return "estimate above claim (a warning, not a proof)"
    if status == VerdictStatus.VACUOUS:
        return "vacuous (δ′ ≥ 1 rules out nothing)"
    return status  # not covered, no claim, no measurement: the status says it all


def _verdicts(experiment: Experiment) -> list[tuple[str, Verdict]]:
    return [(attack.attack, v) for attack in experiment.attacks for v in attack.verdicts]


def _headline_power(named: list[tuple[str, Verdict]]) -> dict[str, Any] | None:
    with_power = [(attack, v) for attack, v in named if v.power is not None and v.bound is not None]
    if not with_power:
        return None
    def strength(item: tuple[str, Verdict]) -> tuple[float, float, int]:
        # ties (often all 0 %) go to the figure whose tight-mechanism ε_LB comes closest to its bound
        power, bound = typing.cast(Power, item[1].power), typing.cast(float, item[1].bound)
        return power.detection, power.tight_bound / bound if bound > 0 else 0.0, power.canaries

    attack, best = max(with_power, key=strength)
    power = typing.cast(Power, best.power)
    return {"detection": power.detection, "detectable": 2 * typing.cast(float, best.bound), "canaries": power.canaries,
            "tight_bound": power.tight_bound, "needed": power.needed, "attack": attack, "metric": best.metric,
            "figures": len(with_power),
            "powered": sum(typing.cast(Power, v.power).detection >= POWER_TARGET for _, v in with_power)}


def _headline_violation(named: list[tuple[str, Verdict]]) -> dict[str, Any] | None:
    found = [(attack, v) for attack, v in named if v.status == VerdictStatus.VIOLATION]
    if not found:
        return None
    # the most significant one: smallest p-value, then the largest excess over the bound
    attack, v = min(found, key=lambda item: (item[1].p_value if item[1].p_value is not None else 2.0,
                                             -(item[1].measured or 0.0) / (item[1].bound or 1.0)))
    return {"attack": attack, "metric": v.metric, "p_value": v.p_value, "level": v.level, "family": v.family,
            "measured": v.measured, "bound": v.bound}


def _headline_leakage(experiment: Experiment) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    bounds = [(attack, metric, attack.metrics[metric].value) for attack in experiment.attacks
              for metric, kind in attack.epsilon_kind.items()
              if kind == EpsilonKind.LOWER_BOUND and metric in attack.metrics and attack.metrics[metric].value is not None]
    leakage = None
    if bounds:
        attack, metric, value = max(bounds, key=lambda item: typing.cast(float, item[2]))
        auc = attack.metrics.get("auc")
        leakage = {"epsilon": value, "attack": attack.attack, "metric": metric, "unit": attack.unit,
                   "auc": auc.value if auc is not None else None}
    aucs = [(attack.attack, attack.metrics["auc"].value) for attack in experiment.attacks
            if "auc" in attack.metrics and attack.metrics["auc"].value is not None]
    top = max(aucs, key=lambda item: typing.cast(float, item[1]), default=None)
    return leakage, (None if top is None else {"attack": top[0], "value": top[1]})


def headline_rows(results: Results) -> list[dict[str, Any]]:
    """One row per configuration (a defense at one ε), in the document's order, for the headline
    block of report.html and of the sweep page. Each row is a dict:

    * ``anchor`` — the id of the configuration's detail section in report.html (``exp-<n>``);
      ``key``, ``label``, ``defense`` — as in results.json;
    * ``accuracy``, ``accuracy_low``, ``accuracy_high`` — mean test accuracy over the membership
      runs and its 95 % interval (fractions; None where there is none);
    * ``diverged_round`` — the round at which training diverged, None if it did not;
    * ``private`` — whether there is a DP claim; ``epsilon`` (None without one), ``delta``,
      ``unit``, ``relation``, ``accountant`` — the headline claim;
    * ``adversaries`` — the claim per observer, each ``{"adversary", "name" (in words), "covered",
      "epsilon" (None: not covered), "delta", "relation", "headline" (the headline figure's)}``;
    * ``verdict`` — the configuration's one verdict: its soundness status (``violation``,
      ``estimate above claim``, ``consistent``, ``inconclusive``, ``not covered``, ``vacuous``,
      ``no claim``, ``no measurement``; :func:`reports.soundness.experiment_verdict`), or
      ``diverged``; ``verdict_text`` — the sentence behind it;
    * ``power`` — the most powerful ε figure's power, None when no figure has counts:
      ``{"detection" (probability of a violation verdict at twice its bound), "detectable" (that
      2ε), "canaries", "tight_bound" (the median ε_LB against a tight mechanism), "needed" (coins
      for 80 %, None: none up to 10⁵), "attack", "metric", "figures" (how many figures have a
      power), "powered" (how many reach 80 %)}``;
    * ``violation`` — the most significant violation, None without one: ``{"attack", "metric",
      "p_value", "level" (its Holm level), "family", "measured", "bound"}``;
    * ``leakage`` — the largest ε lower bound, None without one: ``{"epsilon", "attack", "metric",
      "unit", "auc" (that attack's AUC)}``; ``top_auc`` — the highest AUC of any attack,
      ``{"attack", "value"}`` or None.
    """
    rows = []
    for index, experiment in enumerate(results.experiments, 1):
        claim, accuracy = experiment.claim, experiment.utility.test_accuracy
        named = _verdicts(experiment)
        leakage, top_auc = _headline_leakage(experiment)
        rows.append({
            "anchor": f"exp-{index}", "key": experiment.key, "label": experiment.label, "defense": experiment.defense,
            "accuracy": accuracy.value, "accuracy_low": accuracy.ci_low, "accuracy_high": accuracy.ci_high,
            "diverged_round": experiment.diverged.round if experiment.diverged is not None else None,
            "private": claim.is_private, "epsilon": claim.epsilon if claim.is_private else None,
            "delta": claim.delta, "unit": claim.unit, "relation": claim.relation, "accountant": claim.accountant,
            "adversaries": [{"adversary": a.adversary, "name": OBSERVER_NAMES.get(a.adversary, a.adversary),
                             "covered": a.covered, "epsilon": a.epsilon if a.covered else None, "delta": a.delta,
                             "relation": a.relation, "headline": a.adversary == claim.adversary}
                            for a in claim.adversaries],
            "verdict": "diverged" if experiment.diverged is not None else experiment.soundness,
            "verdict_text": experiment.soundness_text,
            "power": _headline_power(named),
            "violation": _headline_violation(named),
            "leakage": leakage, "top_auc": top_auc,
        })
    return rows


def _figure(title: str, png: str | None, caption: str) -> list[dict[str, str]]:
    return [] if png is None else [{"title": title, "png": png, "caption": caption}]


def report_figures(results: Results) -> list[dict[str, str]]:
    """The report's figures in reading order, each ``{"title", "png" (base64), "caption"}``: the
    privacy–utility picture, leakage against ε, claimed against measured ε, the ROC curve of every
    scored attack, the reconstructions of every configuration, then the training diagnostics."""
    experiments = results.experiments
    figures = _figure("Accuracy vs claimed ε", plots.accuracy_vs_epsilon(experiments),
                      "Mean test accuracy over the membership runs with 95 % intervals; dashed lines: non-private defenses.")
    for metric in ("auc", "tpr_at_fpr_1%"):
        figures += _figure(f"Membership leakage vs claimed ε ({'AUC' if metric == 'auc' else 'TPR at 1 % FPR'})",
                           plots.leakage_vs_epsilon(experiments, metric),
                           "Each membership attack per defense, 95 % intervals; dashed: non-private.")
    figures += _figure("Empirical vs claimed ε", plots.empirical_vs_claimed(experiments),
                       "Every ε figure against what the claim allows for its unit; above the diagonal (red) is a violation.")
    attack_names: list[str] = []
    for experiment in experiments:
        attack_names += [a.attack for a in experiment.attacks if a.roc.fpr and a.attack not in attack_names]
    for name in attack_names:
        figures += _figure(f"ROC of {name}", plots.roc_plot(experiments, name),
                           "Every (target run, unit) score, leave-one-out; a member is ranked among the non-members of "
                           "other units (for Shokri, of its fold); log–log axes show the low-FPR regime.")
    for experiment in experiments:
        for attack in experiment.attacks:
            figures += [{"title": f"{experiment.label}: {grid.title}", "png": grid.png, "caption": grid.caption}
                        for grid in attack.figures]
    figures += _figure("Training curves", plots.round_curves(experiments, "test_accuracy", "Test accuracy per round",
                                                             "test accuracy"),
                       "Global model's test accuracy per evaluated round, mean over runs.")
    figures += _figure("Update norms before clipping",
                       plots.round_curves(experiments, "update_norm_median", "Pre-clip update norms",
                                          "ℓ2 norm of client updates", band=("update_norm_q25", "update_norm_q75"), log=True),
                       "Median (line) and interquartile range (band) over the round's clients, mean over runs; "
                       "for LUS and Fed-SMP, the norm of the sparsified update that is clipped.")
    return figures


def render_report(results: Results, manifest_extra: dict[str, Any] | None = None) -> str:
    """report.html of ``results``: the header, the headline (:func:`headline_rows`, then the findings
    in words), the figures (:func:`report_figures`), the detail tables per configuration with one
    short phrase per ε figure (its full sentence behind a disclosure element), diagnostics,
    definitions and provenance. ``manifest_extra`` adds package versions and the machine."""
    extra = manifest_extra or {}
    return template_environment().get_template("report.html.j2").render(
        doc=results,
        audit=results.audit,
        experiments=results.experiments,
        headline=headline_rows(results),
        findings=finding_lines(results),
        configuration_lines=configuration_lines(results),
        epsilon_names=EPSILON_NAMES,
        figures=report_figures(results),
        config_yaml=yaml.safe_dump(results.config, sort_keys=False, allow_unicode=True),
        versions=extra.get("versions", results.versions),
        machine=extra.get("machine", {}),
    )


def write_report(results: Results, path: str | Path, manifest_extra: dict[str, Any] | None = None) -> Path:
    """Write the self-contained HTML report of an audit's :class:`Results` (results.json's content) to
    ``path``, atomically (left as it is if it already holds the same bytes); ``manifest_extra`` adds
    package versions and the machine. Returns the path."""
    path = Path(path)
    update_text(path, render_report(results, manifest_extra))
    return path
