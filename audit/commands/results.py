"""The commands that read stored results: ``report`` (regenerate report.html, no retraining) and
``check`` (the CI gate: hold results to a policy of leakage/utility rules; exit 1 when one fails).

The reports package is imported inside each command, never at module level (see
``audit.commands``).
"""

from __future__ import annotations

import argparse

from audit.commands import EXIT_FAILURE, EXIT_OK


def command_report(args: argparse.Namespace) -> int:
    from audit.core.output_folder import check_file, claim
    from reports.html import write_report
    from reports.results import load_results

    document, manifest, folder = load_results(args.results)
    # what is written into the results folder (report.html unless --out, figures/ with --figures)
    # may not lead out of it through a link; --out must be a file we can write
    report = check_file(args.out, "--out") if args.out is not None else folder / "report.html"
    into_folder = ([] if args.out is not None else ["report.html"]) + (["figures"] if args.figures else [])
    if into_folder:  # checked, then locked while report.html and figures/ are rewritten
        claim(folder, "RESULTS_DIR", entries=into_folder)
    extra = {"versions": manifest.get("versions", {}), "machine": manifest.get("machine", {}),
             "chance": manifest.get("chance")}
    path = write_report(document, report, manifest_extra=extra)
    print(f"report: {path}")
    if args.figures:
        from reports.figures import write_figures

        chance = (manifest.get("chance") or {}).get("accuracy")
        written = write_figures(document, folder / "figures", chance if isinstance(chance, (int, float)) else None)
        print(f"figures: {len(written)} files in {folder / 'figures'}")
    return EXIT_OK


def command_check(args: argparse.Namespace) -> int:
    from reports.gate import check_command

    passed = check_command(args.results, args.policy, args.baseline, args.junit, args.json, args.strict)
    return EXIT_OK if passed else EXIT_FAILURE
