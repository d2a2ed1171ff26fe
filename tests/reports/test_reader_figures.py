"""The report's figures from a reader's eye: what a figure draws must be seen, and nothing it draws
may hide another part of it.

* privacy–utility: the legend covers no data point;
* claimed vs measured: the y-label lies inside the saved figure, and the square markers (the lower
  end of a Gaussian-fit estimate's interval) have a legend entry that says so;
* ROC: a perfect attack's curve (TPR 1 from FPR 0) is drawn inside the axes with a margin, not on
  the border; the axes start at the finest rate the scores resolve; an attack without scores gets
  no panel, and the grid has exactly the panels it needs;
* leakage: attacks with equal values at one ε are drawn apart;
* one colour per attack in every figure, and no two attacks of a report share one;
* reconstruction grids: drawn at least 200 px wide, rows labelled, records numbered.

Each check reads the matplotlib figure the report embeds (the same drawing the figure files
hold), from the smoke preset's results and from score files judged against a claim they violate.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
from pathlib import Path

import matplotlib
import matplotlib.collections
import matplotlib.colors
import matplotlib.image
import matplotlib.lines
import matplotlib.pyplot as plt
import pytest

from audit.cli import main
from reports import epsilon_plots, plots
from reports.document import Results, Roc
from reports.figures import save_figure
from reports.results import load_results

REPO = Path(__file__).resolve().parents[2]
CANARY_SCORES = REPO / "examples" / "scores" / "client-canaries-dp-fedavg-eps8.csv"


@pytest.fixture(scope="module")
def smoke(smoke_runs) -> Results:
    _, (out, _) = smoke_runs
    return load_results(out)[0]


@pytest.fixture(scope="module")
def violated(tmp_path_factory) -> Results:
    """Canary scores judged against claimed ε = 0.5: both one-run bounds (about 1.4) violate it,
    and the Gaussian fit's interval lies above it."""
    out = tmp_path_factory.mktemp("violated")
    assert main(["scores", str(CANARY_SCORES), "--claim-epsilon", "0.5", "--unit", "client", "--out", str(out)]) == 0
    return load_results(out)[0]


def _renderer(figure):
    """A renderer of ``figure`` as it is laid out (a figure closed by save_figure gets a canvas again)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def _data_points(axis) -> list[tuple[float, float]]:
    """Every plotted point (line vertices and scatter offsets) of ``axis``, in display pixels,
    horizontal reference lines (axhline: x in axes coordinates) left out."""
    points = []
    for line in axis.get_lines():
        if line.get_transform() is not axis.transData:
            continue  # axhline/axvline: a reference, not data
        xs, ys = line.get_xdata(), line.get_ydata()
        points += [tuple(axis.transData.transform((x, y))) for x, y in zip(xs, ys)
                   if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (x, y))]
    for collection in axis.collections:
        if isinstance(collection, matplotlib.collections.PathCollection):
            points += [tuple(p) for p in collection.get_offset_transform().transform(collection.get_offsets())]
    return points


def test_privacy_utility_legend_covers_no_point(smoke, tmp_path):
    figure = plots.accuracy_vs_epsilon.figure(smoke.experiments)
    save_figure(figure, tmp_path, "privacy-utility")  # laid out as the file holds it (then closed)
    try:
        renderer = _renderer(figure)
        (axis,) = figure.axes
        legend = axis.get_legend().get_window_extent(renderer)
        points = _data_points(axis)
        assert points, "the private configuration is drawn"
        assert not [p for p in points if legend.x0 <= p[0] <= legend.x1 and legend.y0 <= p[1] <= legend.y1]
        # and the legend itself is on the saved picture
        assert figure.bbox.x0 <= legend.x0 and legend.x1 <= figure.bbox.x1 and figure.bbox.y0 <= legend.y0
    finally:
        plt.close(figure)


@pytest.mark.parametrize("which", ["smoke", "violated"])
def test_claimed_vs_measured_label_fits_and_squares_are_explained(which, smoke, violated, tmp_path):
    results = {"smoke": smoke, "violated": violated}[which]
    figure = epsilon_plots.empirical_vs_claimed.figure(results.experiments)
    (axis,) = figure.axes
    label = axis.yaxis.label
    handles = axis.get_legend().legend_handles
    texts = [t.get_text() for t in axis.get_legend().get_texts()]
    entries = [(h.get_marker() if isinstance(h, matplotlib.lines.Line2D) else None, t) for h, t in zip(handles, texts)]
    assert axis.collections  # the points
    verdict_kinds = {v.kind for e in results.experiments for a in e.attacks for v in a.verdicts
                     if v.bound is not None and v.measured is not None}
    assert "estimate" in verdict_kinds  # both audits have Gaussian-fit estimates: squares to explain
    if "estimate" in verdict_kinds:
        assert any(marker == "s" and "Gaussian-fit estimate" in text for marker, text in entries), entries
    if "lower_bound" in verdict_kinds:
        assert any(marker == "o" and "lower bound" in text for marker, text in entries), entries
    if any(v.status == "violation" for e in results.experiments for a in e.attacks for v in a.verdicts):
        assert any("VIOLATION" in t for t in texts)
    save_figure(figure, tmp_path, "claimed-vs-measured")  # lays the figure out as the file holds it, then closes it
    box = label.get_window_extent(_renderer(figure))
    assert box.height > 10
    assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1 and figure.bbox.x0 <= box.x0, (box, figure.bbox)


def test_a_perfect_roc_curve_is_inside_the_axes_not_on_their_border(smoke):
    experiment = next(e for e in smoke.experiments if not e.claim.is_private)  # attacks at AUC 1.0: perfect ROCs
    attack = next(a for a in experiment.attacks if a.roc.fpr and a.metrics["auc"].value == 1.0)
    figure = plots.roc_plot.figure([experiment], attack.attack)
    try:
        renderer = _renderer(figure)
        (axis,) = figure.axes
        curve = next(line for line in axis.get_lines() if line.get_label().startswith(experiment.label))
        xs, ys = curve.get_xdata(), curve.get_ydata()
        assert len(xs) >= 2  # a line, not a lone corner point
        box = axis.get_window_extent(renderer)
        top = [axis.transData.transform((x, y)) for x, y in zip(xs, ys) if y == 1.0]
        assert top, "the curve reaches TPR 1"
        # TPR 1 is drawn at least 5 pixels below the top border and spans the panel's width
        assert all(box.y1 - p[1] >= 5 for p in top)
        assert max(p[0] for p in top) - min(p[0] for p in top) > 0.5 * box.width
        assert curve.get_linewidth() >= 1.5
    finally:
        plt.close(figure)


def test_roc_axes_start_at_the_finest_rate_the_scores_resolve(smoke):
    for name in plots.roc_attacks(smoke.experiments):
        figure = plots.roc_plot.figure(smoke.experiments, name)
        try:
            (axis,) = figure.axes
            smallest = min(v for e in smoke.experiments for a in e.attacks if a.attack == name
                           for v in (*a.roc.fpr, *a.roc.tpr) if v > 0)
            low = axis.get_xlim()[0]
            # the axis reaches below the smallest non-zero rate, but by little more than one decade
            # (from 10⁻² at most: the lowest tick): no panel of empty decades
            assert low < smallest and low > min(smallest, 0.01) / 100, (name, low, smallest)
        finally:
            plt.close(figure)


def test_an_attack_without_scores_gets_no_roc_panel_and_the_grid_fits_the_rest(smoke):
    experiments = smoke.experiments
    scored = plots.roc_attacks(experiments)
    assert len(scored) >= 4
    emptied = scored[1]
    without = [dataclasses.replace(e, attacks=[dataclasses.replace(a, roc=Roc(fpr=[], tpr=[])) if a.attack == emptied
                                               else a for a in e.attacks]) for e in experiments]
    assert plots.roc_attacks(without) == [name for name in scored if name != emptied]
    figure = plots.roc_grid.figure(without)
    try:
        titles = [axis.get_title() for axis in figure.axes]
        assert titles == [plots.plain(name) for name in scored if name != emptied]
        assert all(axis.get_lines() for axis in figure.axes)  # no empty panel
        rows = {round(axis.get_position().y0, 3) for axis in figure.axes}
        assert len(rows) == math.ceil(len(titles) / 3)
    finally:
        plt.close(figure)
    assert plots.roc_plot.figure(without, emptied) is None  # nor a figure file


def _leakage_points(axis) -> list[tuple[str, float, float]]:
    """(colour, x, y) of every marker of the leakage plot (error-bar centres)."""
    found = []
    for line in axis.get_lines():
        if line.get_transform() is not axis.transData or line.get_marker() in (None, "None", ""):
            continue
        color = matplotlib.colors.to_hex(line.get_color())
        found += [(color, float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
    return found


def test_attacks_with_equal_leakage_are_drawn_apart(smoke):
    figure = epsilon_plots.leakage_vs_epsilon.figure(smoke.experiments, "auc")
    try:
        _renderer(figure)
        (axis,) = figure.axes
        points = _leakage_points(axis)
        at_one = [p for p in points if p[2] == 1.0]
        assert len({p[0] for p in at_one}) >= 2, "the smoke preset has several attacks at AUC 1.0"
        pixels = [(p[0], *axis.transData.transform((p[1], p[2]))) for p in points]
        for i, (color, x, y) in enumerate(pixels):
            for other, x2, y2 in pixels[i + 1:]:
                if other != color and abs(y - y2) < 1:
                    assert abs(x - x2) >= 4, (color, other, x, x2)  # side by side, not on top of each other
    finally:
        plt.close(figure)


def _attack_colours(figure, experiments) -> dict[str, set[str]]:
    """attack → the colours it is drawn in, from the figure's legends and ROC panel titles."""
    names = {a.attack for e in experiments for a in e.attacks}
    seen: dict[str, set[str]] = {}
    for axis in figure.axes:
        legend = axis.get_legend()
        if legend is not None:
            for handle, text in zip(legend.legend_handles, legend.get_texts()):
                if text.get_text() in names and isinstance(handle, matplotlib.lines.Line2D):
                    seen.setdefault(text.get_text(), set()).add(matplotlib.colors.to_hex(handle.get_color()))
        if axis.get_title() in names:  # a ROC panel: every configuration's line in the attack's colour
            for line in axis.get_lines():
                if line.get_label() != "chance":
                    seen.setdefault(axis.get_title(), set()).add(matplotlib.colors.to_hex(line.get_color()))
    return seen


@pytest.mark.parametrize("which", ["smoke", "violated"])
def test_one_colour_per_attack_throughout_the_figures(which, smoke, violated):
    results = {"smoke": smoke, "violated": violated}[which]
    experiments = results.experiments
    colours = plots.attack_colors(experiments)
    figures = [epsilon_plots.leakage_vs_epsilon.figure(experiments, "auc"),
               epsilon_plots.leakage_vs_epsilon.figure(experiments, "tpr_at_fpr_1%"),
               epsilon_plots.empirical_vs_claimed.figure(experiments), plots.roc_grid.figure(experiments),
               *[plots.roc_plot.figure(experiments, name) for name in plots.roc_attacks(experiments)]]
    drawn: dict[str, set[str]] = {}
    try:
        for figure in figures:
            if figure is None:
                continue
            for name, seen in _attack_colours(figure, experiments).items():
                drawn.setdefault(name, set()).update(seen)
    finally:
        for figure in figures:
            if figure is not None:
                plt.close(figure)
    assert drawn
    for name, seen in drawn.items():
        assert seen == {colours[name]}, (name, seen)
    used = [colours[name] for name in drawn]
    assert len(set(used)) == len(used)  # no two attacks share a colour
    assert all(c != plots.VIOLATION_COLOR for c in colours.values())  # red means violation only
    assert plots.attack_colors(experiments) == colours  # the same results, the same colours


def test_reconstruction_grids_are_large_labelled_and_numbered(smoke):
    grids = [(a.attack, g) for e in smoke.experiments for a in e.attacks for g in a.figures]
    assert grids, "the smoke preset runs gradient inversion"
    for attack, grid in grids:
        png = base64.b64decode(grid.png)
        figure = plots.reconstruction_grid.figure(png, grid.title, plots.grid_rows(attack))
        try:
            (axis,) = figure.axes
            assert [t.get_text() for t in axis.get_yticklabels()] == list(plots.grid_rows(attack))
            assert axis.get_xlabel() == "record" and [t.get_text() for t in axis.get_xticklabels()][0] == "1"
        finally:
            plt.close(figure)
        shown = base64.b64decode(plots.reconstruction_grid(png, grid.title, plots.grid_rows(attack)))
        width = matplotlib.image.imread(io.BytesIO(shown), format="png").shape[1]
        original = matplotlib.image.imread(io.BytesIO(png), format="png").shape[1]
        assert width >= 200 and width > original, (width, original)
