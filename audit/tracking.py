"""Sending a finished audit's results to an experiment tracker.

Teams that already keep their training runs in MLflow or TensorBoard want an audit's numbers
beside them, not in a separate HTML page only. ``dpfl-audit run --track mlflow`` and
``--track tensorboard`` do that once ``results.json`` is written; everything sent is read back
from that file (:func:`reports.results.load_results`), so what a tracker shows is exactly what
the report and the CI gate judged, and :func:`track_results` works on any results folder.

* **MLflow** (extra ``mlflow``): one MLflow *experiment* per audit (named after the config's
  ``name``) and one MLflow *run* per configuration of it (a defense at one ε: an experiment of
  results.json) holding params (defense and its hyper-parameters, training settings, the claim:
  ε, δ, unit, relation, accountant; dataset, model, clients, rounds, seed), metrics (utility,
  the claim's ε per observer, every attack metric — AUC, TPR at low FPR, ε lower bounds — and
  per-round curves with the round as step), tags (the verdict, per ε figure too) and artefacts
  (results.json, results.csv, report.html, config.yaml, manifest.json, figures/). The store is
  ``--track-uri``, else ``$MLFLOW_TRACKING_URI``, else a local store in ``OUT/mlruns/``
  (``mlflow.db``, SQLite, plus ``artifacts/``): MLflow 3 refuses its legacy file store unless
  told otherwise, and SQLite is its documented default backend. A directory given as the URI
  becomes such a local store. Tracking the same results.json into the same store again adds
  nothing (runs are tagged with the file's SHA-256), so rerunning a resumed audit is safe.
  Each estimate's 95 % interval is logged beside it (``lira-online/auc_ci_low``,
  ``lira-online/auc_ci_high``), and every run is tagged with the git commit
  (``mlflow.source.git.commit``) of the current directory's repository, else of the one this
  package was installed from; without git or a repository, no commit tag.
* **MLflow, sweeps** (``dpfl-audit sweep --track mlflow``, :func:`track_sweep`): one *parent run*
  for the sweep (named after its output folder; the axes and their values as params and tags; the
  sweep page, tables and figures as artefacts); one child run per point (tag
  ``mlflow.parentRunId``, the point's name and each axis value as tags and params, the point's
  results, report and figures as artefacts); and one run per configuration, tracked once: a
  configuration of one point is a child of that point's run, one that several points share —
  the undefended baseline of an ε sweep, trained once in the shared run store — a child of the
  sweep's run, tagged with every point it belongs to (``dpfl-audit.points``).
* **TensorBoard** (extra ``tensorboard``): the per-round scalars results.json keeps for each
  experiment (the mean over its membership runs of test accuracy and loss, train accuracy,
  update norms, clip fraction and ε spent so far, as recorded by training) written as event
  files under ``OUT/tensorboard/<experiment>/`` (or ``--track-uri``, a log directory), step =
  round. Each experiment's folder is written beside its place and renamed into it, replacing
  the previous one, so a rerun does not double the curves and a failure leaves no half folder.

:func:`check_tracking` runs with the other argument checks, before anything is trained or
written: a tracker whose package is missing, or a URI the tracker cannot open, is bad input
(:class:`UserInputError`, exit 2). A failure while sending (a server that does not answer) is
:class:`TrackingError`: the results are written by then, so the command says where they are.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from audit.core.atomic import file_sha256
from audit.core.errors import UserInputError, check_choice
from audit.core.extras import install_line
from audit.core.safe_names import inside, slug
from audit.integrations import importable

if TYPE_CHECKING:  # types only: the reports (pandas, jsonschema) load when something is tracked
    from reports.document import Experiment, Results

LOG = logging.getLogger(__name__)

#: tracker → (the pip extra that installs it, the modules it imports)
TRACKERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlflow": ("mlflow", ("mlflow",)),
    "tensorboard": ("tensorboard", ("tensorboard",)),
}
#: what the SQLite store MLflow keeps locally needs besides mlflow itself (mlflow-skinny lacks them)
SQL_MODULES = ("sqlalchemy", "alembic")
#: tracking URI schemes MLflow opens without plugins (database dialects take a +driver suffix)
MLFLOW_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
#: the files of a results folder logged as artefacts of every run (figures/ too)
ARTIFACT_FILES = ("results.json", "results.csv", "report.html", "config.yaml", "manifest.json")
#: tags that identify a tracked experiment: a rerun finds them and adds nothing
TAG_DIGEST, TAG_EXPERIMENT = "dpfl-audit.results_sha256", "dpfl-audit.experiment"
#: MLflow's own tags: the git commit (shown on a run's page) and the parent of a nested run
TAG_COMMIT, TAG_PARENT = "mlflow.source.git.commit", "mlflow.parentRunId"
#: sweeps: what a run is (sweep, point, configuration), the sweep's digest, a point's name, the
#: points a configuration belongs to
TAG_KIND, TAG_SWEEP_DIGEST = "dpfl-audit.run", "dpfl-audit.sweep_sha256"
TAG_POINT, TAG_POINTS = "dpfl-audit.point", "dpfl-audit.points"
#: the files of a sweep's folder logged as artefacts of its parent run (figures/ too)
SWEEP_ARTIFACT_FILES = ("sweep.html", "sweep.csv", "sweep-rows.csv", "sweep.json", "config.yaml", "manifest.json")
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_./ -]")
#: MLflow's limits per log_batch call (mlflow.utils.validation)
_BATCH_PARAMS_TAGS, _BATCH_METRICS = 100, 1000
_PARAM_LENGTH, _TAG_LENGTH = 6000, 8000


class TrackingError(RuntimeError):
    """Sending finished results to a tracker failed (after they were written); one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def install_hint(kind: str) -> str:
    return install_line(TRACKERS[kind][0])


def _require(kind: str, modules: Iterable[str]) -> None:
    missing = [m for m in modules if not importable(m)]
    if missing:
        raise UserInputError(f"--track {kind}: needs {', '.join(missing)}, which is not installed; "
                             f"install it with: {install_hint(kind)}")


def _mlflow_uri_from(uri: str | None) -> tuple[str | None, str]:
    """The URI asked for and the option that gave it: --track-uri, else $MLFLOW_TRACKING_URI."""
    if uri is not None:
        return uri, "--track-uri"
    return os.environ.get("MLFLOW_TRACKING_URI") or None, "MLFLOW_TRACKING_URI"


def _scheme(uri: str) -> str:
    """A URI's scheme without a database driver suffix (``postgresql+psycopg2`` → ``postgresql``);
    '' for a plain path (a one-letter scheme is a Windows drive)."""
    scheme = urlparse(uri).scheme.lower()
    return "" if len(scheme) <= 1 else scheme.split("+", 1)[0]


def _plugin_schemes() -> tuple[str, ...]:
    """Schemes of installed MLflow tracking-store plugins (their documented entry point group)."""
    return tuple(entry.name for entry in importlib.metadata.entry_points(group="mlflow.tracking_store"))


def check_tracking(kinds: list[str] | None, uri: str | None) -> None:
    """Refuse, before any work, trackers that cannot run: an unknown name, a missing package
    (naming the extra that installs it), a tracking URI MLflow would refuse or a log directory
    that is a file. Writes and imports nothing."""
    kinds = kinds or []
    for kind in kinds:
        check_choice("--track", kind, list(TRACKERS))
    if uri is not None:
        if not kinds:
            raise UserInputError("--track-uri: only with --track mlflow or --track tensorboard")
        if len(set(kinds)) > 1:
            raise UserInputError("--track-uri: names one tracker's store; give it with one --track only "
                                 "(point MLflow elsewhere with MLFLOW_TRACKING_URI)")
        if not uri.strip():
            raise UserInputError("--track-uri: must not be empty")
    for kind in dict.fromkeys(kinds):
        _require(kind, TRACKERS[kind][1])
        if kind == "tensorboard":
            if uri is not None and Path(uri).exists() and not Path(uri).is_dir():
                raise UserInputError(f"--track-uri: '{uri}' is a file; give a log directory for TensorBoard")
            continue
        given, option = _mlflow_uri_from(uri)
        scheme = "" if given is None else _scheme(given)
        if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            raise UserInputError(f"{option}: '{given}' is MLflow's legacy file store, which MLflow 3 refuses; "
                                 "give a directory (a local SQLite store is kept there), sqlite:///PATH/mlflow.db "
                                 "or a tracking server's http(s):// URL")
        if scheme not in ("", "file", *MLFLOW_SCHEMES, *_plugin_schemes()):
            raise UserInputError(f"{option}: '{given}' has scheme '{scheme}', which MLflow cannot open; allowed: "
                                 f"a directory, {', '.join(s + '://' for s in MLFLOW_SCHEMES)}")
        if given is not None and scheme == "" and Path(given).exists() and not Path(given).is_dir():
            raise UserInputError(f"{option}: '{given}' is a file; give a directory for a local MLflow store")
        if scheme in ("", *DATABASE_SCHEMES):
            _require(kind, SQL_MODULES)


def track_results(kind: str, results: str | Path, uri: str | None = None) -> str:
    """Send the results folder ``results`` (written by ``dpfl-audit run``) to tracker ``kind``
    (``mlflow`` or ``tensorboard``) at ``uri`` (default: a store inside the folder, see the module
    docstring); returns where it went. Bad input raises :class:`UserInputError`; a failure while
    sending raises :class:`TrackingError`."""
    from reports.results import load_results

    check_tracking([kind], uri)
    document, _, folder = load_results(results, "results")
    digest = file_sha256(folder / "results.json")
    send = _track_mlflow if kind == "mlflow" else _track_tensorboard
    with _failures_reported(kind, "the results", f"they are written in '{folder}'", "finished runs are not trained again"):
        if kind == "mlflow":
            import mlflow  # noqa: F401  (first: importing it sets its loggers' levels, which we then lower)
        with _chatter_hidden():
            return send(document, folder, uri, digest)


@contextmanager
def _failures_reported(kind: str, what: str, where: str, kept: str) -> Iterator[None]:
    """The tracker's own failures (an unreachable server, a locked database, a full disk) as one
    :class:`TrackingError` saying ``what`` could not be recorded, ``where`` the results are and what
    a rerun keeps (``kept``); bad input and an interrupt pass through as they are."""
    try:
        yield
    except (UserInputError, TrackingError, KeyboardInterrupt):
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise TrackingError(f"--track {kind}: could not record {what} ({type(exc).__name__}: {text}); {where}: "
                            f"rerun the same command to track them ({kept})") from exc


@contextmanager
def _chatter_hidden() -> Iterator[None]:
    """MLflow and Alembic log each database migration at INFO on the console, even under --quiet;
    their loggers go to WARNING while we send, and back to their own levels afterwards."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# --------------------------------------------------------------------------- what is tracked


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


# --------------------------------------------------------------------------- MLflow


def mlflow_store(folder: Path, uri: str | None) -> tuple[str, str | None]:
    """(tracking URI, artefact location of experiments created here; None: the store's default).

    A local store — the default ``OUT/mlruns``, a directory, or a ``sqlite:`` URI — keeps its
    artefacts in ``artifacts/`` beside the database, never in the current directory (MLflow's
    default for a SQLite store)."""
    given, _ = _mlflow_uri_from(uri)
    if given is None or _scheme(given) == "":
        directory = (Path(given).expanduser() if given is not None else folder / "mlruns").resolve()
        return f"sqlite:///{directory / 'mlflow.db'}", (directory / "artifacts").as_uri()
    database = sqlite_path(given)
    return given, None if database is None else (database.resolve().parent / "artifacts").as_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (relative to the current directory unless
    PATH starts with ``/``, as SQLAlchemy reads it); None for any other URI or an in-memory one."""
    if _scheme(uri) != "sqlite" or "///" not in uri:
        return None
    path = uri.split("///", 1)[1].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _mlflow_experiment(client: Any, name: str, dataset: str, artifact_location: str | None) -> str:
    """The id of the MLflow experiment ``name``, created (or restored from deletion) if need be."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return str(client.create_experiment(name, artifact_location=artifact_location,
                                            tags={"dpfl-audit.dataset": dataset}))
    if found.lifecycle_stage == "deleted":  # a deleted name cannot be reused: bring it back
        client.restore_experiment(found.experiment_id)
    return str(found.experiment_id)


def _mlflow_client(folder: Path, uri: str | None) -> tuple[Any, str, str | None]:
    from mlflow import MlflowClient

    tracking_uri, artifact_location = mlflow_store(folder, uri)
    database = sqlite_path(tracking_uri)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=tracking_uri), tracking_uri, artifact_location


def _log(client: Any, run_id: str, params: dict[str, str], tags: dict[str, str],
         metrics: list[Any] | None = None) -> None:
    """Params, tags and metrics in batches of the sizes MLflow accepts."""
    from mlflow.entities import Param, RunTag

    entries = [*(Param(k, v) for k, v in params.items()), *(RunTag(k, v[:_TAG_LENGTH]) for k, v in tags.items())]
    for chunk in _batches(entries, _BATCH_PARAMS_TAGS):
        client.log_batch(run_id, params=[e for e in chunk if isinstance(e, Param)],
                         tags=[e for e in chunk if isinstance(e, RunTag)])
    for chunk in _batches(metrics or [], _BATCH_METRICS):
        client.log_batch(run_id, metrics=chunk)


def _log_files(client: Any, run_id: str, folder: Path, names: tuple[str, ...]) -> None:
    """The files ``names`` of ``folder`` that exist, and its ``figures/``, as the run's artefacts."""
    for path in (folder / name for name in names):
        if path.is_file():
            client.log_artifact(run_id, str(path))
    if (folder / "figures").is_dir():
        client.log_artifacts(run_id, str(folder / "figures"), "figures")


def _configuration_run(client: Any, experiment_id: str, results: Results, experiment: Experiment, digest: str,
                       commit: str | None, *, parent: str | None = None, run_name: str | None = None,
                       extra_tags: dict[str, str] | None = None) -> tuple[str, int, int]:
    """One configuration's run (params, metrics with their intervals and per-round curves, tags),
    nested under ``parent`` if given and left open; returns its id and how many params and
    metrics it holds."""
    from mlflow.entities import Metric

    run_id = client.create_run(experiment_id, run_name=run_name or experiment.label,
                               tags=None if parent is None else {TAG_PARENT: parent}).info.run_id
    try:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in experiment_metrics(experiment).items()]
        metrics += [Metric(k, v, now, step) for step, k, v in round_scalars(experiment)]
        params = experiment_params(results, experiment)
        _log(client, run_id, params, {**experiment_tags(experiment, digest, commit), **(extra_tags or {})}, metrics)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id, len(params), len(metrics)


def _track_mlflow(results: Results, folder: Path, uri: str | None, digest: str) -> str:
    client, tracking_uri, artifact_location = _mlflow_client(folder, uri)
    experiment_id = _mlflow_experiment(client, results.audit.name, results.audit.dataset, artifact_location)
    tracked = {run.data.tags.get(TAG_EXPERIMENT) for run in client.search_runs(
        [experiment_id], filter_string=f"tags.`{TAG_DIGEST}` = '{digest}' and attributes.status = 'FINISHED'",
        max_results=50_000)}
    commit = git_commit()
    for experiment in results.experiments:
        if experiment.key in tracked:
            LOG.info("mlflow: %s is tracked already (same results.json)", experiment.label)
            continue
        run_id, params, metrics = _configuration_run(client, experiment_id, results, experiment, digest, commit)
        try:
            _log_files(client, run_id, folder, ARTIFACT_FILES)
        except BaseException:
            client.set_terminated(run_id, "FAILED")  # a rerun does not count it as tracked
            raise
        client.set_terminated(run_id, "FINISHED")
        LOG.info("mlflow: %s → run %s (%d params, %d metrics)", experiment.label, run_id, params, metrics)
    return tracking_uri


# --------------------------------------------------------------------------- MLflow: sweeps


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


# --------------------------------------------------------------------------- TensorBoard


def _track_tensorboard(results: Results, folder: Path, uri: str | None, digest: str) -> str:
    from torch.utils.tensorboard import SummaryWriter

    logdir = Path(uri).expanduser() if uri is not None else folder / "tensorboard"
    logdir.mkdir(parents=True, exist_ok=True)
    for experiment in results.experiments:
        final = inside(logdir, logdir / slug(experiment.key))
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=logdir))
        try:
            writer = SummaryWriter(log_dir=str(staging))
            steps = set()
            for step, key, value in round_scalars(experiment):
                writer.add_scalar(key, value, global_step=step)
                steps.add(step)
            writer.add_text("verdict", f"{experiment.soundness}: {experiment.soundness_text}", global_step=0)
            writer.close()
            if final.exists():  # replaced whole: the old folder goes aside first, then away
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=logdir))
                final.rename(old / final.name)
                staging.rename(final)
                shutil.rmtree(old)
            else:
                staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        LOG.info("tensorboard: %s → %s (%d rounds)", experiment.label, final, len(steps))
    return str(logdir)
