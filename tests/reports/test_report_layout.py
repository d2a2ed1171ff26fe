"""report.html reads top-down: a headline row per configuration, then the
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
from reports.verdict_text import (
    EPSILON_DESCRIPTIONS,
    accuracy_interval,
    finding_entries,
    finding_lines,
    verdict_lines,
    violation_lines,
)
from tests.helpers import HOSTILE
from tests.reports.page import Element, parse

REPO = Path(__file__).resolve().parents[2]
CANARY_SCORES = REPO / "examples" / "scores" / "client-canaries-dp-fedavg-eps8.csv"
OBSERVERS = {"released": "released models", "server": "the server", "local": "one upload alone"}
EPSILON_NAMES = {"epsilon_one_run": "one-run", "epsilon_one_run_fdp": "one-run f-DP", "epsilon_gaussian_fit": "Gaussian fit",
                 "upload_conformance": "uploads' mechanism",
                 "parametric_gdp": "claimed μ (parametric)"}


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
        assert cell.find("span", cls="badge").text == ("VIOLATION" if expected == "violation" else expected)
        if detection is None or expected == "violation":
            # beside a violation, power (to detect twice the claim) would read as a contradiction
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
    figures = {f.find("figcaption").text: f for f in page.find("section", id="plots").find_all("figure")}
    for experiment in results.experiments:
        if experiment.soundness in ("violation", "estimate above claim"):  # each bound named instead
            assert all(" ".join(line.split()) in text for line in violation_lines(experiment, experiment.soundness))
        else:
            assert " ".join(experiment.soundness_text.split()) in text
        for attack in experiment.attacks:
            assert attack.notes.split()[0] in text
            if attack.figures:  # reconstructions (one grid an attack): in the figures, named with attack and configuration
                (caption,) = [c for c in figures if c.startswith(f"{attack.attack} reconstructions: {experiment.label}.")]
                assert figures[caption].find("img").attrs["src"].startswith("data:image/png;base64,")


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


# --------------------------------------------------------------------------- a reader's pass


def _binomial_low(accuracy: float, n: int) -> float:
    """The lower end of the exact (Clopper–Pearson) 95 % interval of round(accuracy · n) of n, from
    scipy's binomial test — not from the report's code."""
    from scipy.stats import binomtest

    return binomtest(round(accuracy * n), n).proportion_ci(0.95, method="exact").low


@pytest.mark.parametrize("accuracy", [0.135, 0.16, 0.6])
def test_a_trade_off_is_claimed_only_clearly_above_chance(smoke_runs, accuracy):
    """13.5 % on 199 test records of 10 classes is within its interval of chance (10 %): no "best
    trade-off"; 60 % is far above it. The threshold is the binomial interval's lower end."""
    _, (out, _) = smoke_runs
    results, _, _ = load_results(out)
    n = results.audit.test_size
    chance = {"accuracy": 0.10, "classes": 10}
    experiments = [dataclasses.replace(e, utility=dataclasses.replace(
        e.utility, test_accuracy=dataclasses.replace(e.utility.test_accuracy, value=accuracy)))
        if e.claim.is_private else e for e in results.experiments]
    changed = dataclasses.replace(results, experiments=experiments)
    lines = finding_lines(changed, chance)
    above = _binomial_low(accuracy, n) > chance["accuracy"]
    assert above == (accuracy >= 0.16)  # the cases bracket the threshold: 16 % of 199 is clearly above
    assert any(line.startswith("Best privacy–utility trade-off") for line in lines) == above
    assert any(line.startswith("No private configuration is distinguishable from chance") for line in lines) == (not above)
    low, high = accuracy_interval(accuracy, n)
    assert low == pytest.approx(_binomial_low(accuracy, n), abs=1e-4)
    shown = f"[{100 * low:.1f} %, {100 * high:.1f} %]"
    assert any(shown in line for line in lines)
    # without a recorded chance level, no trade-off is claimed at all
    assert not any("trade-off:" in line for line in finding_lines(changed, None))


def test_the_smoke_report_judges_its_accuracy_against_the_recorded_chance(audits):
    """The audit records the test set's chance accuracy in manifest.json; the findings use it."""
    import json

    results, page, _ = _page(audits["smoke"])
    chance = json.loads((audits["smoke"] / "manifest.json").read_text(encoding="utf-8"))["chance"]
    assert chance["classes"] == 10 and 0.1 <= chance["accuracy"] < 0.2  # digits: ten balanced classes
    findings = page.find("div", id="summary").find("ul", cls="summary").text
    private = [e for e in results.experiments if e.claim.is_private]
    clear = [e for e in private
             if _binomial_low(e.utility.test_accuracy.value or 0.0, results.audit.test_size) > chance["accuracy"]]
    assert ("Best privacy–utility trade-off" in findings) == bool(clear)
    assert ("No private configuration is distinguishable from chance" in findings) == (bool(private) and not clear)


def test_every_empty_metric_cell_says_why(audits):
    """An attack table never shows a bare "–": each n/a cell points to a note under its table, and
    the note's reason is what the attack's record shows (no value for that metric, and for a TPR
    column a ROC whose FPR steps are coarser than the column's FPR)."""
    for name in ("smoke", "violated"):
        results, page, _ = _page(audits[name])
        section = page.find("section", id="results")
        tables = section.find_all("table", cls="attacks")
        ids = {e.attrs["id"] for e in section.iter() if "id" in e.attrs}
        columns = ["auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%", "accuracy"]
        scored_experiments = [e for e in results.experiments if any(a.kind != "run" for a in e.attacks)]
        assert len(tables) == len(scored_experiments)
        for table, experiment in zip(tables, scored_experiments):
            attacks = [a for a in experiment.attacks if a.kind != "run"]
            for row, attack in zip(table.find_all("tr")[1:], attacks):
                cells = row.find_all("td")[2:6]
                for cell, metric in zip(cells, columns):
                    estimate = attack.metrics.get(metric)
                    empty = estimate is None or estimate.value is None or not math.isfinite(estimate.value)
                    assert cell.text != "–" and ("n/a" in cell.text) == empty, (attack.attack, metric, cell.text)
                    if not empty:
                        continue
                    link = cell.find("a", cls="note-ref")
                    target = link.attrs["href"][1:]
                    assert target in ids
                    note = section.find("li", id=target).text
                    assert cell.attrs["title"].startswith(note.split(": ", 1)[1].rstrip("."))
                    if metric.startswith("tpr") and estimate is not None and len(attack.roc.fpr) >= 2:
                        fpr = {"tpr_at_fpr_0.1%": 0.001, "tpr_at_fpr_1%": 0.01}[metric]
                        assert f"TPR at {100 * fpr:g} % FPR is not estimable" in note
                        assert f"{round(1 / fpr):,} non-member scores" in note
                        finest = min(f for f in attack.roc.fpr if f > 0)
                        assert finest > fpr and f"finest FPR here: {100 * finest:.2g} %" in cell.text
                    elif metric == "accuracy" and estimate is None:
                        assert attack.kind == "canary" and "canary audit reports no accuracy" in note


def test_every_verdict_has_a_badge_with_its_status_in_words(audits):
    for name in ("smoke", "violated", "estimate-above"):
        results, page, _ = _page(audits[name])
        verdicts = [v for e in results.experiments for a in e.attacks for v in a.verdicts]
        summaries = page.find("section", id="results").find_all("details", cls="verdict-detail")
        assert len(summaries) == len(verdicts)
        for details, verdict in zip(summaries, verdicts):
            badge = details.find("summary").find("span", cls="badge")
            assert badge.text == ("VIOLATION" if verdict.status == "violation" else verdict.status)
            assert verdict.status.replace(" ", "-") in badge.classes
        soundness = page.find("section", id="results").find_all("p", cls="soundness")
        for paragraph, experiment in zip(soundness, results.experiments):
            badge = paragraph.find("span", cls="badge")
            assert badge.text == ("VIOLATION" if experiment.soundness == "violation" else experiment.soundness)


def test_each_violating_bound_is_named_once(audits):
    """Two analyses of one count (Steinke et al.'s and the f-DP one) give two ε_LB: each finding
    names its attack, what it observes and which bound it is, so no two sentences are alike."""
    results, page, _ = _page(audits["violated"])
    (experiment,) = results.experiments
    violating = [(a, v) for a in experiment.attacks for v in a.verdicts if v.status == "violation"]
    assert len(violating) >= 2
    (entry,) = [e for e in finding_entries(results) if e["text"].startswith("Soundness VIOLATION")]
    assert len(entry["items"]) == len(violating) == len(set(entry["items"]))
    for item, (attack, verdict) in zip(entry["items"], violating):
        assert item.startswith(attack.attack) and EPSILON_DESCRIPTIONS[verdict.metric] in item
        assert f"ε_LB = {verdict.measured:.3g}" in item and f"p = {verdict.p_value:.2g}" in item
    findings = page.find("div", id="summary").find("ul", cls="summary")
    assert [" ".join(i.split()) for i in entry["items"]] == [li.text for li in findings.find_all("li")[1:1 + len(violating)]]
    # the console says the same: the status, then one named line per rejected test
    console = verdict_lines(experiment)
    assert console[0].startswith("verdict: violation") and console[1:] == [f"  {item}" for item in entry["items"]]
    (smoke,) = [e for e in _page(audits["smoke"])[0].experiments if e.soundness != "violation"][:1]
    assert verdict_lines(smoke) == [f"verdict: {smoke.soundness} — {smoke.soundness_text}"]


def test_the_contents_link_every_section_and_the_page_prints(audits):
    for name in ("smoke", "violated"):
        _, page, html = _page(audits[name])
        ids = {e.attrs["id"] for e in page.iter() if "id" in e.attrs}
        links = [a.attrs["href"] for a in page.find("nav", id="contents").find_all("a")]
        assert {"#headline", "#summary", "#plots", "#results", "#diagnostics", "#definitions", "#provenance"} <= set(links)
        assert all(link.startswith("#") and link[1:] in ids for link in links)
        assert len(set(links)) == len(links)
        figures = page.find("section", id="plots").find_all("figure")
        assert [f"#{f.attrs['id']}" for f in figures] == [link for link in links if link.startswith("#fig-")]
        style = page.find("style").text
        assert "@media print" in style
        printed = style[style.index("@media print"):]
        for rule in ("break-inside: avoid", "break-before: page", "position: static"):
            assert rule in printed
