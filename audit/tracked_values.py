"""What an experiment tracker is sent for one configuration of results.json: its params (what
was run), metrics (what was measured, each with its 95 % interval), per-round scalars and tags (the
verdicts, the keys a rerun matches, the git commit). Pure functions of the typed results document
(:mod:`reports.document`); :mod:`audit.tracking` sends them.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the reports (pandas, jsonschema) load when something is tracked
    from reports.document import Experiment, Results

#: tags that identify a tracked experiment: a rerun finds them and adds nothing
TAG_DIGEST, TAG_EXPERIMENT = "dpfl-audit.results_sha256", "dpfl-audit.experiment"
#: MLflow's own tags: the git commit (shown on a run's page) and the parent of a nested run
TAG_COMMIT, TAG_PARENT = "mlflow.source.git.commit", "mlflow.parentRunId"
#: sweeps: what a run is (sweep, point, configuration), the sweep's digest, a point's name, the
#: points a configuration belongs to
TAG_KIND, TAG_SWEEP_DIGEST = "dpfl-audit.run", "dpfl-audit.sweep_sha256"
TAG_POINT, TAG_POINTS = "dpfl-audit.point", "dpfl-audit.points"
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_./ -]")
#: MLflow's limits on a param's and a tag's length (mlflow.utils.validation)
_PARAM_LENGTH, _TAG_LENGTH = 6000, 8000


def _finite(value: Any) -> float | None:
    """A number a tracker can plot (None, NaN, ±inf and non-numbers: not recorded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def metric_key(*parts: str) -> str:
    """``a/b`` from parts, with what MLflow refuses in a key replaced (``%`` → ``pct``), so that
    ``tpr_at_fpr_1%`` of attack ``lira`` becomes ``lira/tpr_at_fpr_1pct``."""
    return "/".join(_KEY_UNSAFE.sub("_", part.replace("%", "pct")).strip("/") or "_" for part in parts)


def _text(value: Any) -> str:
    """A param value: text as it is, anything else as JSON (``null``, ``true``, ``[1, 2]``)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def experiment_params(results: Results, experiment: Experiment) -> dict[str, str]:
    """What one configuration was: the defense and its hyper-parameters, the training settings,
    the claim, and the task it ran on."""
    audit, claim = results.audit, experiment.claim
    params: dict[str, Any] = {
        "experiment": experiment.key, "defense": experiment.defense, "target_epsilon": experiment.target_epsilon,
        "epsilon": claim.epsilon if claim.is_private else None, "delta": claim.delta, "unit": claim.unit,
        "relation": claim.relation, "accountant": claim.accountant, "server_view": experiment.server_view,
        "rounds": experiment.training.get("rounds"), "clients": audit.clients, "partition": audit.partition,
        "model": audit.model, "dataset": audit.dataset, "seed": audit.seed, "membership_runs": audit.membership_runs,
        "membership_unit": audit.membership_unit, "pool_size": audit.pool_size, "test_size": audit.test_size,
    }
    params.update({metric_key("defense", name): value for name, value in experiment.params.items()})
    params.update({metric_key("training", name): value for name, value in experiment.training.items()})
    return {key: _text(value)[:_PARAM_LENGTH] for key, value in params.items()}


def _with_interval(block: str, name: str, estimate: Any) -> dict[str, float | None]:
    """``block/name`` and its 95 % interval as ``block/name_ci_low`` and ``block/name_ci_high``
    (the names of the sweep table's interval columns)."""
    return {metric_key(block, name): estimate.value, metric_key(block, f"{name}_ci_low"): estimate.ci_low,
            metric_key(block, f"{name}_ci_high"): estimate.ci_high}


def experiment_metrics(experiment: Experiment) -> dict[str, float]:
    """Final figures of one configuration: utility, the claim's ε per observer it covers, and every
    metric of every attack (``<attack>/<metric>``), each estimate with the bounds of its 95 %
    interval (``<attack>/<metric>_ci_low``, ``..._ci_high``: for an ε lower bound, ``ci_low`` is
    the bound); figures that are null are left out."""
    metrics: dict[str, float | None] = {
        **_with_interval("utility", "test_accuracy", experiment.utility.test_accuracy),
        **_with_interval("utility", "test_loss", experiment.utility.test_loss),
        "claim/epsilon": experiment.claim.epsilon if experiment.claim.is_private else None,
    }
    for entry in experiment.claim.adversaries:
        metrics[metric_key("claim", f"epsilon_{entry.adversary}")] = entry.epsilon if entry.covered else None
    for attack in experiment.attacks:
        for name, estimate in attack.metrics.items():
            metrics.update(_with_interval(attack.attack, name, estimate))
    return {key: number for key, value in metrics.items() if (number := _finite(value)) is not None}


def round_scalars(experiment: Experiment) -> Iterator[tuple[int, str, float]]:
    """(round, ``round/<metric>``, value) for each finite per-round figure results.json keeps."""
    for row in experiment.rounds:
        step = int(row["round"])  # type: ignore[arg-type]
        for name, value in row.items():
            number = _finite(value)
            if name != "round" and number is not None:
                yield step, metric_key("round", name), number


def git_commit(*places: Path) -> str | None:
    """The commit checked out (``git rev-parse HEAD``) in the repository holding the first of
    ``places`` that is in one — by default the current directory, then this package's source;
    None without git or outside any repository."""
    for place in places or (Path.cwd(), Path(__file__).resolve().parent):
        try:
            done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=place, capture_output=True, text=True, timeout=30,
                                  check=False)
        except (OSError, subprocess.SubprocessError):  # no git, or a folder that is gone
            return None
        commit = done.stdout.strip()
        if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
            return commit
    return None


def experiment_tags(experiment: Experiment, digest: str, commit: str | None = None) -> dict[str, str]:
    """The verdict (the experiment's, and each ε figure's), status, the keys a rerun matches, and
    the git commit when there is one."""
    tags = {
        "verdict": experiment.soundness, "status": experiment.status, "label": experiment.label,
        "mlflow.note.content": f"{experiment.label}: {experiment.soundness}. {experiment.soundness_text}".strip(),
        TAG_EXPERIMENT: experiment.key, TAG_DIGEST: digest,
    }
    if commit is not None:
        tags[TAG_COMMIT] = commit
    for attack in experiment.attacks:
        for verdict in attack.verdicts:
            tags[metric_key("verdict", attack.attack, verdict.metric)] = verdict.status
    return {key: value[:_TAG_LENGTH] for key, value in tags.items()}
