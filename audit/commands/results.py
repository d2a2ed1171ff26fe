"""The commands that read stored results: ``report`` (regenerate report.html, no retraining) and
``check`` (the CI gate: hold results to a policy of leakage/utility rules; exit 1 when one fails).

The reports package is imported inside each command, never at module level (see
``audit.commands``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from audit.commands import EXIT_FAILURE, EXIT_OK


def command_report(args: argparse.Namespace) -> int:
    from reports.html import write_report
    from reports.results import load_results

    document, manifest, folder = load_results(args.results)
    extra = {"versions": manifest.get("versions", {}), "machine": manifest.get("machine", {})}
    path = write_report(document, Path(args.out) if args.out else folder / "report.html", manifest_extra=extra)
    print(f"report: {path}")
    if args.figures:
        from reports.figures import write_figures

        written = write_figures(document, folder / "figures")
        print(f"figures: {len(written)} files in {folder / 'figures'}")
    return EXIT_OK


def command_check(args: argparse.Namespace) -> int:
    from reports.gate import check_command

    return EXIT_OK if check_command(args.results, args.policy, args.baseline, args.junit, args.json) else EXIT_FAILURE
