"""A sweep sent to MLflow (``dpfl-audit sweep --track mlflow``): one parent run for the sweep,
a child run per point, and one run per configuration, tracked once (see :mod:`audit.tracking`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from audit.core.atomic import file_sha256
from audit.core.errors import UserInputError
from audit.core.safe_names import inside
from audit.tracked_values import (
    _PARAM_LENGTH,
    TAG_COMMIT,
    TAG_KIND,
    TAG_PARENT,
    TAG_POINT,
    TAG_POINTS,
    TAG_SWEEP_DIGEST,
    _text,
    git_commit,
    metric_key,
)
from audit.tracking import (
    ARTIFACT_FILES,
    _chatter_hidden,
    _configuration_run,
    _failures_reported,
    _log,
    _log_files,
    _mlflow_client,
    _mlflow_experiment,
    check_tracking,
)

LOG = logging.getLogger(__name__)

#: the files of a sweep's folder logged as artefacts of its parent run (figures/ too)
SWEEP_ARTIFACT_FILES = ("sweep.html", "sweep.csv", "sweep-rows.csv", "sweep.json", "config.yaml", "manifest.json")


def _sweep_points(out: Path) -> tuple[dict[str, list[Any]], list[Any]]:
    """The sweep's axes (path → values) and its points (:class:`reports.sweep.SweepPoint`), read
    back from ``out/manifest.json`` and each point's results.json."""
    from reports.results import load_results
    from reports.sweep import SweepPoint

    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserInputError(f"--track mlflow: '{out}' holds no finished sweep (manifest.json: {error})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("axes"), dict) or not isinstance(
            manifest.get("points"), dict):
        raise UserInputError(f"--track mlflow: '{out}' holds no finished sweep (manifest.json without axes and points)")
    points = []
    for name, entry in manifest["points"].items():
        results, _, _ = load_results(inside(out, out / entry["folder"]), "sweep point")
        points.append(SweepPoint(name, entry["values"], entry["folder"], results))
    return manifest["axes"], points


def _axis_entries(values: dict[str, Any]) -> dict[str, str]:
    """``axis/<path>`` → the value, as JSON text (``axis/defenses.1.epsilons`` → ``4``)."""
    return {metric_key("axis", path): _text(value)[:_PARAM_LENGTH] for path, value in values.items()}


def track_sweep(out: str | Path, uri: str | None = None) -> str:
    """Send a finished sweep (the folder ``dpfl-audit sweep`` wrote) to MLflow as one parent run,
    a child run per point and a run per configuration (see the module docstring); returns the
    tracking URI. Tracking the same sweep results again adds nothing. Bad input raises
    :class:`UserInputError`, a failure while sending :class:`TrackingError`."""
    check_tracking(["mlflow"], uri)
    out = Path(out)
    axes, points = _sweep_points(out)
    digests = {p.name: file_sha256(out / p.folder / "results.json") for p in points}
    digest = hashlib.sha256(json.dumps({"axes": axes, "points": {p.name: [p.values, digests[p.name]] for p in points}},
                                       sort_keys=True).encode()).hexdigest()
    with _failures_reported("mlflow", "the sweep", f"its results are written in '{out}'",
                            "finished points are not audited again"):
        import mlflow  # noqa: F401  (first: importing it sets its loggers' levels, which we then lower)
        with _chatter_hidden():
            return _track_sweep_mlflow(out, uri, axes, points, digest, digests)


def _track_sweep_mlflow(out: Path, uri: str | None, axes: dict[str, list[Any]], points: list[Any], digest: str,
                        digests: dict[str, str]) -> str:
    from reports.sweep import combined_experiments, fingerprint

    client, tracking_uri, artifact_location = _mlflow_client(out, uri)
    first = points[0].results.audit
    experiment_id = _mlflow_experiment(client, first.name, first.dataset, artifact_location)
    if client.search_runs([experiment_id], max_results=1, filter_string=(
            f"tags.`{TAG_SWEEP_DIGEST}` = '{digest}' and tags.`{TAG_KIND}` = 'sweep' and attributes.status = 'FINISHED'")):
        LOG.info("mlflow: the sweep in %s is tracked already (same points and results)", out)
        return tracking_uri
    commit = git_commit()
    common = {} if commit is None else {TAG_COMMIT: commit}
    opened: list[str] = []
    try:
        sweep_id = client.create_run(experiment_id, run_name=out.resolve().name).info.run_id
        opened.append(sweep_id)
        _log(client, sweep_id, {**_axis_entries(axes), "points": str(len(points))},
             {**common, TAG_KIND: "sweep", TAG_SWEEP_DIGEST: digest, "dpfl-audit.axes": ", ".join(axes),
              "dpfl-audit.sweep_folder": str(out.resolve())})
        _log_files(client, sweep_id, out, SWEEP_ARTIFACT_FILES)
        point_ids = {}
        for point in points:
            run_id = client.create_run(experiment_id, run_name=f"{point.name}: {_point_label(point.values)}",
                                       tags={TAG_PARENT: sweep_id}).info.run_id
            opened.append(run_id)
            point_ids[point.name] = run_id
            tags = {**common, TAG_KIND: "point", TAG_POINT: point.name, **_axis_entries(point.values),
                    "dpfl-audit.sweep_run": sweep_id}
            _log(client, run_id, _axis_entries(point.values), tags)
            _log_files(client, run_id, out / point.folder, ARTIFACT_FILES)
        members: dict[str, list[Any]] = {}  # configuration fingerprint → the points that have it
        for point in points:
            for experiment in point.results.experiments:
                members.setdefault(fingerprint(experiment), []).append(point)
        # each configuration once, named as the sweep's table names it (by the axes where it differs
        # between points); under its point, or under the sweep when several points share it
        for point, shown in combined_experiments(points):
            experiment = next(e for e in point.results.experiments if e.key == shown.key)  # as written (keys are unique)
            owners = members[fingerprint(experiment)]
            agreed = {path: owners[0].values[path] for path in axes if len({_text(p.values[path]) for p in owners}) == 1}
            tags = {TAG_KIND: "configuration", TAG_POINTS: ", ".join(p.name for p in owners),
                    "dpfl-audit.sweep_run": sweep_id, **_axis_entries(agreed)}
            run_id, params, metrics = _configuration_run(
                client, experiment_id, point.results, experiment, digests[point.name], commit,
                parent=point_ids[owners[0].name] if len(owners) == 1 else sweep_id, run_name=shown.label, extra_tags=tags)
            opened.append(run_id)
            LOG.info("mlflow: %s (%s) → run %s (%d params, %d metrics)", shown.label, tags[TAG_POINTS], run_id,
                     params, metrics)
    except BaseException:
        for run_id in reversed(opened):  # a rerun does not count a half-tracked sweep as tracked
            client.set_terminated(run_id, "FAILED")
        raise
    for run_id in reversed(opened):  # the parent last: a FINISHED sweep run means all of it is there
        client.set_terminated(run_id, "FINISHED")
    return tracking_uri


def _point_label(values: dict[str, Any]) -> str:
    return ", ".join(f"{path}={_text(value)}" for path, value in values.items())
