"""``dpfl-audit sweep``: one audit per point of a grid of config values, all sharing one run store.

Each ``--over PATH=V1,V2,...`` is an axis: a dotted config path (as ``--set`` takes) and the
values it takes. The points are the axes' cartesian product, the first axis varying slowest.
Every point is a whole audit (:func:`audit.pipeline.run_audit`) of the base config with the
point's values set, written to ``<out>/points/<name>/`` — its own results, report and figures.

**Runs are shared.** All points train into one run store, ``<out>/runs``. A run's id hashes
everything that determines its training (:func:`audit.store.run_id`) and every point keeps
the base config's seed, so a run two points need — the undefended baseline of an ε sweep, every
run of a sweep over an attack's parameters — trains once, and points differ only by what the
grid changes (common random numbers: the curve's steps are not drawn with fresh noise).

**Resumable.** A point whose audit finished (its ``manifest.json``, written last) from the same
config is read back, not rerun; an interrupted point trains only the runs the store lacks.

**Checked first.** Every point is planned — its config validated, its noise calibrated — before
anything is written, so a bad value anywhere in the grid fails with one line and no output.

The combined table, figures and page come from :mod:`reports.sweep`.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit import __version__, provenance
from audit.config import AuditConfig, apply_sets, config_to_yaml
from audit.core.atomic import dumps, write_json, write_text
from audit.core.errors import UserInputError
from audit.core.output_folder import claim
from audit.core.schema import from_mapping, to_mapping
from audit.core.strict_yaml import parse_yaml
from audit.pipeline import run_audit
from audit.planning import Plan, plan_audit
from audit.store import RunStore
from reports.results import load_results
from reports.sweep import (
    SweepPoint,
    summary_csv,
    summary_rows,
    sweep_document,
    sweep_family,
    tidy_csv,
    write_sweep_figures,
)
from reports.sweep_page import render_sweep_page

LOG = logging.getLogger(__name__)

#: most points one sweep may have (a larger grid is almost certainly a typo in --over)
MAX_POINTS = 256
#: longest value list of one --over, in characters (256 values of a few characters each fit many
#: times over); checked before the list is parsed, which bounds the parsing's time and memory
MAX_OVER_CHARS = 65_536


@dataclass(frozen=True)
class Axis:
    """One ``--over``: a config path and the values it takes, in the order given."""

    path: str
    values: tuple[Any, ...]


def _parse_values(text: str) -> Axis:
    """``PATH=V1,V2,...`` → :class:`Axis`, its values not yet checked to be distinct."""
    path, equals, values = text.partition("=")
    path = path.strip()
    if not equals or not path or not all(path.split(".")):
        raise UserInputError(f"--over: '{text}' is not PATH=V1,V2,... (a dotted config path and its values, "
                             "e.g. defenses.1.epsilons=1,4,16)")
    if len(values) > MAX_OVER_CHARS:
        raise UserInputError(f"--over {path}: the values are {len(values)} characters long; "
                             f"allowed: up to {MAX_OVER_CHARS} characters (and {MAX_POINTS} points in the grid)")
    empty = re.search(r"^\s*,|,\s*,|,\s*$", values) is not None  # YAML would call ",," a syntax error
    parsed = [] if empty else parse_yaml(f"[{values}]", f"--over {path}")
    if not parsed or any(v is None for v in parsed):
        raise UserInputError(f"--over {path}: give at least one value, comma-separated, none empty (got '{values}')")
    return Axis(path, tuple(parsed))


def _check_distinct(axis: Axis) -> None:
    """Refuse a value given twice in one axis, in one pass (a dict of each value's JSON text:
    1 and 1.0 differ, as they do in the config)."""
    seen: set[str] = set()
    for value in axis.values:
        shown = json.dumps(value, sort_keys=True)
        if shown in seen:
            raise UserInputError(f"--over {axis.path}: value {shown} is given twice")
        seen.add(shown)


def parse_axis(text: str) -> Axis:
    """``PATH=V1,V2,...`` → :class:`Axis`. The values are one YAML flow sequence, so a value may
    itself be a list or a string with commas in quotes: ``model.options.hidden=[64],[128]``."""
    axis = _parse_values(text)
    _check_distinct(axis)
    return axis


def parse_axes(texts: list[str]) -> list[Axis]:
    """Every ``--over``, each path once; the grid at most :data:`MAX_POINTS` points.

    The grid's size is checked first, axis by axis as each is parsed, so a huge grid is refused
    after parsing at most one axis too many; the slower checks (paths, repeated values) run only
    on a grid of allowed size."""
    if not texts:
        raise UserInputError("--over: give at least one axis, e.g. --over defenses.1.epsilons=1,4,16")
    axes: list[Axis] = []
    size = 1
    for number, text in enumerate(texts, 1):
        axes.append(_parse_values(text))
        size *= len(axes[-1].values)
        if size > MAX_POINTS:
            counted = f"{size}" if number == len(texts) else f"at least {size}"
            raise UserInputError(f"--over: the grid has {counted} points, more than the {MAX_POINTS} a sweep allows; "
                                 f"allowed: up to {MAX_POINTS} points (the product of the axes' value counts)")
    paths: set[str] = set()
    for axis in axes:
        if axis.path in paths:
            raise UserInputError(f"--over {axis.path}: this path is swept twice; give its values in one --over")
        paths.add(axis.path)
    for axis in axes:
        _check_distinct(axis)
    return axes


def _resolved(mapping: Any, path: str) -> Any:
    """The value at ``path`` in a resolved config mapping (None where there is none)."""
    current = mapping
    for segment in path.split("."):
        if isinstance(current, list) and segment.isdigit() and int(segment) < len(current):
            current = current[int(segment)]
        elif isinstance(current, dict):
            current = current.get(segment)
        else:
            return None
    return current


def _assignment(base: dict[str, Any], path: str, value: Any) -> str:
    """``PATH=VALUE`` for ``--set``-style application; a single value for a list field (such as a
    defense's ``epsilons``) becomes a one-element list, so ``--over defenses.1.epsilons=1,4,16``
    means three points of one ε each."""
    if isinstance(_resolved(base, path), list) and not isinstance(value, list):
        value = [value]
    return f"{path}={json.dumps(value)}"


@dataclass
class Point:
    """One point of the grid: its values, its config and (once planned) its plan."""

    index: int
    values: dict[str, Any]
    config: AuditConfig
    plan: Plan | None = None

    @property
    def name(self) -> str:
        """The point's folder under ``points/``."""
        return f"p{self.index:02d}"

    @property
    def label(self) -> str:
        return point_label(self.values)


def point_label(values: dict[str, Any]) -> str:
    """``path=value, ...`` of a point's values, as the command line and errors show it."""
    return ", ".join(f"{path}={json.dumps(value)}" for path, value in values.items())


def grid_points(base: AuditConfig, axes: list[Axis]) -> list[Point]:
    """The grid's points, each config validated (a bad value: one line naming the point)."""
    mapping = to_mapping(base)
    points = []
    for index, combination in enumerate(itertools.product(*(axis.values for axis in axes)), 1):
        values = {axis.path: value for axis, value in zip(axes, combination)}
        try:
            data = apply_sets(mapping, [_assignment(mapping, p, v) for p, v in values.items()], option="--over")
            config = from_mapping(AuditConfig, data)
        except UserInputError as error:
            raise UserInputError(f"sweep point {point_label(values)}: {error}") from None
        points.append(Point(index, values, config))
    return points


def plan_sweep(base: AuditConfig, axes: list[Axis]) -> list[Point]:
    """Every point planned (registry names, hyper-parameters, data, noise calibration), nothing written."""
    points = grid_points(base, axes)
    for point in points:
        try:
            point.plan = plan_audit(point.config)
        except UserInputError as error:
            raise UserInputError(f"sweep point {point.label}: {error}") from None
    return points


def _finished(folder: Path, config: AuditConfig) -> bool:
    """Did this point's audit finish, from this very config? (manifest.json is written last)"""
    try:
        return ((folder / "manifest.json").is_file() and (folder / "results.json").is_file()
                and (folder / "config.yaml").read_text(encoding="utf-8") == config_to_yaml(config))
    except OSError:
        return False


def _stored_runs(store: RunStore) -> int:
    return sum(1 for p in store.runs.iterdir() if p.is_dir() and not p.name.startswith(".")) if store.runs.is_dir() else 0


def write_sweep(points: list[SweepPoint], axes: list[str], out: Path, stored: int,
                trained: int) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """Write ``sweep.csv`` (one row per point and configuration), ``sweep-rows.csv`` (every point's
    tidy rows), ``sweep.json``, ``figures/*.png|pdf`` and ``sweep.html`` into ``out``; ``stored``,
    ``trained``: runs in the shared store, and runs this call trained. Returns the paths and the rows."""
    paths = {"sweep_csv": out / "sweep.csv", "sweep_rows_csv": out / "sweep-rows.csv", "sweep_json": out / "sweep.json",
             "figures": out / "figures", "sweep_html": out / "sweep.html"}
    family = sweep_family(points)
    rows = summary_rows(points, family)
    write_text(paths["sweep_csv"], summary_csv(rows, axes))
    write_text(paths["sweep_rows_csv"], tidy_csv(points, axes))
    write_text(paths["sweep_json"], dumps(sweep_document(points, axes, rows, family, stored, trained)) + "\n")
    figures = write_sweep_figures(points, paths["figures"])
    write_text(paths["sweep_html"], render_sweep_page(points, axes, rows, family, figures, stored, trained))
    return paths, rows


def run_sweep(base: AuditConfig, axes: list[Axis], out: str | Path, *, points: list[Point] | None = None,
              quiet: bool = False, executor: str = "local", workers: int | None = None,
              batch_runs: int | None = None, ray_address: str | None = None,
              on_point: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Plan (unless given), run every point not yet finished, and write the combined table
    (``sweep.csv``, ``sweep.json``), ``figures/`` and ``sweep.html``. Returns paths, the points
    (:class:`reports.sweep.SweepPoint`) and how many runs this call trained. ``on_point`` is told
    which point is audited next (the command line shows it; the library only logs)."""
    started = time.perf_counter()
    points = points or plan_sweep(base, axes)
    out = claim(out)  # created and locked once every point is planned (audit.core.output_folder)
    store = RunStore(out)
    stored_before = stored = _stored_runs(store)
    write_text(out / "config.yaml", config_to_yaml(base))
    LOG.info("sweep: %d point(s) over %s; runs shared in %s", len(points), ", ".join(a.path for a in axes), store.runs)
    done: list[SweepPoint] = []
    for point in points:
        folder = out / "points" / point.name
        reused = _finished(folder, point.config)
        if reused:
            LOG.info("point %d/%d (%s): finished earlier, read back", point.index, len(points), point.label)
        else:
            LOG.info("point %d/%d (%s): auditing", point.index, len(points), point.label)
            if on_point is not None:
                on_point(f"point {point.index}/{len(points)}: {point.label}")
            run_audit(point.config, folder, quiet=quiet, plan=point.plan, executor=executor, workers=workers,
                      batch_runs=batch_runs, ray_address=ray_address, runs=out)
        results, _, _ = load_results(folder, "sweep")
        before, stored = stored, _stored_runs(store)
        done.append(SweepPoint(point.name, point.values, f"points/{point.name}", results, reused, stored - before))
    trained = stored - stored_before
    paths, rows = write_sweep(done, [a.path for a in axes], out, stored, trained)
    write_json(out / "manifest.json", {
        "tool": {"name": "dpfl-audit", "version": __version__},
        "command": " ".join(sys.argv),
        "config_seed": base.seed,
        "axes": {a.path: list(a.values) for a in axes},
        "points": {p.name: {"values": p.values, "folder": p.folder, "reused": p.reused, "trained_runs": p.trained_runs}
                   for p in done},
        "runs": {"stored": stored, "trained": trained},
        "timings": {"total_seconds": time.perf_counter() - started},
        "versions": provenance.versions(),
        "machine": provenance.machine(),
    })
    LOG.info("sweep: %d run(s) trained, %d in the store; wrote %s", trained, stored,
             ", ".join(str(p) for p in paths.values()))
    return {"paths": {**{k: str(v) for k, v in paths.items()}, "manifest": str(out / "manifest.json"),
                      "runs": str(store.runs)},
            "points": done, "rows": rows, "trained": trained, "stored": stored}
