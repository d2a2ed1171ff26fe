"""Assemble an audit's results document (``results.json``) from the plan, the run store and the attacks.

Everything the CSV, the HTML report and the CI gate show derives from this document, so it
holds no timings (those live in ``manifest.json``): the same seed on the same machine gives
the same document byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from attacks.base import MEMBERSHIP_METRICS, AttackResult
from audit import __version__, provenance
from audit.schema import to_mapping
from audit.store import RunStore
from defenses.accounting import dp_accounting_version
from reports.results import SCHEMA_VERSION, rows_from_results

if TYPE_CHECKING:
    from audit.pipeline import Plan

ROUND_METRICS = ("test_accuracy", "test_loss", "update_norm_median", "clip_fraction", "epsilon")


def mean_interval(values: list[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean over runs with a Student-t interval (NaN bounds for fewer than two finite values)."""
    finite = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(finite) == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "runs": len(values)}
    mean = float(finite.mean())
    if len(finite) < 2:
        return {"value": mean, "ci_low": None, "ci_high": None, "runs": len(values)}
    half = float(stats.t.ppf(0.5 + confidence / 2, len(finite) - 1) * finite.std(ddof=1) / math.sqrt(len(finite)))
    return {"value": mean, "ci_low": mean - half, "ci_high": mean + half, "runs": len(values), "per_run": finite.tolist()}


def _round_curves(metrics_per_run: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rounds = max((len(m) for m in metrics_per_run), default=0)
    curves = []
    for t in range(rounds):
        row: dict[str, Any] = {"round": t + 1}
        for name in ROUND_METRICS:
            values = [m[t][name] for m in metrics_per_run if t < len(m) and m[t].get(name) is not None]
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                row[name] = float(np.mean(finite))
        curves.append(row)
    return curves


def _attack_entry(result: AttackResult) -> dict[str, Any]:
    return {
        "attack": result.name,
        "unit": result.unit,
        "notes": result.notes,
        "metrics": {name: {"value": e.value, "ci_low": e.low, "ci_high": e.high} for name, e in result.metrics.items()},
        "roc": {"fpr": list(result.roc[0]), "tpr": list(result.roc[1])},
    }


def build_results(plan: Plan, store: RunStore, attack_results: dict[str, list[AttackResult]]) -> dict[str, Any]:
    config, task = plan.config, plan.task
    experiments = []
    for experiment in plan.experiments:
        ids = plan.run_ids[experiment.key]
        manifests = [store.load_manifest(rid) for rid in ids]
        metrics = [store.load_metrics(rid) for rid in ids]
        experiments.append({
            "key": experiment.key,
            "label": experiment.label,
            "defense": experiment.defense.name,
            "reference": experiment.defense.reference,
            "params": to_mapping(asdict(experiment.defense.params)),
            "training": to_mapping(experiment.training),
            "target_epsilon": experiment.target_epsilon,
            "claim": experiment.claim.as_dict(),
            "server_view": experiment.defense.observes,
            "utility": {
                "test_accuracy": mean_interval([m["utility"]["test_accuracy"] for m in manifests]),
                "test_loss": mean_interval([m["utility"]["test_loss"] for m in manifests]),
            },
            "rounds": _round_curves(metrics),
            "attacks": [_attack_entry(r) for r in attack_results.get(experiment.key, [])],
            "runs": ids,
        })
    model = task.model_factory()
    document = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "dpfl-audit", "version": __version__, "dp_accounting": dp_accounting_version()},
        "audit": {
            "name": config.name,
            "seed": config.seed,
            "dataset": config.dataset.name,
            "dataset_source": task.dataset.source,
            "kind": task.kind,
            "pool_size": len(task.pool),
            "test_size": len(task.test),
            "clients": config.partition.clients,
            "partition": config.partition.name,
            "model": config.model.name,
            "model_parameters": sum(p.numel() for p in model.parameters()),
            "membership_runs": config.membership.runs,
            "accounting": asdict(plan.accounting),
            "metric_definitions": MEMBERSHIP_METRICS,
        },
        "config": to_mapping(config),
        "versions": provenance.versions(),
        "experiments": experiments,
    }
    document["rows"] = rows_from_results(document)
    return document
