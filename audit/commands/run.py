"""The commands that train: ``run`` and ``train`` (an audit's pipeline, from a config) and
``reproduce`` (a paper's comparison on a CPU proxy, its claims checked).

The pipeline, and torch with it, is imported inside each command, never at module level (see
``audit.commands``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from audit.commands import EXIT_FAILURE, EXIT_OK
from audit.core.errors import UserInputError
from audit.core.vocabulary import AttackKind, Observer

if TYPE_CHECKING:  # types only: this module loads no torch (see audit.commands)
    from defenses.privacy.claims import PrivacyClaim
    from reports.document import AttackRecord, Results


def load_run_config(args: argparse.Namespace):
    """The config a training command's arguments ask for: file, preset, --seed, --device, --set."""
    from audit.config import load_config
    from audit.core.devices import check_device

    overrides: dict[str, Any] = {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.device is not None:
        check_device(args.device, "--device")  # named as the user wrote it; the config's device is checked in planning
        overrides["device"] = args.device
    return load_config(args.config, args.preset, overrides, args.sets)


def _server_epsilon(claim: PrivacyClaim) -> str:
    """The claim against the server, for the summary table ('–' when not covered or no claim)."""
    server = claim.against(Observer.SERVER)
    return f"{server.epsilon:.3g}" if server is not None and server.covered else "–"


def _auc(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _percent(value: float | None) -> str:
    """A TPR for the summary table, 'n/a' where it was not estimable (too few non-member scores)."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _leakage(attack: AttackRecord) -> str:
    """AUC and TPR at 1 % FPR of one attack, and at 0.1 % where estimable (a member compared with
    at least 1,000 non-member scores: record units, or many runs)."""
    low = attack.metrics["tpr_at_fpr_0.1%"].value
    return (f"{attack.attack} AUC {_auc(attack.metrics['auc'].value)}"
            + ("" if low is None else f" TPR@0.1% {_percent(low)}") +
            f" TPR@1% {_percent(attack.metrics['tpr_at_fpr_1%'].value)}")


def _print_summary(results: Results) -> None:
    print(f"{'configuration':<28} {'accuracy':>9} {'claimed ε':>10} {'server ε':>9} {'unit':>7}  leakage")
    for experiment in results.experiments:
        accuracy, claim = experiment.utility.test_accuracy.value, experiment.claim
        leak = ", ".join(_leakage(a) for a in experiment.attacks if a.kind != AttackKind.RUN)
        shown = "diverged" if experiment.diverged is not None else "n/a" if accuracy is None else f"{100 * accuracy:.1f}%"
        print(f"{experiment.label[:28]:<28} {shown:>9} {(f'{claim.epsilon:.3g}' if claim.is_private else '∞'):>10} "
              f"{_server_epsilon(claim):>9} {claim.unit:>7}  {leak}; soundness: {experiment.soundness}")
    # an attack that did not run says why here too, not only in the report: a missing row is
    # otherwise read as "nothing found"
    for experiment in results.experiments:
        for skipped in experiment.skipped_attacks:
            print(f"  not run on {experiment.label}: {skipped.attack}: {skipped.reason}")


def command_run(args: argparse.Namespace, attack: bool) -> int:
    from audit.budget import check_budget
    from audit.executors import check_executor, check_executor_plan
    from audit.pipeline import run_audit
    from audit.planning import plan_audit
    from audit.tracking import check_tracking

    check_executor(args.executor, args.workers, args.ray_address, args.batch_runs)  # for ray: that Ray is installed
    trackers = list(dict.fromkeys(getattr(args, "track", None) or []))  # `train` has no --track
    check_tracking(trackers, getattr(args, "track_uri", None))  # packages and URI, before any training
    config = load_run_config(args)
    if not (math.isfinite(args.max_hours) and args.max_hours >= 0):
        raise UserInputError(f"--max-hours: must be a finite number >= 0 (0: no limit), got {args.max_hours:g}")
    plan = plan_audit(config)  # every check happens here, before the output directory exists
    check_executor_plan(args.executor, plan)
    cache = not getattr(args, "no_cache", False)  # `train` has no --no-cache
    cost = check_budget(plan, args.out, args.max_hours, cache)
    if not args.quiet:
        print(f"plan: {cost.describe()}", file=sys.stderr)
    result = run_audit(config, Path(args.out), attack=attack, quiet=args.quiet, plan=plan, executor=args.executor,
                       workers=args.workers, batch_runs=args.batch_runs, ray_address=args.ray_address,
                       cache=cache)
    paths = result.paths
    if result.results is not None:
        _print_summary(result.results)
        print(f"report:  {paths['report']}")
        print(f"results: {paths['results_csv']}, {paths['results_json']}")
        if trackers:
            return track(trackers, args.out, args.track_uri)
    else:
        print(f"runs stored in {paths['runs']}")
    return EXIT_OK


def track(trackers: list[str], out: str | Path, uri: str | None, uris: dict[str, str] | None = None) -> int:
    """Send the written results in ``out`` to each tracker (at ``uri``, or ``uris[kind]``, else the
    tracker's default); a tracker that fails leaves the results as they are and ends the command
    with one line and exit code 1 (the audit itself succeeded)."""
    from audit.tracking import TrackingError, track_results

    for kind in trackers:
        try:
            print(f"tracked: {kind} → {track_results(kind, out, uri or (uris or {}).get(kind))}")
        except TrackingError as exc:
            print(f"dpfl-audit: error: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    return EXIT_OK


def command_reproduce(args: argparse.Namespace) -> int:
    from audit.core.devices import check_device
    from audit.reproduce import make_study, reproduce

    if args.device is not None:
        check_device(args.device, "--device")
    study = make_study(args.study, args.quick, args.dataset, args.data_root, args.seeds)
    if args.device is not None:
        study.config["device"] = args.device
    out = Path(args.out or f"reproduce-{args.study}{'-quick' if args.quick else ''}")
    result = reproduce(study, out, quiet=args.quiet)
    print(result["markdown"])
    print(f"written: {result['paths']['md']}, {result['paths']['json']}, {result['paths']['csv']}")
    return EXIT_OK
