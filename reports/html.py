"""The self-contained HTML report: inline CSS, plots embedded as base64 PNG, no network access.

The page reads top-down: the header and a table of contents (:func:`contents`); the headline —
one row per configuration (:func:`headline_rows`: utility, the claim per adversary, one verdict
with its power where no violation was found, the strongest leakage), then the findings in words
(:func:`finding_entries`: each violating bound named, a privacy–utility trade-off only for
accuracies clearly above chance); the figures (:func:`report_figures`: one colour per attack
throughout); the detail tables, where each ε figure gets one short phrase (:func:`verdict_parts`)
and its full sentence sits in a ``<details>`` element, closed until clicked (native HTML: no
script needed), and every empty cell points to the reason it is empty (:func:`metric_cells`);
diagnostics, definitions, provenance. Every verdict is a badge: one style for every status, a
colour each, and always the status in words. The stylesheet is ``templates/style.css.j2``, shared
with the sweep page; its print rules make "print to PDF" from a browser work (nothing folded away,
figures kept whole, major sections on new pages).

Rendered by jinja2 with autoescaping on, so any text that comes from a config (names, labels,
notes) is shown, never interpreted.
"""

from __future__ import annotations

import base64
import math
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import markupsafe
import yaml

from audit.core.atomic import update_text
from audit.core.audit_power import POWER_TARGET
from audit.core.lazy_modules import lazy_module
from audit.core.visible_text import terminal_text
from audit.core.vocabulary import AttackKind, EpsilonKind, VerdictStatus
from reports.document import AttackRecord, Experiment, Power, Results, Verdict
from reports.verdict_text import (
    EPSILON_NAMES,
    OBSERVER_NAMES,
    badge_text,
    configuration_lines,
    finding_entries,
    finite_number,
    power_percent,
    short_verdict,
    verdict_parts,
    violation_lines,
)

if TYPE_CHECKING:
    from reports import epsilon_plots, plots
else:  # matplotlib is imported with the first figure (audit.core.lazy_modules)
    plots = lazy_module("reports.plots")
    epsilon_plots = lazy_module("reports.epsilon_plots")

TEMPLATES = Path(__file__).with_name("templates")


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


def _visible(value: Any) -> Any:
    """Every text the templates print, control characters spelled out (a browser shows them as
    nothing); markup the report built itself (figures) is left as it is."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return terminal_text(value)
    return value


def template_environment() -> jinja2.Environment:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                     finalize=_visible)
    environment.filters["num"] = plots.format_number
    environment.filters["pct"] = _percent
    environment.filters["sig"] = _significant
    environment.filters["power"] = power_percent
    environment.filters["short"] = short_verdict
    environment.filters["parts"] = verdict_parts
    environment.globals["badge_text"] = badge_text
    return environment


TPR_COLUMNS = {"tpr_at_fpr_0.1%": 0.001, "tpr_at_fpr_1%": 0.01}


def missing_reason(attack: AttackRecord, metric: str) -> tuple[str, str] | None:
    """Why ``attack`` has no value for ``metric`` in its table (None: it has one), read from the
    attack's own record, as (the reason, shared by every cell it applies to; what this attack's
    record shows of it, "" where nothing more): the metric it does not report, the ROC it has not
    (every score a member's, or every one a non-member's), or the non-member scores too few to
    reach the FPR of a TPR (each member's FPR moves in steps of 1/(non-members it is compared
    with): below 1/FPR of them, "TPR at that FPR" would be the TPR at FPR 0)."""
    estimate = attack.metrics.get(metric)
    if estimate is not None and finite_number(estimate.value):
        return None
    if estimate is None:
        if metric == "accuracy" and attack.kind == AttackKind.CANARY:
            return ("a canary audit reports no accuracy at a fitted threshold: its measures are the ROC figures and "
                    "its ε figures", "")
        return f"{attack.attack} does not report this metric", ""
    curve = list(zip(attack.roc.fpr, attack.roc.tpr))
    if len(curve) < 2:
        return ("no ROC: the scores hold members only or non-members only (for canaries: every canary was inserted, "
                "or none was), so there is no rate to read", "")
    if metric in TPR_COLUMNS:
        fpr = TPR_COLUMNS[metric]
        steps = [f for f, _ in curve if f > 0]
        return (f"TPR at {100 * fpr:g} % FPR is not estimable here: it needs each member compared with at least "
                f"{round(1 / fpr):,} non-member scores, and these members are compared with fewer — with fewer, the "
                f"lowest FPR above 0 lies above {100 * fpr:g} % and the figure would be the TPR at FPR 0",
                f"finest FPR here: {100 * min(steps):.2g} %" if steps else "")
    return "not computed: the scores give no finite value", ""


def metric_cells(experiment: Experiment, columns: tuple[str, ...] = ("auc", *TPR_COLUMNS, "accuracy")
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """The attack table's metric cells of ``experiment``'s scored attacks and the table's notes:
    per attack a dict metric → ``{"estimate" (or None), "note" (1-based number of the note that
    says why there is none, or None), "detail" (what this attack's record shows of it)}``, and the
    distinct reasons (:func:`missing_reason`) the numbers point to."""
    notes: list[str] = []
    rows = []
    for attack in experiment.attacks:
        if attack.kind == AttackKind.RUN:
            continue
        row = {}
        for metric in columns:
            missing = missing_reason(attack, metric)
            if missing is not None and missing[0] not in notes:
                notes.append(missing[0])
            row[metric] = {"estimate": attack.metrics.get(metric) if missing is None else None,
                           "note": None if missing is None else notes.index(missing[0]) + 1,
                           "detail": "" if missing is None else missing[1]}
        rows.append(row)
    return rows, notes


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


def _figure(title: str, png: str | None, caption: str, wide: bool = False) -> list[dict[str, Any]]:
    return [] if png is None else [{"title": title, "png": png, "caption": caption, "wide": wide}]


def report_figures(results: Results, chance: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The report's figures in reading order, each ``{"id", "title", "png" (base64), "caption",
    "wide" (spans the page)}``: the privacy–utility picture, leakage against ε, claimed against
    measured ε, the ROC panels of every scored attack in one grid (an attack without scores gets
    no panel), the reconstructions of every configuration (rows labelled), then the training
    diagnostics. Every figure that shows attacks gives each attack one colour
    (:func:`reports.plots.attack_colors`). ``chance`` (``{"accuracy", ...}``) draws the chance
    accuracy into the privacy–utility figure."""
    experiments = results.experiments
    level = chance.get("accuracy") if chance else None
    figures = _figure("Accuracy vs claimed ε", plots.accuracy_vs_epsilon(experiments, level if finite_number(level) else None),
                      "Mean test accuracy over the membership runs with 95 % intervals; dashed lines: non-private defenses"
                      + ("; dotted grey: chance, the accuracy of always predicting the most common class." if finite_number(level)
                         else "."))
    for metric in ("auc", "tpr_at_fpr_1%"):
        figures += _figure(f"Membership leakage vs claimed ε ({'AUC' if metric == 'auc' else 'TPR at 1 % FPR'})",
                           epsilon_plots.leakage_vs_epsilon(experiments, metric),
                           "Each membership attack in its colour, one marker per defense, 95 % intervals; hollow markers "
                           "at “no DP”: non-private configurations. Attacks at one ε are set slightly apart so that "
                           "equal values stay visible.")
    figures += _figure("Empirical vs claimed ε", epsilon_plots.empirical_vs_claimed(experiments),
                       "Every ε figure against what the claim allows for its unit, one colour per attack; ● a lower bound, "
                       "■ the lower end of a Gaussian-fit estimate's interval; above the diagonal is a violation (ringed "
                       "in red) or, for an estimate, a warning.")
    attacks = plots.roc_attacks(experiments)
    figures += _figure("ROC curves" if len(attacks) != 1 else f"ROC of {attacks[0]}", plots.roc_grid(experiments),
                       "One panel per scored attack, in the attack's colour; one line style per configuration. Every "
                       "(target run, unit) score, leave-one-out; a member is ranked among the non-members of other units "
                       "(for Shokri, of its fold); log–log axes show the low-FPR regime, from the finest rate the scores "
                       "resolve; an FPR of 0 is drawn on the left edge.", wide=len(attacks) > 1)
    for experiment in experiments:
        for attack in experiment.attacks:
            rows = plots.grid_rows(attack.attack)
            for grid in attack.figures:
                # the attack's own title names the run's key ("gradient-inversion: dp-fedavg-eps1"), which
                # repeats the configuration; a reader wants the configuration and the attack, once each
                title = f"{attack.attack} reconstructions: {experiment.label}"
                png = plots.reconstruction_grid(base64.b64decode(grid.png), title, rows)
                figures += _figure(title, png,
                                   f"{grid.caption} Rows: {rows[0]} (top), {rows[1]} (bottom); one column per record.")
    figures += _figure("Training curves", plots.round_curves(experiments, "test_accuracy", "Test accuracy per round",
                                                             "test accuracy"),
                       "Global model's test accuracy per evaluated round, mean over runs.")
    figures += _figure("Update norms before clipping",
                       plots.round_curves(experiments, "update_norm_median", "Pre-clip update norms",
                                          "ℓ2 norm of client updates", band=("update_norm_q25", "update_norm_q75"), log=True),
                       "Median (line) and interquartile range (band) over the round's clients, mean over runs; "
                       "for LUS and Fed-SMP, the norm of the sparsified update that is clipped.")
    for number, figure in enumerate(figures, 1):
        figure["id"] = f"fig-{number}"
    return figures


def contents(results: Results, figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table of contents: ``{"href", "text", "children"}`` for every section of the page, with
    the configurations under the details and the figures under the figures."""
    return [
        {"href": "#headline", "text": "Headline", "children": [{"href": "#summary", "text": "Findings", "children": []}]},
        {"href": "#plots", "text": "Figures",
         "children": [{"href": f"#{f['id']}", "text": f["title"], "children": []} for f in figures]},
        {"href": "#results", "text": "Details by configuration",
         "children": [{"href": f"#exp-{i}", "text": e.label, "children": []} for i, e in enumerate(results.experiments, 1)]},
        {"href": "#diagnostics", "text": "Diagnostics", "children": []},
        {"href": "#definitions", "text": "How to read the numbers", "children": []},
        {"href": "#provenance", "text": "Provenance", "children": []},
    ]


def render_report(results: Results, manifest_extra: dict[str, Any] | None = None) -> str:
    """report.html of ``results``: the header and a table of contents, the headline
    (:func:`headline_rows`, then the findings in words), the figures (:func:`report_figures`), the
    detail tables per configuration with one short phrase per ε figure (its full sentence behind a
    disclosure element) and every empty cell's reason (:func:`metric_cells`), diagnostics,
    definitions and provenance. ``manifest_extra`` adds package versions, the machine and
    ``chance`` (``{"accuracy", "classes"}``: the accuracy of always predicting the test set's most
    common class, which a trade-off must clearly beat; :func:`finding_lines`)."""
    extra = manifest_extra or {}
    chance = extra.get("chance") or None
    figures = report_figures(results, chance)
    cells = [metric_cells(e) for e in results.experiments]
    return template_environment().get_template("report.html.j2").render(
        doc=results,
        audit=results.audit,
        experiments=results.experiments,
        headline=headline_rows(results),
        findings=finding_entries(results, chance),
        configuration_lines=configuration_lines(results),
        epsilon_names=EPSILON_NAMES,
        figures=figures,
        contents=contents(results, figures),
        cells=cells,
        violations=[violation_lines(e) if e.soundness == VerdictStatus.VIOLATION else
                    violation_lines(e, VerdictStatus.ESTIMATE_ABOVE) for e in results.experiments],
        chance=chance,
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
