"""The audit pipeline: plan → train runs → attack → results → report.

:func:`audit.planning.plan_audit` checks everything a config asks for — registry names,
hyper-parameters, dataset files, the model, partitions, noise calibration — before anything is
written, so bad input fails fast with a one-line error and leaves no output directory.
:func:`run_audit` then takes the plan through the stages, each taking the plan and the records of
the stages before it and returning its own: :func:`audit.training.train_runs` (every run not yet in
the store) → :class:`audit.training.TrainedRuns`; :func:`audit.attacking.attack_runs` →
:class:`audit.attacking.AttackResults`; :func:`audit.summary.build_results` → the results
document, written as ``results.csv``, ``results.json``, ``report.html`` and ``manifest.json``.
A rerun reads back from ``<out>/cache`` every attack, diagnostic, verdict, figure and report
whose inputs have not changed (:mod:`audit.stage_cache`) and rewrites no file whose bytes would
be the same; ``manifest.json`` lists what it reused and what it computed.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audit import __version__, provenance
from audit.attacking import AttackResults, attack_runs
from audit.budget import remember_flop_counts
from audit.config import AuditConfig, config_to_yaml
from audit.core.atomic import update_text, write_json
from audit.core.exact_json import NotExact
from audit.core.output_folder import claim
from audit.diagnosis import diagnose_runs
from audit.planning import Plan, plan_audit
from audit.stage_cache import StageCache, key_of
from audit.store import RunStore
from audit.summary import build_results
from audit.training import TrainedRuns, train_runs
from reports.document import Results
from reports.figures import write_figures
from reports.html import write_report
from reports.results import results_frame, write_results

if TYPE_CHECKING:
    import pandas as pd

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditOutcome:
    """What an audit did: its output folder, the files it wrote (``paths``: name → path, e.g.
    ``results_json``, ``results_csv``, ``report``, ``figures``, ``manifest``, ``runs``), the runs
    trained, and — when it attacked — the attacks' results and the results document."""

    out: Path
    paths: Mapping[str, str]
    trained: TrainedRuns
    attacked: AttackResults | None = None
    results: Results | None = None

    @property
    def frame(self) -> pd.DataFrame:
        """The results table as a pandas DataFrame: the rows and columns of ``results.csv``
        (:func:`reports.results.results_frame`). An audit that did not attack has none: a
        :class:`~audit.core.errors.UserInputError` says so."""
        return results_frame(self)


def chance_level(plan: Plan) -> dict[str, float | int]:
    """The accuracy of always predicting the test set's most common class, and the number of
    classes: what a model's test accuracy must clearly beat before the report speaks of a
    privacy–utility trade-off (kept in manifest.json, so ``dpfl-audit report`` finds it again)."""
    labels = np.asarray(plan.task.test.labels).astype(np.int64).ravel()
    counts = np.bincount(labels) if labels.size else np.zeros(1, dtype=np.int64)
    classes = int(plan.task.dataset.num_classes)
    return {"accuracy": float(counts.max() / labels.size) if labels.size else 1.0 / max(classes, 1), "classes": classes}


def _write_pages(summary: Results, out: Path, cache: StageCache, chance: dict[str, float | int]) -> dict[str, str]:
    """report.html and the figures of ``summary``, each skipped where the cache holds them for these
    exact results and this code (the files' bytes checked); returns their paths."""
    extra = {"versions": provenance.versions(), "machine": provenance.machine(), "chance": chance}
    report, figures = out / "report.html", out / "figures"
    try:
        results_key = key_of({"code": cache.code, "results": summary}) if cache.enabled else None
    except NotExact:
        results_key = None
    report_key = None if results_key is None else key_of({"results": results_key, "extra": extra})
    if report_key is None or cache.lookup("report", report_key, {}) is None:
        write_report(summary, report, manifest_extra=extra)
        if report_key is not None:
            cache.store("report", report_key, "report.html", [report])
    figures_key = None if results_key is None else key_of({"results": results_key, "chance": chance})
    if figures_key is None or cache.lookup("figures", figures_key, {}) is None:
        written = write_figures(summary, figures, float(chance["accuracy"]))
        LOG.debug("figures: %s", ", ".join(p.name for p in written))
        if figures_key is not None:
            cache.store("figures", figures_key, sorted(p.name for p in written), written)
    return {"report": str(report), "figures": str(figures)}


def train(plan: Plan, out: str | Path, quiet: bool = True) -> TrainedRuns:
    """Train every run of ``plan`` not yet stored under ``out`` (public API): the membership runs,
    then each canary audit's runs. Rerunning resumes; returns what was trained (and where)."""
    store = RunStore(claim(out))  # created, locked, stale temporary files removed
    store.clean_staging()
    return train_runs(plan, store, quiet)


def attack(plan: Plan, out: str | Path, quiet: bool = True) -> AttackResults:
    """Every attack of ``plan`` on every experiment (public API), training first what is not yet
    stored under ``out``; returns the attacks' results (``.results[experiment key]``: the
    :class:`attacks.base.AttackResult` list; scores saved under ``out/attacks``)."""
    return attack_runs(plan, train(plan, out, quiet), Path(out), quiet)


def run_audit(config: AuditConfig, out: str | Path, *, attack: bool = True, quiet: bool = False,
              plan: Plan | None = None, executor: str = "local", workers: int | None = None,
              batch_runs: int | None = None, ray_address: str | None = None,
              runs: str | Path | None = None, cache: bool = True) -> AuditOutcome:
    """Plan (unless given), train, attack and report; returns what was done and written.

    ``runs``: the folder of the run store (default ``out``). The points of a sweep share one:
    a run's id hashes everything that determines its training, so a run two points both need is
    trained once. ``cache``: reuse what ``<out>/cache`` kept of the attacks, diagnostics, figures
    and report whose inputs have not changed (:mod:`audit.stage_cache`); False recomputes them all."""
    started = time.perf_counter()
    plan = plan or plan_audit(config)
    LOG.info("plan: %d experiment(s) (%s), %d membership runs each, %d attack(s), %d canary audit(s); output %s",
             len(plan.experiments), ", ".join(e.label for e in plan.experiments), config.membership.runs,
             len(config.attacks), len(plan.canary_audits), out)
    out = claim(out)  # created and locked now, every check passed (audit.core.output_folder)
    store = RunStore(out if runs is None else claim(runs))
    store.clean_staging()
    update_text(out / "config.yaml", config_to_yaml(config))
    trained = train_runs(plan, store, quiet, executor, workers, batch_runs, ray_address)
    stages = StageCache(out, enabled=cache)
    remember_flop_counts(stages)  # the budget check's, for the next command on this folder
    attacked = attack_runs(plan, trained, out, quiet, stages) if attack else None
    paths: dict[str, str] = {"out": str(out), "runs": str(store.runs)}
    chance = chance_level(plan)
    summary = None
    if attacked is not None:
        summary = build_results(plan, trained, attacked, diagnose_runs(plan, trained, out, quiet, stages), stages)
        paths.update(write_results(summary, out))
        paths.update(_write_pages(summary, out, stages, chance))
        for experiment in summary.experiments:
            LOG.info("%s: %s", experiment.label, experiment.soundness_text)
        LOG.info("wrote %s", ", ".join(str(p) for k, p in paths.items() if k not in ("out", "runs")))
    write_json(out / "manifest.json", {
        "tool": {"name": "dpfl-audit", "version": __version__},
        "command": " ".join(sys.argv),
        "config_seed": config.seed,
        "experiments": {e.key: list(trained.run_ids.get(e.key, ())) for e in plan.experiments},
        "cache": {"reused": stages.hits, "computed": stages.misses} if cache else None,
        "timings": {"train_seconds": dict(trained.seconds), "attack_seconds": dict(attacked.seconds) if attacked else {},
                    "total_seconds": time.perf_counter() - started},
        "versions": provenance.versions(),
        "machine": provenance.machine(),
        "chance": chance,
    })
    paths["manifest"] = str(out / "manifest.json")
    return AuditOutcome(out, paths, trained, attacked, summary)
