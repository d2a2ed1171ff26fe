"""Assemble an audit's results document (``results.json``) from the plan, the run store and the attacks.

Everything the CSV, the HTML report and the CI gate show derives from this document, so it
holds no timings (those live in ``manifest.json``): the same seed on the same machine gives
the same document byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from attacks.base import MEMBERSHIP_METRICS, AttackResult
from audit import __version__, provenance
from audit.core.metrics import mean_estimate
from audit.core.schema import to_mapping
from audit.planning import Plan
from audit.store import RunStore
from audit.training import trained_claim
from defenses.accounting import dp_accounting_version
from reports.results import SCHEMA_VERSION, rows_from_results
from reports.soundness import attack_verdicts, experiment_sentence, experiment_verdict

ROUND_METRICS = ("test_accuracy", "test_loss", "train_accuracy", "update_norm_median", "update_norm_q25",
                 "update_norm_q75", "clip_fraction", "epsilon")


def mean_interval(values: list[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean over runs with a Student-t interval (:func:`audit.core.metrics.mean_estimate`) as a
    results.json entry: null bounds below two finite values, the per-run values above."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return {"value": None, "ci_low": None, "ci_high": None, "runs": len(values)}
    estimate = mean_estimate(finite, confidence)
    if len(finite) < 2:
        return {"value": estimate.value, "ci_low": None, "ci_high": None, "runs": len(values)}
    return {"value": estimate.value, "ci_low": estimate.low, "ci_high": estimate.high, "runs": len(values),
            "per_run": finite}


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
        "epsilon_kind": dict(result.epsilon_kind),
        "roc": {"fpr": list(result.roc[0]), "tpr": list(result.roc[1])},
        "kind": result.kind,
        "figures": list(result.figures),
    }


def _with_verdicts(claim: dict[str, Any], attacks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, str]:
    """Each attack entry gets its verdicts (reports.soundness); the experiment its overall status
    and the sentence behind it."""
    everything, names = [], []
    for entry in attacks:
        entry["verdicts"] = attack_verdicts(claim, entry)
        everything += entry["verdicts"]
        names += [entry["attack"]] * len(entry["verdicts"])
    return attacks, experiment_verdict(everything), experiment_sentence(everything, names)


def _mean_curves(entries: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list[float]]:
    """Element-wise means over runs of list-valued fields (e.g. sharpness per radius)."""
    return {k: np.mean([e[k] for e in entries], axis=0).tolist() for k in keys}


def diagnostics_summary(manifests: list[dict], metrics: list[list[dict]], landscape: list[dict]) -> dict[str, Any]:
    """Per-experiment diagnostics (spec 002 §6): train/test gap, clipping, update norms, flatness."""
    gaps, clip_fractions, first_norms, last_norms, train_accuracies = [], [], [], [], []
    bits: dict[str, list[float]] = {"up": [], "down": []}
    for manifest, rows in zip(manifests, metrics):
        final = next((r for r in reversed(rows) if "train_accuracy" in r), {})
        if final.get("train_accuracy") is not None and manifest["utility"]["test_accuracy"] is not None:
            train_accuracies.append(final["train_accuracy"])
            gaps.append(final["train_accuracy"] - manifest["utility"]["test_accuracy"])
        fractions = [r["clip_fraction"] for r in rows if "clip_fraction" in r]
        if fractions:
            clip_fractions.append(float(np.mean(fractions)))
        norms = [r["update_norm_median"] for r in rows if "update_norm_median" in r]
        if norms:
            first_norms.append(norms[0])
            last_norms.append(norms[-1])
        for direction in ("up", "down"):  # paper 003: exact bits a participating client sends / receives
            per_round = [r[f"bits_{direction}_per_client"] for r in rows if f"bits_{direction}_per_client" in r]
            if per_round:
                bits[direction].append(float(np.mean(per_round)))
    summary: dict[str, Any] = {
        "train_accuracy": mean_interval(train_accuracies),
        "generalization_gap": mean_interval(gaps),
        "clip_fraction": mean_interval(clip_fractions),
        "update_norm_median_first_round": mean_interval(first_norms),
        "update_norm_median_last_round": mean_interval(last_norms),
    }
    if bits["up"]:
        summary["bits_up_per_client_round"] = mean_interval(bits["up"])
        summary["bits_down_per_client_round"] = mean_interval(bits["down"])
    if landscape:
        summary["sharpness"] = {"radii": landscape[0]["sharpness"]["radii"],
                                **_mean_curves([e["sharpness"] for e in landscape], ("mean_rise", "max_rise"))}
        summary["robustness"] = {"stds": landscape[0]["robustness"]["stds"],
                                 **_mean_curves([e["robustness"] for e in landscape], ("accuracy", "accuracy_drop"))}
    return summary


def build_results(plan: Plan, store: RunStore, attack_results: dict[str, list[AttackResult]],
                  landscape: dict[str, list[dict]] | None = None) -> dict[str, Any]:
    config, task = plan.config, plan.task
    experiments = []
    for experiment in plan.experiments:
        ids = plan.run_ids[experiment.key]
        diverged = plan.diverged.get(experiment.key)
        # a diverged experiment is a result without a model: no utility, curves or diagnostics
        # (its finished runs alone would misstate it), its attacks listed as skipped
        manifests = [] if diverged else [store.load_manifest(rid) for rid in ids]
        metrics = [] if diverged else [store.load_metrics(rid) for rid in ids]
        claim = trained_claim(plan, store, experiment)
        attacks, soundness, soundness_text = _with_verdicts(claim, [_attack_entry(r) for r in attack_results.get(experiment.key, [])])
        if diverged:
            soundness_text = f"training diverged at round {diverged['round']}: nothing was measured"
        experiments.append({
            "key": experiment.key,
            "label": experiment.label,
            "defense": experiment.defense.name,
            "reference": experiment.defense.reference,
            "params": to_mapping(asdict(experiment.defense.params)),
            "training": to_mapping(experiment.training),
            "target_epsilon": experiment.target_epsilon,
            "claim": claim,
            "server_view": experiment.defense.observes,
            "utility": {
                "test_accuracy": mean_interval([m["utility"]["test_accuracy"] for m in manifests]),
                "test_loss": mean_interval([m["utility"]["test_loss"] for m in manifests]),
            },
            "rounds": _round_curves(metrics),
            "diagnostics": diagnostics_summary(manifests, metrics, (landscape or {}).get(experiment.key, [])),
            "attacks": attacks,
            "soundness": soundness,
            "soundness_text": soundness_text,
            "skipped_attacks": plan.skipped.get(experiment.key, []),
            "runs": ids,
            "canary_runs": {label: runs for (key, label), runs in plan.canary_ids.items() if key == experiment.key},
            "status": "diverged" if diverged else "completed",
            **({"diverged": dict(diverged)} if diverged else {}),
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
            "membership_unit": plan.membership.unit,
            "accounting": asdict(plan.accounting),
            "metric_definitions": MEMBERSHIP_METRICS,
        },
        "config": to_mapping(config),
        "versions": provenance.versions(),
        "experiments": experiments,
    }
    document["rows"] = rows_from_results(document)
    return document

