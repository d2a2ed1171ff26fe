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
* **MLflow, sweeps** (``dpfl-audit sweep --track mlflow``, :func:`audit.sweep_tracking.track_sweep`): one *parent run*
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

import importlib.metadata
import logging
import os
import shutil
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
from audit.tracked_values import (
    _TAG_LENGTH,
    TAG_DIGEST,
    TAG_EXPERIMENT,
    TAG_PARENT,
    experiment_metrics,
    experiment_params,
    experiment_tags,
    git_commit,
    round_scalars,
)

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
#: MLflow's limits per log_batch call (mlflow.utils.validation)
_BATCH_PARAMS_TAGS, _BATCH_METRICS = 100, 1000


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
