"""report.html reads top-down (issue 20, item 5): a headline row per configuration, then the
figures, then the detail tables with one short phrase per ε figure and its full sentence behind a
disclosure element.

What the headline must say is derived here from results.json and :mod:`reports.soundness`, not
from the report's code; the page is read with the standard library's HTML parser
(:mod:`tests.reports.page`). Three audits: the smoke preset (a non-private and an inconclusive
configuration), and score files judged against a claim they violate and one whose Gaussian-fit
estimate lies above it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from audit.cli import main
from reports.document import Experiment, Results
from reports.html import headline_rows, render_report
from reports.results import load_results
from reports.soundness import experiment_verdict
from tests.helpers import HOSTILE
from tests.reports.page import Element, parse

REPO = Path(__file__).resolve().parents[2]
CANARY_SCORES = REPO / "examples" / "scores" / "client-canaries-dp-fedavg-eps8.csv"
OBSERVERS = {"released": "released models", "server": "the server", "local": "one upload alone"}
EPSILON_NAMES = {"epsilon_one_run": "one-run", "epsilon_one_run_fdp": "one-run f-DP", "epsilon_gaussian_fit": "Gaussian fit",
                 "upload_conformance": "uploads' mechanism"}


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> dict[str, Path]:
    """Output folders of the canary score file against claimed ε = 0.5 (its one-run bounds, about
    1.4, violate it) and ε = 3 (the Gaussian fit's interval, from 6.3, lies above it)."""
    folders = {}
    for name, epsilon in (("violated", "0.5"), ("estimate-above", "3")):
        out = tmp_path_factory.mktemp(name)
        assert main(["scores", str(CANARY_SCORES), "--claim-epsilon", epsilon, "--unit", "client", "--out", str(out)]) == 0
        folders[name] = out
    return folders


@pytest.fixture(scope="module")
def audits(smoke_runs, scored) -> dict[str, Path]:
    """The smoke preset's output folder besides the score audits."""
    _, (smoke, _) = smoke_runs
    return {"smoke": smoke, **scored}


def _page(folder: Path) -> tuple[Results, Element, str]:
    results, _, _ = load_results(folder)
    html = (folder / "report.html").read_text(encoding="utf-8")
    return results, parse(html), html


def _power(experiment: Experiment) -> float | None:
    detections = [v.power.detection for a in experiment.attacks for v in a.verdicts if v.power is not None]
    return max(detections, default=None)


def _largest_bound(experiment: Experiment) -> float | None:
    bounds = [a.metrics[m].value for a in experiment.attacks for m, kind in a.epsilon_kind.items()
              if kind == "lower_bound" and a.metrics[m].value is not None]
    return max(bounds, default=None)


@pytest.mark.parametrize("name", ["smoke", "violated", "estimate-above"])
def test_headline_verdict_per_configuration_is_the_soundness_verdict(audits, name):
    """Each configuration's row shows the verdict reports.soundness gives its ε figures, the best
    power among them, its accuracy, its claim per adversary and its largest ε lower bound."""
    results, page, _ = _page(audits[name])
    rows = page.find("table", cls="headline").find_all("tr", cls="configuration")
    assert [r.attrs["data-key"] for r in rows] == [e.key for e in results.experiments]
    expected_statuses = set()
    for row, experiment in zip(rows, results.experiments):
        verdicts = [v for a in experiment.attacks for v in a.verdicts]
        expected = "diverged" if experiment.diverged is not None else experiment_verdict(verdicts)
        expected_statuses.add(expected)
        cell = row.find("td", cls="verdict-cell")
        assert cell.find("span", cls="verdict-word").text.lower() == expected
        assert expected.replace(" ", "-") in cell.find("span", cls="verdict-word").classes
        detection = _power(experiment)
        if detection is None:
            assert "power" not in cell.text or "not computed" in cell.text
        else:
            assert cell.find("span", cls="power").text.startswith(f"power {100 * detection:.0f} % to detect 2ε")
        if expected == "violation":
            best = min((v for a in experiment.attacks for v in a.verdicts if v.status == "violation"),
                       key=lambda v: v.p_value if v.p_value is not None else 2.0)
            assert f"p = {best.p_value:.2g} < {best.level:.2g}" in cell.text
        accuracy = experiment.utility.test_accuracy.value
        if accuracy is not None:
            assert row.find("td", cls="accuracy").text.startswith(f"{100 * accuracy:.1f} %")
        claim = row.find("td", cls="claim").text
        if not experiment.claim.is_private:
            assert claim == "no DP claim"
        for adversary in experiment.claim.adversaries if experiment.claim.is_private else ():
            figure = "not covered" if not adversary.covered else f"ε = {adversary.epsilon:.3g}, δ = {adversary.delta:.2g}"
            assert f"{OBSERVERS[adversary.adversary]}: {figure}" in claim
        largest = _largest_bound(experiment)
        leakage = row.find("td", cls="leakage").text
        assert largest is None or leakage.startswith(f"ε_LB = {largest:.3g} per ")
    assert expected_statuses == {"smoke": {"no claim", "inconclusive"}, "violated": {"violation"},
                                 "estimate-above": {"estimate above claim"}}[name]


@pytest.mark.parametrize("name", ["smoke", "violated"])
def test_detail_tables_give_one_short_phrase_per_figure_and_keep_every_sentence(audits, name):
    """Every ε figure has one <details>: its summary a short phrase naming the figure and its
    status, its body the full verdict sentence; nothing the document holds goes missing."""
    results, page, html = _page(audits[name])
    details = page.find("section", id="results").find_all("details", cls="verdict-detail")
    verdicts = [v for e in results.experiments for a in e.attacks for v in a.verdicts]
    assert len(details) == len(verdicts)
    for element, verdict in zip(details, verdicts):
        assert "open" not in element.attrs  # closed until the reader asks
        summary, full = element.find("summary").text, element.find("p", cls="full").text
        assert summary.startswith(f"{EPSILON_NAMES[verdict.metric]}: ")
        assert verdict.status in summary.lower() and len(summary) <= 80, summary
        assert full == " ".join(verdict.text.split())
        if verdict.status == "violation":
            assert f"p = {verdict.p_value:.2g} < {verdict.level:.2g}" in summary
        elif verdict.power is not None:
            assert summary.endswith(f"power {100 * verdict.power.detection:.0f} %)")
    text = page.text
    for experiment in results.experiments:
        assert " ".join(experiment.soundness_text.split()) in text
        for attack in experiment.attacks:
            assert attack.notes.split()[0] in text
            for grid in attack.figures:  # reconstructions: in the figures, named with their configuration
                assert f"{experiment.label}: {grid.title}" in text and grid.png in html


def test_headline_comes_before_the_figures_and_the_figures_before_the_details(audits):
    _, page, html = _page(audits["smoke"])
    order = [e.attrs.get("id") for e in page.iter() if e.tag == "section"]
    assert order[:3] == ["headline", "plots", "results"], order
    first_image = html.index("<img")
    assert html.index('<table class="headline"') < first_image < html.index('id="exp-1"')
    assert all(html.index('id="plots"') < html.index(f'src="data:image/png;base64,{png[:40]}')
               for png in [img.attrs["src"][22:] for img in page.find_all("img")])


def test_the_stylesheet_is_the_shared_template_inlined(scored):
    """The page's CSS is style.css.j2 (shared with the sweep page), inlined: nothing is fetched."""
    css = (REPO / "reports" / "templates" / "style.css.j2").read_text(encoding="utf-8")
    rules = [" ".join(line.split()) for line in css.splitlines() if line.strip().endswith(" }")]
    _, page, html = _page(scored["violated"])
    style = " ".join(page.find("style").text.split())
    assert rules and all(rule in style for rule in rules)
    assert "<link" not in html and "<script" not in html and "url(" not in style


def test_headline_escapes_configuration_text(scored):
    """A label with markup is shown, never interpreted, in the headline as everywhere else."""
    results, _, _ = load_results(scored["violated"])
    hostile = dataclasses.replace(results, experiments=[dataclasses.replace(results.experiments[0], label=HOSTILE)])
    html = render_report(hostile)
    assert HOSTILE not in html
    row = parse(html).find("table", cls="headline").find("tr", cls="configuration")
    assert row.find("td", cls="configuration").text == HOSTILE


def test_headline_rows_fields(scored):
    """headline_rows, the builder the sweep page reuses, against results.json's own figures."""
    results, _, _ = load_results(scored["violated"])
    (row,) = headline_rows(results)
    (experiment,) = results.experiments
    assert row["anchor"] == "exp-1" and row["key"] == experiment.key and row["label"] == experiment.label
    assert row["verdict"] == "violation" and row["private"] and row["epsilon"] == pytest.approx(0.5)
    assert row["unit"] == "client" and row["relation"] == "add-remove"
    assert [a["adversary"] for a in row["adversaries"]] == [a.adversary for a in experiment.claim.adversaries]
    assert any(a["headline"] for a in row["adversaries"])
    violations = [v for a in experiment.attacks for v in a.verdicts if v.status == "violation"]
    assert row["violation"]["p_value"] == min(v.p_value for v in violations)
    assert row["power"]["detection"] == _power(experiment)
    assert row["power"]["figures"] == sum(v.power is not None for a in experiment.attacks for v in a.verdicts)
    assert row["leakage"]["epsilon"] == _largest_bound(experiment)
    assert row["leakage"]["auc"] == experiment.attacks[0].metrics["auc"].value
    assert math.isclose(row["accuracy"] or 0.0, experiment.utility.test_accuracy.value or 0.0)
