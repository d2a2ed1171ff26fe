"""``dpfl-audit sweep`` — a grid of audits sharing runs, resumable, with one
combined table, the privacy–utility figures and a sweep page."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from audit.cli import main
from audit.config import load_config
from audit.core.errors import UserInputError
from audit.sweep import MAX_POINTS, grid_points, parse_axes, parse_axis
from reports.results import load_results
from reports.soundness import FAMILY_ALPHA
from reports.sweep import SweepPoint, combined_experiments, summary_rows, sweep_family
from tests.helpers import tiny_config

# ---------------------------------------------------------------------------------------------
# the grid


def test_values_are_one_yaml_sequence():
    assert parse_axis("defenses.1.epsilons=1,4,16") == parse_axis("defenses.1.epsilons= 1, 4 ,16")
    assert parse_axis("defenses.1.epsilons=1,4,16").values == (1, 4, 16)
    assert parse_axis("model.options.hidden=[64],[32, 32]").values == ([64], [32, 32])
    assert parse_axis("name='a, b',c").values == ("a, b", "c")
    assert parse_axis("training.lr=0.05").values == (0.05,)


@pytest.mark.parametrize("text, message", [
    ("rounds", "--over: 'rounds' is not PATH=V1,V2,..."),
    ("=1,2", "--over: '=1,2' is not PATH=V1,V2,..."),
    ("training..lr=1", "--over: 'training..lr=1' is not PATH=V1,V2,..."),
    ("training.lr=", "--over training.lr: give at least one value"),
    ("training.lr=0.1,,0.2", "--over training.lr: give at least one value, comma-separated, none empty"),
    ("training.lr=0.1,0.1", "--over training.lr: value 0.1 is given twice"),
    ("training.lr=[0.1", "--over training.lr:"),
])
def test_a_bad_axis_is_one_line(text, message):
    with pytest.raises(UserInputError) as error:
        parse_axis(text)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_axes_are_distinct_and_the_grid_bounded():
    with pytest.raises(UserInputError, match="training.lr: this path is swept twice"):
        parse_axes(["training.lr=0.1", "training.lr=0.2"])
    with pytest.raises(UserInputError, match="give at least one axis"):
        parse_axes([])
    side = int(MAX_POINTS ** 0.5) + 1
    with pytest.raises(UserInputError, match=f"the grid has {side * side} points, more than the {MAX_POINTS}"):
        parse_axes([f"training.lr={','.join(str(i + 1) for i in range(side))}",
                    f"training.rounds={','.join(str(i + 1) for i in range(side))}"])


def test_points_are_the_product_first_axis_slowest_and_a_single_value_fills_a_list_field():
    base = load_config(preset_name="smoke")
    points = grid_points(base, parse_axes(["defenses.1.epsilons=1,4", "training.lr=0.1,0.2,0.3"]))
    assert [(p.values["defenses.1.epsilons"], p.values["training.lr"]) for p in points] == [
        (1, 0.1), (1, 0.2), (1, 0.3), (4, 0.1), (4, 0.2), (4, 0.3)]
    assert [p.name for p in points] == ["p01", "p02", "p03", "p04", "p05", "p06"]
    # one ε per point: the list field gets a one-element list; nothing else changes
    assert points[4].config.defenses[1].epsilons == [4.0] and points[4].config.training.lr == 0.2
    assert points[4].config.defenses[0] == base.defenses[0] and points[4].config.attacks == base.attacks
    # a list given as the value is taken as it is
    (point,) = grid_points(base, parse_axes(["defenses.1.epsilons=[1, 2]"]))
    assert point.config.defenses[1].epsilons == [1.0, 2.0]


@pytest.mark.parametrize("axis, message", [
    ("training.rouns=1,2", "sweep point training.rouns=1: training.rouns: unknown field; allowed: rounds"),
    ("defenses.1.epsilons=4,-1", "sweep point defenses.1.epsilons=-1: defenses[1].epsilons"),
    ("defenses.7.epsilons=1", "sweep point defenses.7.epsilons=1: --over defenses.7: 'defenses' is a list of 2 entries"),
])
def test_a_bad_point_names_the_point_and_the_field(axis, message):
    with pytest.raises(UserInputError) as error:
        grid_points(load_config(preset_name="smoke"), parse_axes([axis]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_command_refuses_a_bad_point_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["sweep", "--preset", "smoke", "--over", "defenses.1.epsilons=1,0", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dpfl-audit: error: sweep point defenses.1.epsilons=0:")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# a real sweep: two ε points of dp-fedavg beside fedavg, then the same command again

TINY_SWEEP = {
    "defenses": [{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [8]}],
    "attacks": [{"name": "loss-threshold"}, {"name": "record-canaries", "params": {"canaries": 40}}],
    "training": {"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.05},
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    config = folder / "tiny.yaml"
    config.write_text(tiny_config(**TINY_SWEEP))
    out = folder / "out"
    command = ["sweep", str(config), "--over", "defenses.1.epsilons=1,16", "--out", str(out), "--quiet"]
    assert main(command) == 0
    first = json.loads((out / "sweep.json").read_text())
    modified = {p: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    assert main([*command, "--track", "tensorboard"]) == 0  # the rerun also sends each point to TensorBoard
    return out, first, json.loads((out / "sweep.json").read_text()), modified


def test_each_point_is_a_whole_audit_with_its_value(sweep):
    out, first, _, _ = sweep
    assert [p["values"] for p in first["points"]] == [{"defenses.1.epsilons": 1}, {"defenses.1.epsilons": 16}]
    for point, epsilon in zip(first["points"], (1, 16)):
        results, _, _ = load_results(out / point["folder"])
        private = [e for e in results.experiments if e.claim.is_private]
        assert len(private) == 1 and private[0].claim.epsilon == pytest.approx(epsilon, rel=1e-3)
        assert {e.defense for e in results.experiments} == {"fedavg", "dp-fedavg"}
        for name in ("report.html", "results.csv", "config.yaml", "manifest.json"):
            assert (out / point["folder"] / name).is_file()


def test_a_run_two_points_need_is_trained_once(sweep):
    out, first, _, _ = sweep
    (one, _, _), (two, _, _) = (load_results(out / p["folder"]) for p in first["points"])
    fedavg = [next(e for e in r.experiments if e.defense == "fedavg") for r in (one, two)]
    assert fedavg[0].runs == fedavg[1].runs and fedavg[0].canary_runs == fedavg[1].canary_runs
    private = [next(e for e in r.experiments if e.claim.is_private) for r in (one, two)]
    assert not set(private[0].runs) & set(private[1].runs)
    # every run of every point is in the one store, and nothing else is
    needed = {rid for r in (one, two) for e in r.experiments for rid in e.runs + sum(e.canary_runs.values(), [])}
    assert {p.name for p in (out / "runs").iterdir()} == needed
    assert first["runs"] == {"stored": len(needed), "trained": len(needed)}
    assert first["points"][1]["trained_runs"] == len(needed) - first["points"][0]["trained_runs"]
    assert first["points"][1]["trained_runs"] < first["points"][0]["trained_runs"]  # fedavg's came from p01


def test_a_rerun_reuses_every_run_and_every_point(sweep):
    out, first, second, modified = sweep
    assert second["runs"] == {"stored": first["runs"]["stored"], "trained": 0}
    assert all(p["reused"] and p["trained_runs"] == 0 for p in second["points"])
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == modified  # not one run rewritten
    assert second["rows"] == first["rows"]


def test_the_table_is_what_each_point_measured(sweep):
    out, first, _, _ = sweep
    with open(out / "sweep.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == 4 and [r["point"] for r in table] == ["p01", "p01", "p02", "p02"]
    for row in table:
        results, _, _ = load_results(out / "points" / row["point"])
        experiment = next(e for e in results.experiments if e.label == row["configuration"])
        assert row["defenses.1.epsilons"] == ("1" if row["point"] == "p01" else "16")
        assert float(row["test_accuracy"]) == pytest.approx(experiment.utility.test_accuracy.value)
        aucs = {a.attack: a.metrics["auc"].value for a in experiment.attacks if a.metrics["auc"].value is not None}
        assert float(row["auc"]) == pytest.approx(max(aucs.values())) and aucs[row["strongest_attack"]] == max(aucs.values())
        bounds = [a.metrics[m].value for a in experiment.attacks for m, kind in a.epsilon_kind.items()
                  if kind == "lower_bound" and m in a.metrics and a.metrics[m].value is not None]
        assert (row["epsilon_lb"] == "") == (not bounds)
        if bounds:
            assert float(row["epsilon_lb"]) == pytest.approx(max(bounds))
        assert row["verdict"] == experiment.soundness
        assert row["report"] == f"points/{row['point']}/report.html"
    lines = [len((out / name).read_text().splitlines()) - 1
             for name in ("sweep-rows.csv", "points/p01/results.csv", "points/p02/results.csv")]
    assert lines[0] == lines[1] + lines[2] > 0


def test_figures_and_page(sweep):
    out, first, _, _ = sweep
    from PIL import Image

    for stem in ("privacy-utility", "leakage-auc", "claimed-vs-measured"):
        png, pdf = out / "figures" / f"{stem}.png", out / "figures" / f"{stem}.pdf"
        with Image.open(png) as image:
            assert image.size[0] > 300 and image.size[1] > 200
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5000
    page = (out / "sweep.html").read_text()
    assert page.count('<img alt="') == 3 and "http://" not in page and "https://" not in page
    assert 'href="points/p01/report.html"' in page and 'href="points/p02/report.html"' in page
    assert page.index('id="sweep-table"') < page.index('id="figures"')
    assert (out / "run.log").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["defenses"][1]["epsilons"] == [8.0]  # the base, unchanged


# ---------------------------------------------------------------------------------------------
# the combined view: one experiment once, and Holm across the sweep


def _points(sweep) -> list[SweepPoint]:
    out, first, _, _ = sweep
    return [SweepPoint(p["name"], p["values"], p["folder"], load_results(out / p["folder"])[0]) for p in first["points"]]


def test_an_experiment_the_grid_does_not_change_is_counted_once(sweep):
    combined = combined_experiments(_points(sweep))
    labels = sorted(e.label for _, e in combined)
    assert labels.count("fedavg") == 1 and len(labels) == 3  # fedavg once, dp-fedavg at ε = 1 and 16


def test_a_configuration_that_differs_between_points_is_labelled_by_the_axes_that_differ(sweep):
    one, two = _points(sweep)
    # the same experiment key at two points of another axis, with different content
    changed = replace(two.results, experiments=[replace(e, utility=replace(e.utility, test_accuracy=replace(
        e.utility.test_accuracy, value=0.5))) if e.defense == "fedavg" else e for e in one.results.experiments])
    points = [replace(one, values={"training.lr": 0.1, "name": "x"}), replace(two, values={"training.lr": 0.2, "name": "x"},
                                                                              results=changed)]
    fedavg = sorted(e.label for _, e in combined_experiments(points) if e.key == "fedavg")
    assert fedavg == ["fedavg (training.lr=0.1)", "fedavg (training.lr=0.2)"]


def with_p(point: SweepPoint, p: float) -> SweepPoint:
    """The point with every tested bound of its private experiment at p-value 1, except one at
    ``p``, and its verdict a violation (as its own Holm family would decide at small p)."""
    experiments = []
    for e in point.results.experiments:
        first = True
        attacks = []
        for a in e.attacks:
            verdicts = []
            for v in a.verdicts:
                if v.kind == "lower_bound" and v.p_value is not None:
                    v = replace(v, p_value=p if first else 1.0)
                    first = False
                verdicts.append(v)
            attacks.append(replace(a, verdicts=verdicts))
        experiments.append(replace(e, attacks=attacks, soundness="violation" if e.claim.is_private else e.soundness))
    return replace(point, results=replace(point.results, experiments=experiments))


def test_a_violation_stands_sweep_wide_only_under_holm_over_the_whole_sweep(sweep):
    one, two = _points(sweep)

    family = sweep_family([with_p(one, 0.03), with_p(two, 0.004)])
    k = family["figures"]
    tested = sum(1 for _, e in combined_experiments([one, two]) for a in e.attacks for v in a.verdicts
                 if v.kind == "lower_bound" and v.p_value is not None)
    assert k == tested and k >= 2
    # Holm by hand: 0.004 ≤ α/k is rejected when k ≤ 12; 0.03 > α/(k−1) for any k ≥ 2
    assert FAMILY_ALPHA / k >= 0.004 and FAMILY_ALPHA / (k - 1) < 0.03
    rows = {(r["point"], r["configuration"]): r["sweep_verdict"] for r in summary_rows([with_p(one, 0.03), with_p(two, 0.004)])}
    private = {p: next(e.label for e in pt.results.experiments if e.claim.is_private) for p, pt in (("p01", one), ("p02", two))}
    assert rows[("p02", private["p02"])] == "violation"
    assert rows[("p01", private["p01"])] == "not sweep-wide"


def test_sweep_help_names_the_axis_syntax(capsys):
    assert main(["sweep", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--over PATH=V1,V2,..." in text and "defenses.1.epsilons=1,4,16" in text


def test_the_sweep_state_lives_under_out_only(sweep):
    out, _, _, _ = sweep
    assert {p.name for p in Path(out).iterdir()} == {"config.yaml", "figures", "manifest.json", "points", "run.log", "runs",
                                                     "sweep-rows.csv", "sweep.csv", "sweep.html", "sweep.json", "tensorboard",
                                                     ".dpfl-audit.lock"}  # the folder's lock (audit.core.output_folder)
    # --track tensorboard: a log directory per point, one per configuration of that point
    for point in ("p01", "p02"):
        results, _, _ = load_results(out / "points" / point)
        assert {p.name for p in (out / "tensorboard" / point).iterdir()} == {e.key for e in results.experiments}


def test_the_documented_sweep_is_three_points_of_dp_fedavg_one_epsilon_each():
    """The command of docs/how-to/sweeps-and-tracking.md as printed (planned here; the tiny sweep above runs the same code)."""
    from audit.cli_parser import build_parser
    from audit.sweep import plan_sweep
    from tests.helpers import DOCS, readme_commands

    (arguments,) = readme_commands("dpfl-audit sweep", DOCS / "how-to" / "sweeps-and-tracking.md")
    args = build_parser().parse_args(["sweep", *arguments])
    points = plan_sweep(load_config(args.config, args.preset, {}, args.sets), parse_axes(args.over))
    assert [p.config.defenses[1].epsilons for p in points] == [[1.0], [4.0], [16.0]]
    assert {p.config.defenses[1].name for p in points} == {"dp-fedavg"} and args.preset == "smoke"
    claimed = [next(e for e in p.plan.experiments if e.defense.name == "dp-fedavg").target_epsilon for p in points]
    assert claimed == [1.0, 4.0, 16.0]


def test_a_relabelled_configuration_keeps_its_sweep_wide_decision(sweep):
    """The same configuration at two points of another axis, different there (its label gains the
    axis): the one with p = 0.004 stands sweep-wide, the one with p = 0.5 does not."""
    one, _ = _points(sweep)
    points = [replace(with_p(one, 0.004), name="p01", values={"training.lr": 0.1}),
              replace(with_p(one, 0.5), name="p02", values={"training.lr": 0.2})]
    assert FAMILY_ALPHA / sweep_family(points)["figures"] >= 0.004
    private = next(e.label for e in one.results.experiments if e.claim.is_private)
    assert any(e.label == f"{private} (training.lr=0.1)" for _, e in combined_experiments(points))
    rows = {(r["point"], r["configuration"]): r["sweep_verdict"] for r in summary_rows(points)}
    assert rows[("p01", private)] == "violation" and rows[("p02", private)] == "not sweep-wide"
