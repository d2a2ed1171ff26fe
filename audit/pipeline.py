"""The audit pipeline: plan → train runs → attack → results → report.

:func:`plan_audit` checks everything a config asks for — registry names, hyper-parameters,
dataset files, the model, partitions, noise calibration — before anything is written, so bad
input fails fast with a one-line error and leaves no output directory. :func:`run_audit`
then trains every run (skipping runs already in the store), runs the attacks and writes
``results.csv``, ``results.json``, ``report.html`` and ``manifest.json``.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from attacks.attack_result import AttackResult
from audit import __version__, provenance
from audit.attacking import attack_runs
from audit.config import AuditConfig, config_to_yaml
from audit.core.atomic import write_json, write_text
from audit.core.output_folder import claim
from audit.diagnosis import diagnose_runs
from audit.executors import train_in_processes, train_in_ray
from audit.planning import Plan, plan_audit, run_id
from audit.store import RunStore
from audit.summary import build_results
from audit.training import progress_bar, run_groups, train_canary_runs, train_membership_runs, warn
from reports.figures import write_figures
from reports.html import write_report
from reports.results import write_results

LOG = logging.getLogger(__name__)


def train_runs(plan: Plan, store: RunStore, quiet: bool = False, executor: str = "local",
               workers: int | None = None, batch_runs: int | None = None,
               ray_address: str | None = None) -> dict[str, float]:
    """Train every run of every experiment not yet in the store — the membership runs (here, in
    groups trained together, or in worker processes: :mod:`audit.executors`), then each canary
    audit's own runs; returns seconds per experiment."""
    config = plan.config
    timings: dict[str, float] = {}
    if executor == "process":
        train_in_processes(plan, store, workers, quiet, batch_runs)
    elif executor == "ray":
        train_in_ray(plan, store, workers, quiet, ray_address, batch_runs)
    for experiment in plan.experiments:
        ids = plan.run_ids[experiment.key] = [run_id(plan, experiment, r) for r in range(config.membership.runs)]
        started = time.perf_counter()
        LOG.info("training %s: %d membership runs (%d stored already)", experiment.label, len(ids),
                 sum(store.is_complete(rid) for rid in ids))
        bar = progress_bar(config.membership.runs, f"train {experiment.label}", quiet)
        groups = run_groups(plan, store, experiment, batch_runs)
        bar.update(config.membership.runs - sum(len(g) for g in groups))  # resumed from the store
        # groups go in run order, so the first group with a diverged run holds the lowest-index one
        # (every earlier run is stored and finite): a rerun records the same run and round
        for group in groups:
            LOG.debug("%s: runs %s train together", experiment.label, ", ".join(str(r) for r in group))
            bar.set_postfix_str(f"{len(group)} together", refresh=False)
            train_membership_runs(plan, store, experiment, group)
            bar.update(len(group))
            if experiment.key in plan.diverged:
                break  # the experiment is a diverged result: its remaining runs need not train
        bar.close()
        diverged = plan.diverged.get(experiment.key)
        if diverged is not None:
            plan.run_ids[experiment.key] = ids[:diverged["run"]]  # the runs that finished before it
            warn(f"{experiment.label!r} run {diverged['run']} diverged at round {diverged['round']} "
                 f"({diverged['what']}); its attacks are skipped")
        else:
            for audit in plan.canary_audits:
                train_canary_runs(plan, store, experiment, audit, quiet)
        timings[experiment.key] = time.perf_counter() - started
        LOG.info("trained %s in %.1f s", experiment.label, timings[experiment.key])
    return timings


def train(plan: Plan, out: str | Path, quiet: bool = True) -> RunStore:
    """Train every run of ``plan`` not yet stored under ``out`` (public API): the membership runs,
    then each canary audit's runs. Rerunning resumes; returns the run store."""
    store = RunStore(claim(out))  # created, locked, stale temporary files removed
    store.clean_staging()
    train_runs(plan, store, quiet)
    return store


def attack(plan: Plan, out: str | Path, quiet: bool = True) -> dict[str, list[AttackResult]]:
    """Every attack of ``plan`` on every experiment (public API), training first what is not yet
    stored under ``out``; returns ``{experiment key: [AttackResult, ...]}`` (scores saved under
    ``out/attacks``)."""
    store = train(plan, out, quiet)
    return attack_runs(plan, store, Path(out), quiet)[0]


def run_audit(config: AuditConfig, out: str | Path, *, attack: bool = True, quiet: bool = False,
              plan: Plan | None = None, executor: str = "local", workers: int | None = None,
              batch_runs: int | None = None, ray_address: str | None = None,
              runs: str | Path | None = None) -> dict[str, Any]:
    """Plan (unless given), train, attack and report. Returns paths and the results summary.

    ``runs``: the folder of the run store (default ``out``). The points of a sweep share one:
    a run's id hashes everything that determines its training, so a run two points both need is
    trained once."""
    started = time.perf_counter()
    plan = plan or plan_audit(config)
    LOG.info("plan: %d experiment(s) (%s), %d membership runs each, %d attack(s), %d canary audit(s); output %s",
             len(plan.experiments), ", ".join(e.label for e in plan.experiments), config.membership.runs,
             len(config.attacks), len(plan.canary_audits), out)
    out = claim(out)  # created and locked now, every check passed (audit.core.output_folder)
    store = RunStore(out if runs is None else claim(runs))
    store.clean_staging()
    write_text(out / "config.yaml", config_to_yaml(config))
    train_seconds = train_runs(plan, store, quiet, executor, workers, batch_runs, ray_address)
    attack_results, attack_seconds = attack_runs(plan, store, out, quiet) if attack else ({}, {})
    diagnostics = diagnose_runs(plan, store, out, quiet) if attack else {}
    paths: dict[str, Any] = {"out": str(out), "runs": str(store.runs)}
    summary = None
    if attack:
        summary = build_results(plan, store, attack_results, diagnostics)
        paths.update(write_results(summary, out))
        paths["report"] = str(write_report(summary, out / "report.html", manifest_extra={
            "versions": provenance.versions(), "machine": provenance.machine()}))
        paths["figures"] = str(out / "figures")
        LOG.debug("figures: %s", ", ".join(p.name for p in write_figures(summary, out / "figures")))
        for experiment in summary.experiments:
            LOG.info("%s: %s", experiment.label, experiment.soundness_text)
        LOG.info("wrote %s", ", ".join(str(p) for k, p in paths.items() if k not in ("out", "runs")))
    write_json(out / "manifest.json", {
        "tool": {"name": "dpfl-audit", "version": __version__},
        "command": " ".join(sys.argv),
        "config_seed": config.seed,
        "experiments": {e.key: plan.run_ids.get(e.key, []) for e in plan.experiments},
        "timings": {"train_seconds": train_seconds, "attack_seconds": attack_seconds,
                    "total_seconds": time.perf_counter() - started},
        "versions": provenance.versions(),
        "machine": provenance.machine(),
    })
    paths["manifest"] = str(out / "manifest.json")
    return {"paths": paths, "summary": summary}
