"""The tidy results table and the files it is written to.

One row per (experiment, attack, metric) — long format, DESIGN.md's columns:

    run, dataset, defense, label, epsilon, delta, unit, accountant, seed, attack, metric, value, ci_low, ci_high

``run`` is the experiment key (a defense at one ε; its N membership runs are summarised);
``epsilon`` is the claimed headline ε (empty for non-private defenses); utility rows have attack
``none``; rows with attack ``claim`` give the claim per observer (metric ``epsilon_released``,
``epsilon_server``, ``epsilon_local``; an empty value: not covered). Missing intervals are empty
cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from audit.atomic import dumps, write_text
from audit.errors import UserInputError

SCHEMA_VERSION = "2.1"  # reports/schema/results.schema.json describes it
COLUMNS = ["run", "dataset", "defense", "label", "epsilon", "delta", "unit", "accountant", "seed",
           "attack", "metric", "value", "ci_low", "ci_high"]


def rows_from_results(document: dict[str, Any]) -> list[dict[str, Any]]:
    audit = document["audit"]
    rows = []
    for experiment in document["experiments"]:
        claim = experiment["claim"]
        common = {
            "run": experiment["key"], "dataset": audit["dataset"], "defense": experiment["defense"],
            "label": experiment["label"], "epsilon": claim["epsilon"], "delta": claim["delta"],
            "unit": claim["unit"], "accountant": claim["accountant"], "seed": audit["seed"],
        }
        for entry in claim.get("adversaries") or []:  # the claim per observer; an empty value: not covered
            rows.append({**common, "attack": "claim", "metric": f"epsilon_{entry['adversary']}", "value": entry["epsilon"],
                         "ci_low": None, "ci_high": None})
        for metric, estimate in experiment["utility"].items():
            rows.append({**common, "attack": "none", "metric": metric, "value": estimate["value"],
                         "ci_low": estimate["ci_low"], "ci_high": estimate["ci_high"]})
        for attack in experiment["attacks"]:
            for metric, estimate in attack["metrics"].items():
                rows.append({**common, "attack": attack["attack"], "metric": metric, "value": estimate["value"],
                             "ci_low": estimate["ci_low"], "ci_high": estimate["ci_high"]})
    return rows


def results_frame(document: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(document["rows"], columns=COLUMNS)


def write_results(document: dict[str, Any], out: Path) -> dict[str, str]:
    """Write ``results.csv`` and ``results.json`` atomically; returns their paths."""
    csv_path, json_path = Path(out) / "results.csv", Path(out) / "results.json"
    write_text(csv_path, results_frame(document).to_csv(index=False, lineterminator="\n"))
    write_text(json_path, dumps(document) + "\n")
    return {"results_csv": str(csv_path), "results_json": str(json_path)}


def load_results(path: str | Path, option: str = "results") -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(results.json document, manifest.json or {}, results folder) from a `dpfl-audit run` output
    folder or its results.json. Bad input raises :class:`UserInputError` naming ``option``."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        missing = f"no results.json in directory '{path}'" if path.is_dir() else f"'{path}' does not exist"
        raise UserInputError(f"{option}: {missing}; give an output directory of `dpfl-audit run` or its results.json")
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{option}: '{file}' is not a readable JSON document: {exc}") from None
    experiments = document.get("experiments") if isinstance(document, dict) else None
    if not isinstance(experiments, list):
        raise UserInputError(f"{option}: '{file}' has no 'experiments' list; is it the results.json of `dpfl-audit run`?")
    for i, experiment in enumerate(experiments):
        if not isinstance(experiment, dict) or not isinstance(experiment.get("key"), str):
            raise UserInputError(f"{option}: '{file}': experiments[{i}] has no 'key'; is it the results.json of `dpfl-audit run`?")
    manifest_file = file.parent / "manifest.json"
    manifest = json.loads(manifest_file.read_text(encoding="utf-8")) if manifest_file.is_file() else {}
    return document, manifest, file.parent
