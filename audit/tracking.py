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
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from audit.core.errors import UserInputError, check_choice
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
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_./ -]")
#: MLflow's limits per log_batch call (mlflow.utils.validation)
_BATCH_PARAMS_TAGS, _BATCH_METRICS = 100, 1000
_PARAM_LENGTH, _TAG_LENGTH = 6000, 8000


class TrackingError(RuntimeError):
    """Sending finished results to a tracker failed (after they were written); one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def install_hint(kind: str) -> str:
    return f"pip install 'dpfl-audit[{TRACKERS[kind][0]}]'"


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
    digest = hashlib.sha256((folder / "results.json").read_bytes()).hexdigest()
    send = _track_mlflow if kind == "mlflow" else _track_tensorboard
    try:
        if kind == "mlflow":
            import mlflow  # noqa: F401  (first: importing it sets its loggers' levels, which we then lower)
        with _chatter_hidden():
            return send(document, folder, uri, digest)
    except (UserInputError, TrackingError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the tracker's own failure (an unreachable server, a locked database, a full disk)
        text = " ".join(str(exc).split())[:300]
        raise TrackingError(f"--track {kind}: could not record the results ({type(exc).__name__}: {text}); "
                            f"they are written in '{folder}': rerun the same command to track them "
                            "(finished runs are not trained again)") from exc


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


def experiment_metrics(experiment: Experiment) -> dict[str, float]:
    """Final figures of one configuration: utility, the claim's ε per observer it covers, and every
    metric of every attack (``<attack>/<metric>``); figures that are null are left out."""
    metrics: dict[str, float | None] = {
        "utility/test_accuracy": experiment.utility.test_accuracy.value,
        "utility/test_loss": experiment.utility.test_loss.value,
        "claim/epsilon": experiment.claim.epsilon if experiment.claim.is_private else None,
    }
    for entry in experiment.claim.adversaries:
        metrics[metric_key("claim", f"epsilon_{entry.adversary}")] = entry.epsilon if entry.covered else None
    for attack in experiment.attacks:
        for name, estimate in attack.metrics.items():
            metrics[metric_key(attack.attack, name)] = estimate.value
    return {key: number for key, value in metrics.items() if (number := _finite(value)) is not None}


def round_scalars(experiment: Experiment) -> Iterator[tuple[int, str, float]]:
    """(round, ``round/<metric>``, value) for each finite per-round figure results.json keeps."""
    for row in experiment.rounds:
        step = int(row["round"])  # type: ignore[arg-type]
        for name, value in row.items():
            number = _finite(value)
            if name != "round" and number is not None:
                yield step, metric_key("round", name), number


def experiment_tags(experiment: Experiment, digest: str) -> dict[str, str]:
    """The verdict (the experiment's, and each ε figure's), status, and the keys a rerun matches."""
    tags = {
        "verdict": experiment.soundness, "status": experiment.status, "label": experiment.label,
        "mlflow.note.content": f"{experiment.label}: {experiment.soundness}. {experiment.soundness_text}".strip(),
        TAG_EXPERIMENT: experiment.key, TAG_DIGEST: digest,
    }
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


def _track_mlflow(results: Results, folder: Path, uri: str | None, digest: str) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    tracking_uri, artifact_location = mlflow_store(folder, uri)
    database = sqlite_path(tracking_uri)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=tracking_uri)
    name = results.audit.name
    found = client.get_experiment_by_name(name)
    if found is None:
        experiment_id = client.create_experiment(name, artifact_location=artifact_location,
                                                 tags={"dpfl-audit.dataset": results.audit.dataset})
    else:
        experiment_id = found.experiment_id
        if found.lifecycle_stage == "deleted":  # a deleted name cannot be reused: bring it back
            client.restore_experiment(experiment_id)
    tracked = {run.data.tags.get(TAG_EXPERIMENT) for run in client.search_runs(
        [experiment_id], filter_string=f"tags.`{TAG_DIGEST}` = '{digest}' and attributes.status = 'FINISHED'",
        max_results=50_000)}
    artefacts = [folder / f for f in ARTIFACT_FILES if (folder / f).is_file()]
    figures = folder / "figures"
    for experiment in results.experiments:
        if experiment.key in tracked:
            LOG.info("mlflow: %s is tracked already (same results.json)", experiment.label)
            continue
        run_id = client.create_run(experiment_id, run_name=experiment.label).info.run_id
        try:
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, 0) for k, v in experiment_metrics(experiment).items()]
            metrics += [Metric(k, v, now, step) for step, k, v in round_scalars(experiment)]
            params = [Param(k, v) for k, v in experiment_params(results, experiment).items()]
            tags = [RunTag(k, v) for k, v in experiment_tags(experiment, digest).items()]
            for chunk in _batches([*params, *tags], _BATCH_PARAMS_TAGS):
                client.log_batch(run_id, params=[e for e in chunk if isinstance(e, Param)],
                                 tags=[e for e in chunk if isinstance(e, RunTag)])
            for chunk in _batches(metrics, _BATCH_METRICS):
                client.log_batch(run_id, metrics=chunk)
            for path in artefacts:
                client.log_artifact(run_id, str(path))
            if figures.is_dir():
                client.log_artifacts(run_id, str(figures), "figures")
        except BaseException:
            client.set_terminated(run_id, "FAILED")  # a rerun does not count it as tracked
            raise
        client.set_terminated(run_id, "FINISHED")
        LOG.info("mlflow: %s → run %s (%d params, %d metrics)", experiment.label, run_id, len(params), len(metrics))
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
