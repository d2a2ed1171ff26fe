"""The self-contained HTML report: inline CSS, plots embedded as base64 PNG, no network access.

Rendered by jinja2 with autoescaping on, so any text that comes from a config (names, labels,
notes) is shown, never interpreted.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any

import jinja2
import yaml

from audit.core.atomic import write_text
from defenses.claims import PrivacyClaim
from reports import plots
from reports.document import Experiment, Results

TEMPLATES = Path(__file__).with_name("templates")
MAIN_ATTACK_ORDER = ("lira-online", "lira-offline")
#: short names of the ε figures in the attack tables
EPSILON_NAMES = {"epsilon_one_run": "one-run", "epsilon_one_run_fdp": "one-run f-DP", "epsilon_gaussian_fit": "Gaussian fit"}


def _percent(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.1f} %"
    return "0.0 %" if text == "-0.0 %" else text


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["num"] = plots.format_number
    environment.filters["pct"] = _percent
    return environment


def _leak_metric(experiment: Experiment) -> tuple[str, float] | None:
    for name in MAIN_ATTACK_ORDER:
        for attack in experiment.attacks:
            if attack.attack == name and attack.metrics["auc"].value is not None:
                return name, attack.metrics["auc"].value
    return None


def _best_trade_off(experiments: list[Experiment]) -> str | None:
    """The private configuration with the best accuracy among those whose claim no measurement
    contradicts, and the smallest claimed ε that reaches within 1 point of it."""
    private = [e for e in experiments if e.claim.is_private and e.utility.test_accuracy.value is not None
               and e.soundness != "violation"]
    if not private:
        return None
    best = max(typing.cast(float, e.utility.test_accuracy.value) for e in private)
    near = [e for e in private if typing.cast(float, e.utility.test_accuracy.value) >= best - 0.01]
    choice = min(near, key=lambda e: e.claim.epsilon)
    return (f"Best privacy–utility trade-off: {choice.label} — test accuracy "
            f"{100 * typing.cast(float, choice.utility.test_accuracy.value):.1f} % at claimed ε = {choice.claim.epsilon:.3g} "
            f"per {choice.claim.unit} (the smallest ε within 1 point of the best private accuracy, "
            "among claims no measurement contradicts).")


def summary_lines(results: Results) -> list[str]:
    """The verdicts in words, most important first."""
    lines = []
    experiments = results.experiments
    violated = [e for e in experiments if e.soundness == "violation"]
    warned = [e for e in experiments if e.soundness == "estimate above claim"]
    for experiment in violated:
        lines.append(f"Soundness VIOLATION — {experiment.label}: {experiment.soundness_text}.")
    for experiment in warned:
        lines.append(f"Soundness warning — {experiment.label}: {experiment.soundness_text}.")
    for experiment in experiments:
        if experiment.diverged is not None:
            where = experiment.diverged
            lines.append(f"Training diverged — {experiment.label}: membership run {where.run} stopped at round "
                         f"{where.round} ({where.what}); its attacks were skipped.")
    checked = [e for e in experiments if e.soundness == "consistent"]
    if not violated and checked:
        lines.append(f"No measured ε lower bound contradicts a claim: {len(checked)} of {len(experiments)} "
                     "configurations checked and consistent, by audits with at least 80 % power to detect twice the "
                     "claimed ε.")
    unpowered = [e for e in experiments if e.soundness == "inconclusive"]
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
    for experiment in experiments:
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
        if claim.is_private and claim.unit == "client":
            lines.append(f"{experiment.label}: the claim protects whole clients; a single record is covered through "
                         f"group privacy (one record changes one client's data: at most 2ε = {2 * claim.epsilon:.3g}).")
    return lines


def _observers_text(claim: PrivacyClaim) -> str:
    """' against the released models; against the server ε = 9.1, one upload alone ε = 60' (headline first)."""
    names = {"released": "the released models", "server": "the server", "local": "one upload alone"}
    others = []
    for entry in claim.adversaries:
        if entry.adversary == claim.adversary:
            continue
        figure = f"ε = {entry.epsilon:.3g}" if entry.covered else "not covered"
        others.append(f"{names.get(entry.adversary, entry.adversary)} {figure}")
    headline = names.get(claim.adversary, "")
    return (f" against {headline}" if headline else "") + (f"; against {', '.join(others)}" if others else "")


def render_report(results: Results, manifest_extra: dict[str, Any] | None = None) -> str:
    experiments = results.experiments
    attack_names = []
    for experiment in experiments:
        for attack in experiment.attacks:
            if attack.roc.fpr and attack.attack not in attack_names:
                attack_names.append(attack.attack)
    figures = []
    accuracy_plot = plots.accuracy_vs_epsilon(experiments)
    if accuracy_plot:
        figures.append({"title": "Accuracy vs claimed ε", "png": accuracy_plot,
                        "caption": "Mean test accuracy over the membership runs with 95 % intervals; dashed lines: non-private defenses."})
    for metric in ("auc", "tpr_at_fpr_1%"):
        png = plots.leakage_vs_epsilon(experiments, metric)
        if png:
            figures.append({"title": f"Membership leakage vs claimed ε ({'AUC' if metric == 'auc' else 'TPR at 1 % FPR'})",
                            "png": png, "caption": "Each membership attack per defense, 95 % intervals; dashed: non-private."})
    empirical = plots.empirical_vs_claimed(experiments)
    if empirical:
        figures.append({"title": "Empirical vs claimed ε", "png": empirical,
                        "caption": "Every ε figure against what the claim allows for its unit; above the diagonal (red) is a violation."})
    for name in attack_names:
        png = plots.roc_plot(experiments, name)
        if png:
            figures.append({"title": f"ROC of {name}", "png": png,
                            "caption": "Every (target run, unit) score, leave-one-out; a member is ranked among the non-members of other units "
                                       "(for Shokri, of its fold); log–log axes show the low-FPR regime."})
    accuracy_curves = plots.round_curves(experiments, "test_accuracy", "Test accuracy per round", "test accuracy")
    if accuracy_curves:
        figures.append({"title": "Training curves", "png": accuracy_curves,
                        "caption": "Global model's test accuracy per evaluated round, mean over runs."})
    norm_curves = plots.round_curves(experiments, "update_norm_median", "Pre-clip update norms", "ℓ2 norm of client updates",
                                     band=("update_norm_q25", "update_norm_q75"), log=True)
    if norm_curves:
        figures.append({"title": "Update norms before clipping", "png": norm_curves,
                        "caption": "Median (line) and interquartile range (band) over the round's clients, mean over runs; "
                                   "for LUS and Fed-SMP, the norm of the sparsified update that is clipped."})
    extra = manifest_extra or {}
    return _environment().get_template("report.html.j2").render(
        doc=results,
        audit=results.audit,
        experiments=experiments,
        summary=summary_lines(results),
        epsilon_names=EPSILON_NAMES,
        figures=figures,
        config_yaml=yaml.safe_dump(results.config, sort_keys=False, allow_unicode=True),
        versions=extra.get("versions", results.versions),
        machine=extra.get("machine", {}),
    )


def write_report(results: Results, path: str | Path, manifest_extra: dict[str, Any] | None = None) -> Path:
    """Write the self-contained HTML report of an audit's :class:`Results` (results.json's content) to
    ``path``, atomically; ``manifest_extra`` adds package versions and the machine. Returns the path."""
    path = Path(path)
    write_text(path, render_report(results, manifest_extra))
    return path
