"""`dpfl-audit scores FILE`: score files that another tool wrote, judged by our
statistics through the command line. The files are generated here from laws whose AUC and ε are
known in closed form, so every check compares with a value derived independently of the code."""

from __future__ import annotations

import importlib.util
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from audit.cli import main
from reports.results import load_results

RUNS, UNITS = 16, 200


def _membership_frame(seed: int, mu: float, tau: float, runs: int = RUNS, units: int = UNITS,
                      leaky_runs: slice | None = None) -> pd.DataFrame:
    """Membership by fair coins; score = μ·member + a_unit + e, a_unit ~ N(0, τ²) shared by one
    unit's scores in every run (its own "vulnerability"), e ~ N(0, 1). ``leaky_runs``: only those
    runs get the shift μ."""
    rng = np.random.default_rng(seed)
    member = rng.random((runs, units)) < 0.5
    shift = np.zeros((runs, 1))
    shift[leaky_runs if leaky_runs is not None else slice(None)] = mu
    scores = shift * member + tau * rng.normal(size=units) + rng.normal(size=(runs, units))
    run, unit = np.meshgrid(np.arange(runs), np.arange(units), indexing="ij")
    return pd.DataFrame({"run": [f"model-{r}" for r in run.ravel()], "unit": [f"rec{u}" for u in unit.ravel()],
                         "score": scores.ravel(), "member": member.ravel().astype(int)})


def _canary_frame(seed: int, mu: float, count: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    inserted = rng.random(count) < 0.5
    return pd.DataFrame({"canary": np.arange(count), "score": mu * inserted + rng.normal(size=count),
                         "inserted": inserted.astype(int)})


def _run_json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["scores", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _attack(document: dict) -> dict:
    (experiment,) = document["experiments"]
    (attack,) = experiment["attacks"]
    return attack


def test_null_membership_scores_with_a_unit_effect(tmp_path, capsys):
    """Null: membership does not move the score, but each unit carries an effect (τ = 1) shared by
    its 16 scores — correlated pairs that an interval over independent pairs would undercount.
    The AUC interval must cover ½ and both one-run ε lower bounds must be 0."""
    file = tmp_path / "null.csv"
    _membership_frame(seed=11, mu=0.0, tau=1.0).to_csv(file, index=False)
    attack = _attack(_run_json(capsys, file, "--claim-epsilon", "1"))
    auc = attack["metrics"]["auc"]
    assert auc["ci_low"] <= 0.5 <= auc["ci_high"], auc
    assert attack["metrics"]["epsilon_one_run"]["value"] == 0.0
    assert attack["metrics"]["epsilon_one_run_fdp"]["value"] == 0.0
    assert {v["status"] for v in attack["verdicts"]} <= {"consistent", "inconclusive"}
    assert "coins of run 'model-0'" in attack["notes"]


@pytest.mark.parametrize(("mu", "tau"), [(1.0, 0.0), (1.0, 1.5)])
def test_leaky_membership_scores_auc_interval_covers_the_theory(tmp_path, capsys, mu, tau):
    """Members N(μ + a, 1), non-members N(a, 1), a ~ N(0, τ²) per unit. The AUC compares members
    and non-members of *different* units: P(μ + a_u + e > a_v + e') = Φ(μ / √(2(1 + τ²))) — Φ(μ/√2)
    without a unit effect. Read as NPZ (string ids, allow_pickle=False)."""
    frame = _membership_frame(seed=0, mu=mu, tau=tau)
    file = tmp_path / "leaky.npz"
    np.savez(file, run=frame["run"].to_numpy(dtype=str), unit=frame["unit"].to_numpy(dtype=str),
             score=frame["score"].to_numpy(), member=frame["member"].to_numpy().astype(bool))
    attack = _attack(_run_json(capsys, file))
    expected = stats.norm.cdf(mu / math.sqrt(2.0 * (1.0 + tau ** 2)))
    auc = attack["metrics"]["auc"]
    assert auc["ci_low"] <= expected <= auc["ci_high"], (auc, expected)
    assert auc["ci_low"] > 0.5


def test_the_bound_uses_the_run_with_the_smallest_id_whatever_the_row_order(tmp_path, capsys):
    """Only one run's coins feed the one-run ε, the run with the smallest id. Run 'model-0' leaks
    strongly (μ = 4), the others not at all: its rows first or last in the file → the same ε_LB > 1;
    the leaky run renamed 'model-9' (now the largest id) → ε_LB = 0 from the null run 'model-1'."""
    frame = _membership_frame(seed=5, mu=4.0, tau=0.0, runs=4, units=400, leaky_runs=slice(0, 1))
    first = tmp_path / "leaky-first.csv"
    frame.to_csv(first, index=False)
    later = tmp_path / "leaky-later.csv"
    frame.sort_values("run", key=lambda run: run == "model-0", kind="stable").to_csv(later, index=False)
    leaky_first, leaky_later = _attack(_run_json(capsys, first)), _attack(_run_json(capsys, later))
    assert leaky_first["metrics"]["epsilon_one_run"]["value"] > 1.0
    assert leaky_later["metrics"] == leaky_first["metrics"]
    renamed = tmp_path / "leaky-renamed.csv"
    frame.assign(run=frame["run"].replace("model-0", "model-9")).to_csv(renamed, index=False)
    moved = _attack(_run_json(capsys, renamed))
    assert moved["metrics"]["epsilon_one_run"]["value"] == 0.0 and "run 'model-1'" in moved["notes"]


def test_unfair_coins_give_no_epsilon(tmp_path, capsys):
    """170 of 200 members in the first run: Binomial(200, ½) gives that with p ≈ 1e-25 ≪ 0.001,
    so Steinke et al.'s premise fails — no ε figure, the notes say why, no verdict to make."""
    frame = _membership_frame(seed=7, mu=1.0, tau=0.0, runs=2)
    first = frame["run"] == "model-0"
    frame.loc[first, "member"] = (np.arange(UNITS) < 170).astype(int)
    file = tmp_path / "unfair.csv"
    frame.to_csv(file, index=False)
    assert stats.binomtest(170, 200, 0.5).pvalue < 1e-20
    document = _run_json(capsys, file, "--claim-epsilon", "1")
    attack = _attack(document)
    assert not {"epsilon_one_run", "epsilon_one_run_fdp"} & set(attack["metrics"])
    assert "no one-run ε" in attack["notes"] and "170 of 200" in attack["notes"]
    assert attack["verdicts"] == [] and document["experiments"][0]["soundness"] == "no measurement"


def test_canary_scores_null_violation_and_consistent(tmp_path, capsys):
    """Canaries (Steinke et al. 2023). Null (N(0,1) either way): ε_LB = 0. Leaky (inserted N(4,1)):
    the optimal test separates the two with ε far above 0.5 — with 1000 canaries the bound is
    well above it, so a claim of 0.5 is a VIOLATION in results.json (written by --out and read back
    by load_results). A null with 40 000 canaries against ε = 2: the f-DP figure has ≥ 80 % power
    to detect ε = 4, hence "consistent"."""
    null = tmp_path / "null-canaries.csv"
    _canary_frame(seed=1, mu=0.0, count=1000).to_csv(null, index=False)
    metrics = _attack(_run_json(capsys, null))["metrics"]
    assert metrics["epsilon_one_run"]["value"] == 0.0 and metrics["epsilon_one_run_fdp"]["value"] == 0.0

    leaky = tmp_path / "leaky-canaries.csv"
    _canary_frame(seed=2, mu=4.0, count=1000).to_csv(leaky, index=False)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["scores", str(leaky), "--claim-epsilon", "0.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "VIOLATION" in printed and "AUC" in printed
    results, manifest, folder = load_results(out)
    assert folder == out and manifest["audited"]
    (experiment,) = results.experiments
    assert experiment.soundness == "violation"
    statuses = {v.metric: v.status for v in experiment.attacks[0].verdicts}
    assert statuses["epsilon_one_run"] == statuses["epsilon_one_run_fdp"] == "violation"
    assert {p.name for p in out.iterdir()} == {"results.json", "results.csv", "report.html", "manifest.json",
                                               "run.log", "figures",
                                               ".dpfl-audit.lock"}  # the folder's lock (audit.core.output_folder)

    many = tmp_path / "many.csv"
    _canary_frame(seed=4, mu=0.0, count=40_000).to_csv(many, index=False)
    document = _run_json(capsys, many, "--claim-epsilon", "2")
    verdicts = {v["metric"]: v for v in _attack(document)["verdicts"]}
    assert verdicts["epsilon_one_run_fdp"]["status"] == "consistent"
    assert verdicts["epsilon_one_run_fdp"]["power"]["detection"] >= 0.8
    assert document["experiments"][0]["soundness"] == "consistent"


def test_unfair_canaries_keep_only_the_gaussian_fit(tmp_path, capsys):
    """400 of 500 canaries inserted (p ≈ 1e-42 under fair coins): no one-run bound, but the
    Gaussian-fit estimate, which assumes no law of the coins, is still reported."""
    frame = _canary_frame(seed=6, mu=2.0, count=500)
    frame["inserted"] = (np.arange(500) < 400).astype(int)
    file = tmp_path / "unfair-canaries.csv"
    frame.to_csv(file, index=False)
    attack = _attack(_run_json(capsys, file))
    assert not {"epsilon_one_run", "epsilon_one_run_fdp"} & set(attack["metrics"])
    assert set(attack["epsilon_kind"]) == {"epsilon_gaussian_fit"} and "400 of 500" in attack["notes"]


def test_pooled_canaries_of_several_runs(tmp_path, capsys):
    """With a ``run`` column, the canaries of all runs are the coins: 4 runs × 250 canaries are
    1000 coins, as many as one run of 1000."""
    rng = np.random.default_rng(8)
    inserted = rng.random((4, 250)) < 0.5
    frame = pd.DataFrame({"run": np.repeat(np.arange(4), 250), "canary": np.tile(np.arange(250), 4),
                          "score": (3.0 * inserted + rng.normal(size=(4, 250))).ravel(),
                          "inserted": inserted.ravel()})
    file = tmp_path / "pooled.csv"
    frame.to_csv(file, index=False)
    document = _run_json(capsys, file)
    assert document["audit"]["membership_runs"] == 4
    assert "1000 canaries over 4 run(s)" in _attack(document)["notes"]
    assert _attack(document)["metrics"]["epsilon_one_run"]["value"] > 0.5


def test_parquet(tmp_path, capsys):
    """Parquet through pandas/pyarrow; without pyarrow, one line that says how to get it."""
    frame = _membership_frame(seed=9, mu=1.0, tau=0.0, runs=4, units=100)
    file = tmp_path / "scores.parquet"
    if importlib.util.find_spec("pyarrow") is None:
        file.write_bytes(b"PAR1")
        out = tmp_path / "out"
        assert main(["scores", str(file), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install pyarrow" in err and not out.exists()
        return
    frame.to_parquet(file)
    csv = tmp_path / "scores.csv"
    frame.to_csv(csv, index=False)
    from_parquet, from_csv = _attack(_run_json(capsys, file)), _attack(_run_json(capsys, csv))
    assert from_parquet["metrics"] == from_csv["metrics"]


@pytest.fixture
def good(tmp_path) -> pd.DataFrame:
    return _membership_frame(seed=0, mu=0.5, tau=0.0, runs=3, units=20)


def _write(tmp_path: Path, frame: pd.DataFrame | None, name: str = "bad.csv", text: str | None = None) -> Path:
    file = tmp_path / name
    if text is not None:
        file.write_text(text, encoding="utf-8")
    else:
        frame.to_csv(file, index=False)
    return file


def _malformed(tmp_path, good) -> dict[str, tuple[Path, list[str]]]:
    """name → (file, words its error line must contain)."""
    cases: dict[str, tuple[Path, list[str]]] = {}
    cases["missing column"] = (_write(tmp_path, good.drop(columns="member"), "no-member.csv"), ["'member'", "missing column"])
    text = good.astype({"score": object})
    text.loc[4, "score"] = "high"
    cases["non-numeric score"] = (_write(tmp_path, text, "text-score.csv"), ["'score'", "row 5", "'high'", "not a number"])
    infinite = good.copy()
    infinite.loc[2, "score"] = np.inf
    cases["non-finite score"] = (_write(tmp_path, infinite, "inf.csv"), ["'score'", "row 3", "finite"])
    cases["empty file"] = (_write(tmp_path, None, "empty.csv", text=""), ["empty file"])
    cases["header only"] = (_write(tmp_path, None, "header.csv", text="run,unit,score,member\n"), ["no rows"])
    mixed = good.assign(unit_kind="record")
    mixed.loc[7, "unit_kind"] = "client"
    cases["mixed units"] = (_write(tmp_path, mixed, "mixed.csv"), ["'unit_kind'", "row 8", "mixed units", "'record'"])
    duplicate = pd.concat([good, good.iloc[[5]]], ignore_index=True)
    cases["duplicate pair"] = (_write(tmp_path, duplicate, "dup.csv"),
                               ["duplicate", "'model-0'", "'rec5'", f"row {len(good) + 1}", "row 6"])
    cases["missing pair"] = (_write(tmp_path, good.drop(index=23), "hole.csv"), ["run 'model-1'", "unit 'rec3'", "grid"])
    two = good.copy()
    two.loc[9, "member"] = 2
    cases["member not 0/1"] = (_write(tmp_path, two, "two.csv"), ["'member'", "row 10", "allowed: 0, 1, true, false"])
    cases["wrong extension"] = (_write(tmp_path, good, "scores.txt"), ["'.txt'", "allowed: .csv, .parquet, .npz"])
    cases["no such file"] = (tmp_path / "absent.csv", ["no such file"])
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, run=good["run"].to_numpy(dtype=object), unit=good["unit"].to_numpy(dtype=str),
             score=good["score"].to_numpy(), member=good["member"].to_numpy())
    cases["object array (pickle)"] = (pickled, ["array 'run'", "unpickled"])
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip archive")
    cases["unreadable npz"] = (broken, ["not an NPZ archive", "not a zip file"])
    return cases


def test_malformed_files_are_one_line_errors_and_write_nothing(tmp_path, capsys, good):
    """Every malformed file: exit 2, exactly one line on stderr naming the file and what is wrong
    (column, row, allowed values), nothing on stdout, and the --out directory never created."""
    for name, (file, words) in _malformed(tmp_path, good).items():
        out = tmp_path / f"out-{file.stem}"
        capsys.readouterr()
        code = main(["scores", str(file), "--claim-epsilon", "1", "--out", str(out)])
        captured = capsys.readouterr()
        assert code == 2, name
        assert captured.err.count("\n") == 1 and captured.out == "", (name, captured)
        assert captured.err.startswith(f"dpfl-audit: error: {file}: "), (name, captured.err)
        assert all(word in captured.err for word in words), (name, captured.err)
        assert not out.exists(), name


def test_unit_kind_must_agree_with_the_unit_option(tmp_path, capsys, good):
    """A file whose unit_kind says client is read per client by default, and refused with --unit record."""
    file = _write(tmp_path, good.assign(unit_kind="client"), "clients.csv")
    assert _attack(_run_json(capsys, file))["unit"] == "client"
    capsys.readouterr()
    assert main(["scores", str(file), "--unit", "record"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'unit_kind'" in err and "--unit client" in err


def test_the_schema_describes_what_the_reader_accepts(tmp_path, good):
    """reports/schema/scores.schema.json: every row of the files the tests generate is valid, and
    the values the reader refuses (member 2, a textual score, a row of both kinds) are not."""
    import jsonschema

    schema = json.loads(resources.files("reports").joinpath("schema/scores.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    from audit.score_files import CANARY_COLUMNS, MEMBERSHIP_COLUMNS

    assert tuple(schema["$defs"]["MembershipRow"]["required"]) == MEMBERSHIP_COLUMNS
    assert tuple(schema["$defs"]["CanaryRow"]["required"]) == CANARY_COLUMNS
    as_text = pd.read_csv(_write(tmp_path, good, "rows.csv"), dtype=str, keep_default_na=False)
    for row in [*good.to_dict("records"), *as_text.to_dict("records"), *_canary_frame(0, 1.0, 5).to_dict("records")]:
        validator.validate(row)
    row = good.iloc[0].to_dict()
    for bad in ({**row, "member": 2}, {**row, "member": "yes"}, {**row, "score": "high"}, {**row, "score": "1_0"},
                {**row, "unit": " "}, {**row, "unit_kind": "weight"}, {**row, "canary": 1, "inserted": 0}):
        assert not validator.is_valid(bad), bad


def test_the_readme_command_reproduces_the_pipelines_figures_for_its_exported_canaries(tmp_path, capsys):
    """docs/how-to/score-files.md, "Try it": the client canaries of DP-FedAvg at ε = 8, exported from
    the default audit's attacks/dp-fedavg-eps8/client-canaries.npz, give through `scores` the
    figures that audit reported for them (results.json at d188bdf: AUC 0.879 [0.811, 0.947],
    ε_LB 1.438 (Steinke) and 1.435 (f-DP), Gaussian fit 8.47) — the same scores, the same
    statistics. The fit's interval is the exact noncentral-t one, [5.85, 11.29] (the audit then
    reported a percentile bootstrap's [6.33, 11.34], which under-covers at a hundred canaries);
    scipy's own noncentral t, inverted here, gives the same ends."""
    from tests.helpers import DOCS, readme_commands, with_out

    (arguments,) = [a for a in readme_commands("dpfl-audit scores", DOCS / "how-to" / "score-files.md") if "--claim-epsilon" in a]
    out = tmp_path / "scores-out"
    assert main(["scores", *with_out(arguments, out)]) == 0
    capsys.readouterr()
    results, _, _ = load_results(out)
    (attack,) = results.experiments[0].attacks
    expected = {"auc": (0.879, 0.811, 0.947), "epsilon_one_run": (1.438,), "epsilon_one_run_fdp": (1.435,),
                "epsilon_gaussian_fit": (8.47, 5.85, 11.29)}
    for metric, figures in expected.items():
        estimate = attack.metrics[metric]
        measured = (estimate.value, estimate.ci_low, estimate.ci_high)[:len(figures)]
        assert measured == pytest.approx(figures, abs=0.006), metric
    assert results.experiments[0].claim.epsilon == 8.0 and results.experiments[0].claim.unit == "client"


def _rr_canary_frame(seed: int, epsilon: float, count: int) -> pd.DataFrame:
    """ε-randomised response on each canary's coin: ±1 scores, two tied blocks."""
    rng = np.random.default_rng(seed)
    inserted = rng.random(count) < 0.5
    truthful = rng.random(count) < math.exp(epsilon) / (1 + math.exp(epsilon))
    return pd.DataFrame({"canary": np.arange(count), "score": np.where(truthful == inserted, 1.0, -1.0),
                         "inserted": inserted.astype(int)})


@pytest.mark.parametrize("kind", ["canary", "membership"])
def test_row_order_changes_no_figure_and_no_verdict(tmp_path, capsys, kind):
    """The same rows shuffled, and sorted by truth (members/inserted first): every figure, interval,
    verdict and power is the same. The tied scores — two values for the canaries, scores rounded
    to one decimal for membership — are where the order of rows used to decide the bound (a file
    sorted by truth turned an ε = 1 randomised response into ε_LB ≈ 4.6, a VIOLATION)."""
    if kind == "canary":
        frame, truth, claim = _rr_canary_frame(seed=3, epsilon=1.0, count=1000), "inserted", "1"
    else:
        frame, truth, claim = _membership_frame(seed=4, mu=0.5, tau=0.5), "member", "0.5"
        frame["score"] = frame["score"].round(1)
    documents = []
    for name, ordered in (("shuffled", frame.sample(frac=1.0, random_state=1)),
                          ("sorted", frame.sort_values(truth, ascending=False, kind="stable"))):
        file = tmp_path / f"{name}.csv"
        ordered.to_csv(file, index=False)
        documents.append(_run_json(capsys, file, "--claim-epsilon", claim, "--delta", "0"))
    (shuffled, by_truth) = [_attack(d) for d in documents]
    assert shuffled["metrics"] == by_truth["metrics"] and shuffled["verdicts"] == by_truth["verdicts"]
    assert documents[0]["experiments"][0]["soundness"] == documents[1]["experiments"][0]["soundness"]
    if kind == "canary":  # the claim holds exactly: no violation either way
        assert documents[1]["experiments"][0]["soundness"] != "violation"


# --------------------------------------------------------------------------- bounded and exact reading
# sizes checked before anything is loaded, values that
# a lenient parser would take silently, and scores at the ends of the float range


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    """A .npy header alone: it claims ``shape`` whatever follows (here, nothing)."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    import warnings
    import zipfile

    with warnings.catch_warnings():  # a repeated member name is one of the cases
        warnings.simplefilter("ignore", UserWarning)
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members:
                archive.writestr(name, data)
    return path


def _canary_members(count: int = 20, **replaced: bytes) -> list[tuple[str, bytes]]:
    frame = _canary_frame(0, 1.0, count)
    members = {f"{name}.npy": _npy(frame[name].to_numpy()) for name in frame.columns}
    members.update(replaced)
    return list(members.items())


def _dictionary_bomb(path: Path, rows: int = 1_100_000) -> Path:
    """A Parquet file of a few hundred kB whose dictionary-encoded id column (one entry of 1,000
    characters) expands to 1.1 GB: its footer's sizes are small, its decoded text is not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    canary = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), pa.array(["c" * 1000]))
    pq.write_table(pa.table({"canary": canary, "score": pa.array(np.zeros(rows)),
                             "inserted": pa.array(np.zeros(rows, dtype=np.int64))}), path)
    return path


def _bounded_cases(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    """name → (file, words its one error line must contain); the cases named in :data:`SMALL_LIMITS`
    are read with those limits."""
    import audit.score_tables as score_tables

    frame = _canary_frame(0, 1.0, 20)
    csv_text = frame.to_csv(index=False)
    cases: dict[str, tuple[Path, list[str]]] = {}
    # a header claiming 10¹¹ float64 entries (745 GiB): refused from the header's few bytes
    cases["npz header of 1e11 entries"] = (
        _npz(tmp_path / "claims.npz", _canary_members(**{"score.npy": _npy_header((10**11,))})),
        ["array 'score' has 100000000000 rows", f"allowed: up to {score_tables.MAX_ROWS} rows"])
    cases["npz of 20 M rows"] = (
        _npz(tmp_path / "rows.npz", _canary_members(**{"canary.npy": _npy_header((20_000_000,), "<i8")})),
        ["array 'canary' has 20000000 rows", f"allowed: up to {score_tables.MAX_ROWS} rows"])
    # within the row limit, but 2 M cells of 1,024 characters (8.2 GB once loaded), and 64 columns
    # of 10 M float64 (5.1 GB): refused from the headers, on the bytes they would decode to
    cases["npz text of 8 GB declared"] = (
        _npz(tmp_path / "wide-text.npz", [("canary.npy", _npy_header((2_000_000,), "<U1024")),
                                          ("score.npy", _npy_header((2_000_000,), "<f8")),
                                          ("inserted.npy", _npy_header((2_000_000,), "<i8"))]),
        ["bytes once loaded (up to array 'canary')", f"allowed: up to {score_tables.MAX_TABLE_BYTES} bytes"])
    cases["npz 64 columns of 10 M rows"] = (
        _npz(tmp_path / "columns.npz", [(f"c{i}.npy", _npy_header((10_000_000,), "<f8")) for i in range(64)]),
        ["bytes once loaded", f"allowed: up to {score_tables.MAX_TABLE_BYTES} bytes"])
    cases["npz member not .npy"] = (
        _npz(tmp_path / "notes.npz", [*_canary_members(), ("notes.txt", b"hello")]),
        ["member 'notes.txt' is not a .npy array", "allowed: one .npy array per column"])
    cases["npz complex scores"] = (
        _npz(tmp_path / "complex.npz", _canary_members(**{"score.npy": _npy(frame["score"].to_numpy() + 1j)})),
        ["array 'score' holds complex numbers (complex128)", "allowed: arrays of real numbers"])
    cases["npz two-dimensional"] = (
        _npz(tmp_path / "matrix.npz", _canary_members(**{"score.npy": _npy_header((4, 5))})),
        ["array 'score' must be one-dimensional", "(4, 5)"])
    cases["npz long text"] = (
        _npz(tmp_path / "text.npz", _canary_members(**{"canary.npy": _npy_header((20,), "<U100000")})),
        ["array 'canary' holds text of up to 100000 characters", f"allowed: up to {score_tables.MAX_TEXT_CHARS}"])
    cases["npz dates"] = (
        _npz(tmp_path / "dates.npz", _canary_members(**{"score.npy": _npy_header((20,), "<M8[s]")})),
        ["array 'score' has dtype datetime64[s]", "allowed: one-dimensional arrays of numbers"])
    cases["npz repeated member"] = (
        _npz(tmp_path / "twice.npz", [*_canary_members(), ("score.npy", _npy(-frame["score"].to_numpy()))]),
        ["column 'score' is given twice", "allowed: each column once"])
    cases["npz bad header"] = (
        _npz(tmp_path / "header.npz", _canary_members(**{"score.npy": b"\x93NUMPY\x01\x00garbage"})),
        ["array 'score' has no valid .npy header"])
    arabic = frame.astype({"score": object})
    arabic.loc[3, "score"] = "\u0663"  # ٣, ARABIC-INDIC DIGIT THREE: float() reads it as 3.0
    cases["arabic-indic digits"] = (_write(tmp_path, arabic, "arabic.csv"),
                                    ["column 'score', row 4: '\u0663' is not a number", "allowed: decimal numbers in ASCII"])
    cases["csv repeated column"] = (_write(tmp_path, None, "twice.csv", text=csv_text.replace("inserted", "score", 1)),
                                    ["column 'score' is given twice", "allowed: each column once"])
    cases["csv column repeated after spaces"] = (
        _write(tmp_path, None, "spaced.csv", text=csv_text.replace(",inserted", ", score,inserted", 1)),
        ["column 'score' is given twice"])
    # under SMALL_LIMITS: files at the limit pass (see the next test), one row more does not
    cases["csv rows"] = (_write(tmp_path, frame, "many.csv"), ["more than 19 rows", "allowed: up to 19 rows"])
    cases["npz rows"] = (_npz(tmp_path / "many.npz", _canary_members()), ["array 'canary' has 20 rows", "up to 19 rows"])
    if importlib.util.find_spec("pyarrow") is not None:
        frame.to_parquet(tmp_path / "many.parquet")
        cases["parquet rows (metadata)"] = (tmp_path / "many.parquet", ["20 rows", "allowed: up to 19 rows"])
        cases["parquet dictionary of 1.1 GB decoded"] = (_dictionary_bomb(tmp_path / "bomb.parquet"),
                                                       ["once its text is decoded (up to column 'canary')",
                                                        f"allowed: up to {score_tables.MAX_TABLE_BYTES} bytes"])
    cases["csv bytes"] = (_write(tmp_path, frame.head(5), "wide.csv"), ["bytes", "allowed: up to 100 bytes"])
    return cases


#: limits made small for the cases that test them with small files
SMALL_LIMITS = {"csv rows": {"MAX_ROWS": 19}, "npz rows": {"MAX_ROWS": 19}, "parquet rows (metadata)": {"MAX_ROWS": 19},
                "csv bytes": {"MAX_TABLE_BYTES": 100}}


@pytest.mark.parametrize("case", [
    "npz header of 1e11 entries", "npz of 20 M rows", "npz text of 8 GB declared", "npz 64 columns of 10 M rows",
    "parquet dictionary of 1.1 GB decoded", "npz member not .npy", "npz complex scores",
    "npz two-dimensional", "npz long text", "npz dates", "npz repeated member", "npz bad header",
    "arabic-indic digits", "csv repeated column", "csv column repeated after spaces",
    "csv rows", "npz rows", "parquet rows (metadata)", "csv bytes",
])
def test_bounded_and_silently_misread_files_are_one_line_errors(tmp_path, capsys, monkeypatch, case):
    """Exit 2, one line naming the file and what is wrong with its allowed range, nothing on
    stdout, the --out folder never created and nothing else written, whatever the file claims."""
    import audit.score_tables as score_tables

    cases = _bounded_cases(tmp_path)
    if case not in cases:
        pytest.skip("pyarrow is not installed")
    for name, value in SMALL_LIMITS.get(case, {}).items():
        monkeypatch.setattr(score_tables, name, value)
    file, words = cases[case]
    before = set(tmp_path.rglob("*"))
    out = tmp_path / "out"
    capsys.readouterr()
    code = main(["scores", str(file), "--claim-epsilon", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith(f"dpfl-audit: error: {file}: "), captured.err
    assert all(word in captured.err for word in words), captured.err
    assert set(tmp_path.rglob("*")) == before


def test_files_at_the_row_limit_are_read(tmp_path, capsys, monkeypatch):
    """The limits refuse one row more, not the limit itself: 20 canaries with MAX_ROWS = 20."""
    import audit.score_tables as score_tables

    monkeypatch.setattr(score_tables, "MAX_ROWS", 20)
    frame = _canary_frame(0, 1.0, 20)
    files = [_write(tmp_path, frame, "at.csv"), _npz(tmp_path / "at.npz", _canary_members())]
    if importlib.util.find_spec("pyarrow") is not None:
        frame.to_parquet(tmp_path / "at.parquet")
        files.append(tmp_path / "at.parquet")
    metrics = [_attack(_run_json(capsys, file))["metrics"] for file in files]
    assert all(m == metrics[0] for m in metrics)


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="pyarrow is not installed")
def test_parquet_with_broken_pandas_metadata_is_read_by_its_columns(tmp_path, capsys):
    """The pandas metadata is a JSON blob any writer may set; one naming an index column that does
    not exist made pandas raise KeyError. The columns alone are read, as from the same CSV."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = _canary_frame(3, 1.0, 40)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    bogus = {b"pandas": b'{"index_columns": ["nope"], "columns": [{"name": "x"}], "column_indexes": 7}'}
    pq.write_table(table.replace_schema_metadata(bogus), tmp_path / "bogus.parquet")
    csv = _write(tmp_path, frame, "same.csv")
    assert _attack(_run_json(capsys, tmp_path / "bogus.parquet"))["metrics"] == _attack(_run_json(capsys, csv))["metrics"]


@pytest.mark.parametrize("kind", ["canary", "membership"])
@pytest.mark.parametrize("power", [1000, -1000])
def test_scores_near_the_ends_of_the_float_range_give_the_same_figures(tmp_path, capsys, kind, power):
    """Every figure is unchanged when every score is multiplied by 2^±1000 (≈ 1e±301): ranks do not
    change, and the Gaussian fit's standardised shift is scale-free — it must not overflow (±1e308
    gave ZeroDivisionError / NaN) nor underflow. NPZ keeps the scores exact; a RuntimeWarning
    (overflow) would be an error."""
    import warnings

    frame = _canary_frame(5, 1.5, 200) if kind == "canary" else _membership_frame(5, 1.0, 0.5, runs=4, units=50)
    frame["score"] = frame["score"].to_numpy() / 8  # below 2⁴ in magnitude, so 2^1000 × it stays finite
    scaled = frame.assign(score=np.ldexp(frame["score"].to_numpy(), power))
    files = []
    for name, table in (("plain", frame), ("scaled", scaled)):
        columns = {c: np.asarray(table[c].tolist()) for c in table}  # text ids as numpy 'U' arrays, never objects
        np.savez(tmp_path / f"{name}.npz", **columns)
        files.append(tmp_path / f"{name}.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        plain, extreme = (_attack(_run_json(capsys, file, "--claim-epsilon", "1")) for file in files)
    assert extreme["metrics"] == plain["metrics"]
    assert [v["status"] for v in extreme["verdicts"]] == [v["status"] for v in plain["verdicts"]]


def test_canary_scores_of_plus_and_minus_1e308(tmp_path, capsys):
    """Scores ±1e308 (the largest decimal magnitudes) rank like ±1: the same figures, no warning."""
    import warnings

    frame = _canary_frame(2, 1.0, 60)
    inserted = frame["inserted"].to_numpy() == 1
    files = []
    for name, big in (("unit", 1.0), ("huge", 1e308)):
        score = np.where(inserted, big, -big)
        score[:6] = -score[:6]  # a few wrong guesses, so the figures are not all at their ends
        files.append(_write(tmp_path, frame.assign(score=score), f"{name}.csv"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        unit, huge = (_attack(_run_json(capsys, file, "--claim-epsilon", "1")) for file in files)
    assert huge["metrics"] == unit["metrics"]
