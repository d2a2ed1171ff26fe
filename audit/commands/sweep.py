"""``dpfl-audit sweep``: one audit per point of a grid of config values (``--over PATH=V1,V2,...``),
the points sharing one run store; a combined table, the privacy–utility figures and a sweep page
(:mod:`audit.sweep`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from audit.commands import EXIT_FAILURE, EXIT_OK
from audit.commands.run import load_run_config, track
from audit.core.errors import UserInputError
from audit.core.vocabulary import VerdictStatus


def _cell(value: Any, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if percent else f"{value:.3g}"


def command_sweep(args: argparse.Namespace) -> int:
    from audit.budget import check_budget
    from audit.executors import check_executor, check_executor_plan
    from audit.sweep import parse_axes, plan_sweep, run_sweep
    from audit.tracking import check_tracking

    check_executor(args.executor, args.workers, args.ray_address, args.batch_runs)
    trackers = list(dict.fromkeys(args.track or []))
    check_tracking(trackers, args.track_uri)
    axes = parse_axes(args.over)
    base = load_run_config(args)
    points = plan_sweep(base, axes)  # every point checked before the output directory exists
    hours = 0.0
    for point in points:
        assert point.plan is not None
        check_executor_plan(args.executor, point.plan)
        hours += check_budget(point.plan, args.out, 0).hours
    if args.max_hours > 0 and hours > args.max_hours:
        raise UserInputError(f"plan: the sweep's {len(points)} points need at least {hours:.3g} hours of training together "
                             f"(before runs they share), more than --max-hours {args.max_hours:g}; sweep fewer values, "
                             "or raise --max-hours")
    if not args.quiet:
        print(f"plan: {len(points)} point(s), ≥ {hours * 60:.2g} min of training before shared runs", file=sys.stderr)
    result = run_sweep(base, axes, args.out, points=points, quiet=args.quiet, executor=args.executor,
                       workers=args.workers, batch_runs=args.batch_runs, ray_address=args.ray_address,
                       on_point=None if args.quiet else lambda text: print(text, file=sys.stderr))
    rows = result["rows"]
    print(f"{'point':<6} {'configuration':<28} {'accuracy':>9} {'claimed ε':>10} {'AUC':>6} {'ε_LB':>6}  verdict")
    for row in rows:
        epsilon = "∞" if row["epsilon"] is None else _cell(row["epsilon"])
        print(f"{row['point']:<6} {row['configuration'][:28]:<28} {_cell(row['test_accuracy'], True):>9} {epsilon:>10} "
              f"{_cell(row['auc']):>6} {_cell(row['epsilon_lb']):>6}  {row['verdict']}"
              + (f" (power {_cell(row['power'], True)})" if row["power"] is not None else "")
              + ("" if row["sweep_verdict"] in (row["verdict"], VerdictStatus.VIOLATION)
                 else f"; sweep-wide: {row['sweep_verdict']}"))
    reused = sum(p.reused for p in result["points"])
    print(f"runs: {result['trained']} trained, {result['stored']} in the shared store"
          + (f"; {reused} point(s) read back" if reused else ""))
    paths = result["paths"]
    print(f"sweep page: {paths['sweep_html']}")
    print(f"table: {paths['sweep_csv']}; figures: {paths['figures']}")
    if "mlflow" in trackers:  # one parent run for the sweep, a child per point (audit.sweep_tracking.track_sweep)
        from audit.sweep_tracking import track_sweep
        from audit.tracking import TrackingError

        try:
            print(f"tracked: mlflow → {track_sweep(args.out, args.track_uri)}")
        except TrackingError as exc:
            print(f"dpfl-audit: error: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    for point in result["points"] if "tensorboard" in trackers else []:  # TensorBoard: a log directory per point
        uri = None if args.track_uri is None else str(Path(args.track_uri) / point.name)
        code = track(["tensorboard"], Path(args.out) / point.folder, uri,
                     {"tensorboard": str(Path(args.out) / "tensorboard" / point.name)})
        if code != EXIT_OK:
            return code
    return EXIT_OK
