"""The sweep page (``sweep.html``): the combined table first, then the sweep's figures, then the
points with links to their own reports. Self-contained like the audit report (the stylesheet is
the report's, figures inline), autoescaped."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from audit.core.vocabulary import VerdictStatus
from reports.html import template_environment
from reports.sweep import SweepPoint


def family_sentence(family: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What the sweep-wide correction decided, in words."""
    standing = sorted({r["configuration"] for r in rows if r["sweep_verdict"] == VerdictStatus.VIOLATION})
    point_only = sorted({r["configuration"] for r in rows if r["sweep_verdict"] == "not sweep-wide"})
    text = (f"Each point's verdicts are corrected within the point (Holm over its ε figures). Read together, the sweep "
            f"holds {family['figures']} distinct tested ε lower bound(s); Holm's procedure over all of them at "
            f"α = {family['alpha']:g} ")
    if standing:
        text += f"keeps the VIOLATION of {', '.join(standing)}."
    else:
        text += "leaves no violation standing." if not point_only else "leaves none of the points' violations standing."
    if point_only:
        text += (f" Violations found within a point but not kept across the sweep: {', '.join(point_only)} "
                 "(a finding of that point's audit alone; rerun it on its own to confirm).")
    return text


def render_sweep_page(points: list[SweepPoint], axes: list[str], rows: list[dict[str, Any]], family: dict[str, Any],
                      figures: list[tuple[str, list[Path]]], stored: int, trained: int) -> str:
    """The page's HTML; ``figures``: (title, [png path, pdf path]) of each figure file written;
    ``stored``, ``trained``: runs in the shared store, and runs the last call trained."""
    first = points[0].results
    embedded = [{"title": title, "stem": files[0].stem,
                 "png": base64.b64encode(files[0].read_bytes()).decode("ascii")} for title, files in figures]
    return template_environment().get_template("sweep.html.j2").render(
        name=first.audit.name, seed=first.audit.seed, version=first.tool.version,
        axes={a: list(dict.fromkeys(json.dumps(p.values[a], ensure_ascii=False) for p in points)) for a in axes},
        rows=rows, points=points, figures=embedded, family_sentence=family_sentence(family, rows),
        stored=stored, trained=trained, reused=sum(p.reused for p in points))
