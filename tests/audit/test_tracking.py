"""Experiment tracking: `run --track mlflow|tensorboard` sends what results.json
holds to a real local MLflow store and real TensorBoard event files, read back here with MLflow's
client and TensorBoard's own reader; expectations come from results.json, not from the tracker code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from audit.cli import main
from tests.helpers import tiny_config

mlflow = pytest.importorskip("mlflow")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

ROUNDS = 2
NAME = "tiny tracked"


def _config(folder: Path) -> Path:
    config = folder / "tracked.yaml"
    config.write_text(tiny_config(
        name=NAME, training={"rounds": ROUNDS, "local_steps": 1, "batch_size": 10, "lr": 0.05},
        defenses=[{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}]))
    return config


@pytest.fixture(scope="module")
def audit_out(tmp_path_factory):
    """One tiny real audit (fedavg and DP-FedAvg at ε = 8, two rounds) tracked to both trackers'
    default stores inside its output folder; returns the folder and its results.json."""
    base = tmp_path_factory.mktemp("tracked")
    out = base / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert main(["run", str(_config(base)), "--out", str(out), "--quiet",
                     "--track", "mlflow", "--track", "tensorboard"]) == 0
    return out, json.loads((out / "results.json").read_text(encoding="utf-8"))


def _client(store: Path):
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")


def _runs(store: Path) -> dict[str, object]:
    """The audit's MLflow runs by the experiment key they are tagged with."""
    client = _client(store)
    experiment = client.get_experiment_by_name(NAME)
    assert experiment is not None, [e.name for e in client.search_experiments()]
    runs = client.search_runs([experiment.experiment_id])
    return {run.data.tags["dpfl-audit.experiment"]: run for run in runs}


def _key(*parts: str) -> str:
    return "/".join(part.replace("%", "pct") for part in parts)


def _attack_metrics(experiment: dict) -> dict[str, float]:
    """Every attack figure of a results.json experiment and the bounds of its 95 % interval, as
    tracked: ``<attack>/<metric>``, ``<attack>/<metric>_ci_low``, ``<attack>/<metric>_ci_high``."""
    return {_key(a["attack"], m + suffix): v[field] for a in experiment["attacks"] for m, v in a["metrics"].items()
            for suffix, field in (("", "value"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high")) if v[field] is not None}


def _head() -> str | None:
    """The commit of the repository the tests run in (None in a copy without git history)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def test_mlflow_holds_one_finished_run_per_experiment_with_the_results_values(audit_out):
    out, results = audit_out
    runs = _runs(out / "mlruns")
    assert sorted(runs) == sorted(e["key"] for e in results["experiments"])
    audit = results["audit"]
    private = 0
    for experiment in results["experiments"]:
        run = runs[experiment["key"]]
        params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
        claim = experiment["claim"]
        assert run.info.status == "FINISHED" and run.info.run_name == experiment["label"]
        assert params["defense"] == experiment["defense"]
        assert params["rounds"] == str(ROUNDS) == params["training/rounds"]
        for field in ("clients", "model", "dataset", "seed", "membership_runs"):
            assert params[field] == str(audit[field]), field
        for field in ("delta", "unit", "accountant", "relation"):
            assert params[field] == (claim[field] if isinstance(claim[field], str) else json.dumps(claim[field])), field
        for name, value in experiment["params"].items():
            assert params[f"defense/{name}"] == (value if isinstance(value, str) else json.dumps(value)), name
        assert metrics["utility/test_accuracy"] == experiment["utility"]["test_accuracy"]["value"]
        assert metrics["utility/test_loss"] == experiment["utility"]["test_loss"]["value"]
        if claim["epsilon"] is not None:  # DP-FedAvg's claim: the headline and each observer's ε
            private += 1
            assert json.loads(params["epsilon"]) == claim["epsilon"] == metrics["claim/epsilon"]
            for entry in claim["adversaries"]:
                assert metrics[f"claim/epsilon_{entry['adversary']}"] == entry["epsilon"]
        else:
            assert params["epsilon"] == "null" and "claim/epsilon" not in metrics
        tracked = {k for k in metrics if not k.startswith(("utility/", "claim/", "round/"))}
        assert {k: metrics[k] for k in tracked} == _attack_metrics(experiment)
        assert _key("loss-threshold", "auc") in tracked and _key("loss-threshold", "auc_ci_high") in tracked
        accuracy = experiment["utility"]["test_accuracy"]
        assert (metrics["utility/test_accuracy_ci_low"], metrics["utility/test_accuracy_ci_high"]) == (
            accuracy["ci_low"], accuracy["ci_high"])
        assert tags.get("mlflow.source.git.commit") == _head()  # the tests run inside the repository
        assert tags["verdict"] == experiment["soundness"] and tags["status"] == experiment["status"]
        for attack in experiment["attacks"]:
            for verdict in attack["verdicts"]:
                assert tags[_key("verdict", attack["attack"], verdict["metric"])] == verdict["status"]
        history = _client(out / "mlruns").get_metric_history(run.info.run_id, "round/test_accuracy")
        assert sorted((m.step, m.value) for m in history) == [(r["round"], r["test_accuracy"]) for r in experiment["rounds"]]
        assert len(history) == ROUNDS
    assert private == 1


def test_mlflow_runs_carry_the_results_report_and_figures_as_artefacts(audit_out, tmp_path):
    out, _ = audit_out
    client = _client(out / "mlruns")
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert figures
    for run in _runs(out / "mlruns").values():
        listed = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"results.json", "results.csv", "report.html", "config.yaml", "manifest.json", "figures"} <= listed
        assert sorted(Path(a.path).name for a in client.list_artifacts(run.info.run_id, "figures")) == figures
        copy = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="results.json",
                                                        dst_path=str(tmp_path / run.info.run_id),
                                                        tracking_uri=client.tracking_uri))
        assert copy.read_bytes() == (out / "results.json").read_bytes()
    # the local store keeps its artefacts beside its database, inside the output folder
    assert (out / "mlruns" / "artifacts").is_dir()


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    reader = event_accumulator.EventAccumulator(str(folder))
    reader.Reload()
    return {tag: [(event.step, event.value) for event in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def _expected_rounds(experiment: dict) -> dict[str, list[tuple[int, float]]]:
    names = {name for row in experiment["rounds"] for name in row if name != "round"}
    return {f"round/{name}": [(row["round"], row[name]) for row in experiment["rounds"] if row.get(name) is not None]
            for name in names}


def _assert_per_round_scalars(logdir: Path, results: dict) -> None:
    assert sorted(p.name for p in logdir.iterdir()) == sorted(e["key"] for e in results["experiments"])
    for experiment in results["experiments"]:
        folder = logdir / experiment["key"]
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        scalars, expected = _scalars(folder), _expected_rounds(experiment)
        assert sorted(scalars) == sorted(expected) and "round/test_accuracy" in scalars
        for tag, points in expected.items():
            assert [step for step, _ in scalars[tag]] == [step for step, _ in points] == list(range(1, ROUNDS + 1))
            # event files hold float32
            assert [value for _, value in scalars[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-6)
    dp = next(e for e in results["experiments"] if e["claim"]["epsilon"] is not None)
    assert "round/epsilon" in _scalars(logdir / dp["key"])  # ε spent so far, per round


def test_tensorboard_gets_the_per_round_scalars_of_each_experiment(audit_out):
    out, results = audit_out
    _assert_per_round_scalars(out / "tensorboard", results)


def test_tracking_the_same_results_again_adds_nothing(audit_out):
    from audit.tracking import track_results

    out, results = audit_out
    before = {key: run.info.run_id for key, run in _runs(out / "mlruns").items()}
    track_results("mlflow", out)
    track_results("tensorboard", out)  # each experiment's folder replaced whole: curves are not doubled
    assert {key: run.info.run_id for key, run in _runs(out / "mlruns").items()} == before
    _assert_per_round_scalars(out / "tensorboard", results)
    assert not [p for p in (out / "tensorboard").iterdir() if p.name.startswith(".")]  # no staging left


def test_track_uri_names_the_store(audit_out, tmp_path, monkeypatch):
    """A directory becomes a local MLflow store (database and artefacts), a log directory
    TensorBoard's folder; the output folder's own stores are not touched."""
    from audit.tracking import track_results

    out, results = audit_out
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store, logdir = tmp_path / "shared-store", tmp_path / "tb"
    assert track_results("mlflow", out, str(store)) == f"sqlite:///{store / 'mlflow.db'}"
    runs = _runs(store)
    assert sorted(runs) == sorted(e["key"] for e in results["experiments"])
    assert all(Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(store / "artifacts")
               for run in runs.values())
    assert track_results("tensorboard", out, str(logdir)) == str(logdir)
    _assert_per_round_scalars(logdir, results)
    assert len(_runs(out / "mlruns")) == len(results["experiments"])


def test_a_tracker_that_fails_after_the_audit_is_one_line_and_exit_1(audit_out, capsys, monkeypatch):
    """A tracking server that does not answer (a closed local port): the results stay written,
    the command says so in one line and exits 1."""
    from audit.commands.run import track

    out, _ = audit_out
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    assert track(["mlflow"], str(out), "http://127.0.0.1:9") == 1
    err = capsys.readouterr().err
    assert err.startswith("dpfl-audit: error: --track mlflow: could not record the results (")
    assert f"they are written in '{out}'" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- bad input: exit 2, one line, nothing written


@pytest.mark.parametrize(("blocked", "arguments", "message"), [
    ("mlflow", ["--track", "mlflow"],
     "--track mlflow: needs mlflow, which is not installed; install it with: "
     "pip install 'mlflow-skinny>=3.0' 'sqlalchemy>=2.0' 'alembic>=1.13'"),
    ("sqlalchemy", ["--track", "mlflow"],
     "--track mlflow: needs sqlalchemy, which is not installed; install it with: "
     "pip install 'mlflow-skinny>=3.0' 'sqlalchemy>=2.0' 'alembic>=1.13'"),
    ("tensorboard", ["--track", "tensorboard"],
     "--track tensorboard: needs tensorboard, which is not installed; install it with: "
     "pip install 'tensorboard>=2.14'"),
])
def test_a_missing_tracker_package_is_bad_input_before_training(blocked, arguments, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, blocked, None)  # `import` raises ImportError, find_spec ValueError
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    assert main(["run", str(_config(tmp_path)), "--out", str(out), *arguments]) == 2
    assert capsys.readouterr().err == f"dpfl-audit: error: {message}\n"
    assert not out.exists()


def test_a_tracking_server_needs_no_database_packages(monkeypatch):
    from audit.tracking import check_tracking

    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    check_tracking(["mlflow"], "http://127.0.0.1:5000")  # no error: the server keeps the store


@pytest.mark.parametrize(("arguments", "environment", "message"), [
    (["--track", "wandb"], None, "--track: 'wandb' is not allowed; allowed: mlflow, tensorboard"),
    (["--track-uri", "sqlite:///x.db"], None, "--track-uri: only with --track mlflow or --track tensorboard"),
    (["--track", "mlflow", "--track", "tensorboard", "--track-uri", "x"], None,
     "--track-uri: names one tracker's store; give it with one --track only "
     "(point MLflow elsewhere with MLFLOW_TRACKING_URI)"),
    (["--track", "mlflow", "--track-uri", "s3://bucket/mlruns"], None,
     "--track-uri: 's3://bucket/mlruns' has scheme 's3', which MLflow cannot open; allowed: a directory, sqlite://, "
     "postgresql://, mysql://, mssql://, http://, https://, databricks://, databricks-uc://, uc://"),
    (["--track", "mlflow"], "ftp://host/store",
     "MLFLOW_TRACKING_URI: 'ftp://host/store' has scheme 'ftp', which MLflow cannot open; allowed: a directory, "
     "sqlite://, postgresql://, mysql://, mssql://, http://, https://, databricks://, databricks-uc://, uc://"),
    (["--track", "mlflow", "--track-uri", "file:///tmp/mlruns"], None,
     "--track-uri: 'file:///tmp/mlruns' is MLflow's legacy file store, which MLflow 3 refuses; give a directory "
     "(a local SQLite store is kept there), sqlite:///PATH/mlflow.db or a tracking server's http(s):// URL"),
    (["--track", "mlflow", "--track-uri", "{config}"], None,
     "--track-uri: '{config}' is a file; give a directory for a local MLflow store"),
    (["--track", "tensorboard", "--track-uri", "{config}"], None,
     "--track-uri: '{config}' is a file; give a log directory for TensorBoard"),
])
def test_bad_tracking_options_are_one_line_before_training(arguments, environment, message, tmp_path, capsys,
                                                          monkeypatch):
    config = _config(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    if environment is not None:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", environment)
    out = tmp_path / "out"
    arguments = [a.replace("{config}", str(config)) for a in arguments]
    assert main(["run", str(config), "--out", str(out), *arguments]) == 2
    assert capsys.readouterr().err == f"dpfl-audit: error: {message.replace('{config}', str(config))}\n"
    assert not out.exists()


# --------------------------------------------------------------------------- MLflow: a sweep

SWEEP_NAME = "tiny tracked sweep"


@pytest.fixture(scope="module")
def tracked_sweep(tmp_path_factory):
    """A real tiny sweep (fedavg beside dp-fedavg at ε = 1 and ε = 16: two points sharing the fedavg
    runs) tracked to MLflow's default store in its output folder; its runs read back by kind."""
    base = tmp_path_factory.mktemp("tracked-sweep")
    config = base / "sweep.yaml"
    config.write_text(tiny_config(name=SWEEP_NAME, training={"rounds": ROUNDS, "local_steps": 1, "batch_size": 10,
                                                             "lr": 0.05},
                                  defenses=[{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}]))
    out = base / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert main(["sweep", str(config), "--over", "defenses.1.epsilons=1,16", "--out", str(out), "--quiet",
                     "--track", "mlflow"]) == 0
    return out


def _sweep_runs(out: Path) -> dict[str, list]:
    client = _client(out / "mlruns")
    experiment = client.get_experiment_by_name(SWEEP_NAME)
    runs: dict[str, list] = {}
    for run in client.search_runs([experiment.experiment_id]):
        runs.setdefault(run.data.tags["dpfl-audit.run"], []).append(run)
    return runs


def test_an_mlflow_sweep_is_one_parent_with_a_child_per_point(tracked_sweep):
    out = tracked_sweep
    runs = _sweep_runs(out)
    assert sorted(runs) == ["configuration", "point", "sweep"]
    (sweep,) = runs["sweep"]
    assert "mlflow.parentRunId" not in sweep.data.tags and sweep.info.run_name == "out"
    assert sweep.data.params["axis/defenses.1.epsilons"] == "[1, 16]" and sweep.data.tags["dpfl-audit.axes"] == (
        "defenses.1.epsilons")
    assert sweep.data.tags.get("mlflow.source.git.commit") == _head()
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    points = sorted(runs["point"], key=lambda run: run.data.tags["dpfl-audit.point"])
    assert [p.data.tags["dpfl-audit.point"] for p in points] == sorted(manifest["points"]) == ["p01", "p02"]
    for run, value in zip(points, ("1", "16")):
        assert run.data.tags["mlflow.parentRunId"] == sweep.info.run_id and run.info.status == "FINISHED"
        assert run.data.tags["axis/defenses.1.epsilons"] == value == run.data.params["axis/defenses.1.epsilons"]
        assert run.data.tags.get("mlflow.source.git.commit") == _head()
    client = _client(out / "mlruns")
    assert {"sweep.html", "sweep.csv", "sweep.json", "figures"} <= {a.path for a in client.list_artifacts(sweep.info.run_id)}
    for run in points:
        assert {"results.json", "report.html", "figures"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


def test_an_mlflow_sweep_tracks_each_configuration_once_with_its_intervals(tracked_sweep):
    """fedavg is the same configuration at both points (its runs are shared): one run, a child of
    the sweep, tagged with both points; each dp-fedavg is a child of its point's run."""
    out = tracked_sweep
    runs = _sweep_runs(out)
    (sweep,) = runs["sweep"]
    point_ids = {run.data.tags["dpfl-audit.point"]: run.info.run_id for run in runs["point"]}
    configurations = runs["configuration"]
    keys = sorted(run.data.tags["dpfl-audit.experiment"] for run in configurations)
    assert keys == ["dp-fedavg-eps1", "dp-fedavg-eps16", "fedavg"]  # fedavg once
    for run in configurations:
        tags, metrics = run.data.tags, run.data.metrics
        key = tags["dpfl-audit.experiment"]
        if key == "fedavg":
            assert tags["dpfl-audit.points"] == "p01, p02" and tags["mlflow.parentRunId"] == sweep.info.run_id
            assert "axis/defenses.1.epsilons" not in tags  # the points differ there
        else:
            point = "p01" if key == "dp-fedavg-eps1" else "p02"
            assert tags["dpfl-audit.points"] == point and tags["mlflow.parentRunId"] == point_ids[point]
            assert tags["axis/defenses.1.epsilons"] == ("1" if point == "p01" else "16")
        point = "p01" if key != "dp-fedavg-eps16" else "p02"
        results = json.loads((out / "points" / point / "results.json").read_text(encoding="utf-8"))
        experiment = next(e for e in results["experiments"] if e["key"] == key)
        tracked = {k: v for k, v in metrics.items() if not k.startswith(("utility/", "claim/", "round/"))}
        assert tracked == _attack_metrics(experiment) and _key("loss-threshold", "auc_ci_low") in tracked
        assert tags["verdict"] == experiment["soundness"] and run.info.status == "FINISHED"


def test_tracking_the_same_sweep_again_adds_nothing(tracked_sweep):
    from audit.sweep_tracking import track_sweep

    before = sorted(run.info.run_id for kind in _sweep_runs(tracked_sweep).values() for run in kind)
    track_sweep(tracked_sweep)
    assert sorted(run.info.run_id for kind in _sweep_runs(tracked_sweep).values() for run in kind) == before


def test_no_git_commit_outside_a_repository(tmp_path):
    from audit.tracked_values import git_commit

    assert git_commit(tmp_path) is None
    assert git_commit() == _head()
