"""A sweep's combined outputs: one table over every point's configurations, the privacy–utility
figures over all of them, and the sweep page (``sweep.html``) that links each point's report.

A sweep (:mod:`audit.sweep`) is a grid of audits; each point's ``results.json`` is a whole
:class:`reports.document.Results`. Here they are read together:

* **The table** (``sweep.csv``, and ``sweep.json``'s ``rows``): one row per (point, configuration)
  — the point's values, utility, the claim, the strongest leakage (highest AUC, largest ε lower
  bound), the point's verdict with its power, and the sweep-wide verdict below. ``sweep-rows.csv``
  holds every point's tidy rows (``results.csv``) with the point's columns in front.
* **One experiment, once.** Points share runs, so a configuration the grid does not change (the
  undefended baseline of an ε sweep) comes out identical in every point; the figures and the
  family below count it once. Where a configuration does differ between points, its label gains
  the values of the axes that make the difference (``dp-fedavg (training.lr=0.1)``), so each
  gets its own curve.
* **A family across the sweep.** Each point's verdicts are corrected within the point (Holm over
  its ε figures, :mod:`reports.soundness`). Reading a whole grid for "any violation" is a larger
  family: Holm's procedure (valid under any dependence — the points share runs and seeds) over
  every distinct ε lower bound of the sweep decides which violations stand sweep-wide.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from audit.core.lazy_modules import lazy_module
from audit.core.multiplicity import holm
from audit.core.typed_json import to_json
from audit.core.vocabulary import VerdictKind, VerdictStatus
from reports.document import Experiment, Results, Row
from reports.figures import save_figure
from reports.html import headline_rows
from reports.soundness import FAMILY_ALPHA

if TYPE_CHECKING:
    from reports import epsilon_plots, plots
else:  # matplotlib is imported with the first figure (audit.core.lazy_modules)
    plots = lazy_module("reports.plots")
    epsilon_plots = lazy_module("reports.epsilon_plots")

SWEEP_FORMAT = 1
#: the summary table's columns after the point's name and axes
SUMMARY_COLUMNS = ("configuration", "defense", "epsilon", "delta", "unit", "accountant", "test_accuracy",
                   "test_accuracy_ci_low", "test_accuracy_ci_high", "strongest_attack", "auc", "auc_ci_low",
                   "auc_ci_high", "epsilon_lb", "epsilon_lb_attack", "verdict", "power", "sweep_verdict", "report")


@dataclass(frozen=True)
class SweepPoint:
    """One finished point: its name, its axis values, its folder (relative to the sweep's), its
    results, whether they were read back from an earlier call, and the runs this call trained for it."""

    name: str
    values: dict[str, Any]
    folder: str
    results: Results
    reused: bool = False
    trained_runs: int = 0


def fingerprint(experiment: Experiment) -> str:
    """What makes two points' experiments one configuration: the same entry of results.json, byte
    for byte (a run two points share is trained once, so its figures are the same)."""
    return json.dumps(to_json(experiment), sort_keys=True)


def _value_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def combined_experiments(points: list[SweepPoint]) -> list[tuple[SweepPoint, Experiment]]:
    """Every distinct experiment of the sweep with the first point that has it, relabelled where
    the same configuration differs between points (by the values of the axes that differ)."""
    by_key: dict[str, dict[str, tuple[SweepPoint, Experiment]]] = {}  # key → fingerprint → first
    for point in points:
        for experiment in point.results.experiments:
            by_key.setdefault(experiment.key, {}).setdefault(fingerprint(experiment), (point, experiment))
    combined = []
    for group in (list(distinct.values()) for distinct in by_key.values()):
        varying = [path for path in group[0][0].values if len({_value_text(p.values[path]) for p, _ in group}) > 1]
        for point, experiment in group:
            if varying:
                suffix = ", ".join(f"{path}={_value_text(point.values[path])}" for path in varying)
                experiment = replace(experiment, label=f"{experiment.label} ({suffix})",
                                     defense=f"{experiment.defense} ({suffix})")
            combined.append((point, experiment))
    return combined


#: the verdicts that are tests with a p-value: ε lower bounds, and the mechanism's own tests
TESTS = (VerdictKind.LOWER_BOUND, VerdictKind.CONFORMANCE, VerdictKind.PARAMETRIC)


def _lower_bounds(experiment: Experiment):
    """(attack, verdict) of every test of an experiment: its ε lower bounds with their p-values, the
    uploads' conformance with the claimed mechanism, and the parametric test of the claimed μ."""
    for attack in experiment.attacks:
        for verdict in attack.verdicts:
            if verdict.kind in TESTS and verdict.p_value is not None:
                yield attack.attack, verdict


def sweep_family(points: list[SweepPoint]) -> dict[str, Any]:
    """Holm's procedure at :data:`FAMILY_ALPHA` over every distinct tested ε lower bound of the
    sweep (an experiment identical at several points counts once): how many figures, and for each
    experiment fingerprint whether a violation stands."""
    distinct: dict[str, Experiment] = {}
    for point in points:
        for experiment in point.results.experiments:
            distinct.setdefault(fingerprint(experiment), experiment)
    tested = [(key, verdict) for key, e in distinct.items() for _, verdict in _lower_bounds(e)]
    decisions = holm([float(v.p_value or 0.0) for _, v in tested], FAMILY_ALPHA)
    standing: dict[str, bool] = {}
    for (key, _), (rejected, _) in zip(tested, decisions):
        standing[key] = standing.get(key, False) or rejected
    return {"figures": len(tested), "alpha": FAMILY_ALPHA, "standing": standing}


def summary_row(point: SweepPoint, experiment: Experiment, headline: dict[str, Any], standing: bool) -> dict[str, Any]:
    """The table's row of one configuration at one point: its headline in the point's report
    (:func:`reports.html.headline_rows`) in flat columns, and the sweep-wide verdict."""
    top, leakage, power = headline["top_auc"], headline["leakage"], headline["power"]
    auc = next((a.metrics["auc"] for a in experiment.attacks
                if top is not None and a.attack == top["attack"] and "auc" in a.metrics), None)
    verdict = headline["verdict"]
    return {
        "point": point.name, **{path: _value_text(v) for path, v in point.values.items()},
        "configuration": experiment.label, "defense": experiment.defense,
        "epsilon": headline["epsilon"], "delta": headline["delta"] if headline["private"] else None,
        "unit": headline["unit"], "accountant": headline["accountant"],
        "test_accuracy": headline["accuracy"], "test_accuracy_ci_low": headline["accuracy_low"],
        "test_accuracy_ci_high": headline["accuracy_high"],
        "strongest_attack": None if top is None else top["attack"], "auc": None if top is None else top["value"],
        "auc_ci_low": None if auc is None else auc.ci_low, "auc_ci_high": None if auc is None else auc.ci_high,
        "epsilon_lb": None if leakage is None else leakage["epsilon"],
        "epsilon_lb_attack": None if leakage is None else leakage["attack"],
        "verdict": verdict, "power": None if power is None else power["detection"],
        "sweep_verdict": ((VerdictStatus.VIOLATION if standing else "not sweep-wide")
                          if verdict == VerdictStatus.VIOLATION else verdict),
        "report": f"{point.folder}/report.html",
    }


def summary_rows(points: list[SweepPoint], family: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per (point, configuration), in point order (:func:`summary_row`); ``family``: the
    sweep's :func:`sweep_family`, computed here when not given."""
    standing = (family or sweep_family(points))["standing"]
    return [summary_row(point, experiment, headline, standing.get(fingerprint(experiment), False))
            for point in points for experiment, headline in zip(point.results.experiments, headline_rows(point.results))]


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    return buffer.getvalue()


def tidy_rows(points: list[SweepPoint], axes: list[str]) -> list[dict[str, Any]]:
    """Every point's tidy rows (results.csv) with the point and its values in front."""
    names = [f.name for f in fields(Row)]
    return [{"point": p.name, **{a: _value_text(p.values[a]) for a in axes}, **{n: getattr(row, n) for n in names}}
            for p in points for row in p.results.rows]


def summary_csv(rows: list[dict[str, Any]], axes: list[str]) -> str:
    """``sweep.csv``: :func:`summary_rows` with the point's name and axes in front."""
    return _csv(rows, ["point", *axes, *SUMMARY_COLUMNS])


def tidy_csv(points: list[SweepPoint], axes: list[str]) -> str:
    """``sweep-rows.csv``: :func:`tidy_rows`."""
    return _csv(tidy_rows(points, axes), ["point", *axes, *[f.name for f in fields(Row)]])


def sweep_document(points: list[SweepPoint], axes: list[str], rows: list[dict[str, Any]], family: dict[str, Any],
                   stored: int, trained: int) -> dict[str, Any]:
    """``sweep.json``: the axes and their values, the points, the runs, the sweep-wide family
    (:func:`sweep_family`) and the rows (:func:`summary_rows`)."""
    return {
        "format": SWEEP_FORMAT,
        "axes": {a: list({_value_text(p.values[a]): p.values[a] for p in points}.values()) for a in axes},
        "points": [{"name": p.name, "values": p.values, "folder": p.folder, "reused": p.reused,
                    "trained_runs": p.trained_runs} for p in points],
        "runs": {"stored": stored, "trained": trained},
        "family": {"figures": family["figures"], "alpha": family["alpha"],
                   "violations_standing": sum(1 for r in rows if r["sweep_verdict"] == VerdictStatus.VIOLATION)},
        "rows": rows,
    }


def write_sweep_figures(points: list[SweepPoint], folder: Path) -> list[tuple[str, list[Path]]]:
    """Every figure of :func:`sweep_figures` as PNG and PDF in ``folder``: (title, files) of each."""
    folder.mkdir(parents=True, exist_ok=True)
    return [(title, save_figure(figure, folder, stem)) for stem, title, figure in sweep_figures(points)
            if figure is not None]


def sweep_figures(points: list[SweepPoint]) -> list[tuple[str, str, Any]]:
    """(file stem, title, matplotlib figure or None) of the sweep's figures, over every distinct experiment."""
    experiments = [e for _, e in combined_experiments(points)]
    return [
        ("privacy-utility", "Privacy–utility: test accuracy vs claimed ε", plots.accuracy_vs_epsilon.figure(experiments)),
        ("leakage-auc", "Membership leakage (AUC) vs claimed ε", epsilon_plots.leakage_vs_epsilon.figure(experiments, "auc")),
        ("claimed-vs-measured", "Measured ε lower bounds vs what the claims allow",
         epsilon_plots.empirical_vs_claimed.figure(experiments)),
    ]
