"""Figure files for papers and slides: the report's plots as PNG and PDF.

``figures/`` in an output directory holds, from the same drawings the HTML report embeds
(:mod:`reports.plots`):

* ``roc-<attack>`` — log–log ROC curves of each membership attack and canary audit, one line per
  configuration (as in Carlini et al. 2022, "Membership Inference Attacks From First Principles");
* ``privacy-utility`` — test accuracy against the claimed ε;
* ``leakage-auc`` / ``leakage-tpr-at-1pct`` — membership leakage against the claimed ε;
* ``claimed-vs-measured`` — every ε lower bound against what the claim allows, with the diagonal;
* ``reconstruction-<configuration>-<attack>-<n>`` — the reconstruction grids of gradient
  inversion and model inversion, drawn large with sharp pixels, rows labelled and records numbered.

Every figure that shows attacks gives each attack one colour (:func:`reports.plots.attack_colors`).

Files are written atomically and carry no timestamps or software versions, so the same results
give the same bytes; figures with nothing to draw are left out.
"""

from __future__ import annotations

import base64
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from audit.core.atomic import write_bytes
from audit.core.lazy_modules import lazy_module
from audit.core.safe_names import slug
from reports.document import Results

if TYPE_CHECKING:
    from reports import epsilon_plots, plots
else:  # matplotlib is imported with the first figure (audit.core.lazy_modules)
    plots = lazy_module("reports.plots")
    epsilon_plots = lazy_module("reports.epsilon_plots")

#: PDF metadata without dates or versions (reproducible bytes)
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
FORMATS = ("png", "pdf")


def _drawings(results: Results, chance: float | None = None) -> Iterator[tuple[str, Any]]:
    """(file stem, matplotlib figure or None) of every plot the figure files hold."""
    experiments = results.experiments
    yield "privacy-utility", plots.accuracy_vs_epsilon.figure(experiments, chance)
    yield "leakage-auc", epsilon_plots.leakage_vs_epsilon.figure(experiments, "auc")
    yield "leakage-tpr-at-1pct", epsilon_plots.leakage_vs_epsilon.figure(experiments, "tpr_at_fpr_1%")
    yield "claimed-vs-measured", epsilon_plots.empirical_vs_claimed.figure(experiments)
    for name in plots.roc_attacks(experiments):  # an attack without scores gets no file
        yield f"roc-{slug(name)}", plots.roc_plot.figure(experiments, name)


def _saved(figure: Any, kind: str, fit: bool = False) -> bytes:
    # laid out once by the caller (tight_layout), not with bbox_inches="tight", which draws every
    # figure twice per format: figure files would triple the cost of writing an audit's outputs;
    # ``fit``: the layout could not make room for the decorations, so the box is fitted after all
    buffer = io.BytesIO()
    metadata = {"Software": None} if kind == "png" else PDF_METADATA
    with plots.glyphs_may_be_missing():
        figure.savefig(buffer, format=kind, dpi=150, metadata=metadata, bbox_inches="tight" if fit else None)
    return buffer.getvalue()


def save_figure(figure: Any, folder: Path, stem: str) -> list[Path]:
    """``stem``.png and ``stem``.pdf of ``figure`` (then closed)."""
    import matplotlib.pyplot as plt

    written = []
    try:
        with warnings.catch_warnings(record=True) as refused:  # "Tight layout not applied" (a crowded plot)
            warnings.simplefilter("always")
            with plots.glyphs_may_be_missing():
                figure.tight_layout()
        for kind in FORMATS:
            path = folder / f"{stem}.{kind}"
            write_bytes(path, _saved(figure, kind, fit=bool(refused)))
            written.append(path)
    finally:
        plt.close(figure)
    return written


def write_figures(results: Results, folder: str | Path, chance: float | None = None) -> list[Path]:
    """Write every figure of ``results`` as PNG and PDF into ``folder`` (created if needed);
    returns the files written. ``chance``: the accuracy of always predicting the test set's most
    common class, drawn in the privacy–utility figure (None: not known, not drawn)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, figure in _drawings(results, chance):
        if figure is not None:
            written += save_figure(figure, folder, stem)
    for experiment in results.experiments:
        for attack in experiment.attacks:
            for n, grid in enumerate(attack.figures, 1):
                figure = plots.reconstruction_grid.figure(base64.b64decode(grid.png), grid.title, plots.grid_rows(attack.attack))
                written += save_figure(figure, folder, f"reconstruction-{slug(experiment.label)}-{slug(attack.attack)}-{n}")
    return written
