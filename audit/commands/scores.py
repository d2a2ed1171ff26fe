"""The ``scores`` command: membership or canary scores that any tool computed,
judged by dpfl-audit's statistics and verdicts (:mod:`audit.score_files`, :mod:`audit.external`).

It prints a short summary (or, with ``--json``, the results document) and writes files only when
``--out`` is given: results.json, results.csv, report.html and manifest.json, as an audit writes
them. The file and the claim are checked completely before anything is written.

The reading, the statistics and the reports are imported inside the command, never at module
level (see ``audit.commands``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from audit.commands import EXIT_OK
from audit.core.errors import UserInputError
from audit.core.vocabulary import AttackKind, VerdictStatus

#: ``--delta`` when none is given: the δ of the claim, and of the ε figures without one
DEFAULT_DELTA = 1e-5
#: the ε figures as the summary names them
FIGURE_NAMES = {"epsilon_one_run": "Steinke", "epsilon_one_run_fdp": "f-DP", "epsilon_gaussian_fit": "Gaussian fit"}


def command_scores(args: argparse.Namespace) -> int:
    from audit.core.atomic import dumps
    from audit.core.typed_json import to_json
    from audit.external import write_external
    from audit.score_files import score_file_results

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise UserInputError(f"--out: '{out}' exists and is not a directory")
    results, data = score_file_results(args.file, args.claim_epsilon, args.delta, args.unit, args.relation, args.seed,
                                       args.name)
    paths = write_external(results, out) if out is not None else {}
    if args.json:
        print(dumps(to_json(results)))
    else:
        print(_summary(data, results, paths))
    return EXIT_OK


def _interval(estimate: Any, percent: bool = False) -> str:
    """``0.512 [0.47, 0.55]`` (or in %); n/a where the figure is not estimable."""
    if estimate is None or estimate.value is None or not math.isfinite(estimate.value):
        return "n/a"
    scale, unit = (100.0, " %") if percent else (1.0, "")
    text = f"{estimate.value * scale:.3g}"
    if estimate.ci_low is not None and estimate.ci_high is not None:
        text += f" [{estimate.ci_low * scale:.3g}, {estimate.ci_high * scale:.3g}]"
    return text + unit


def _summary(data: Any, results: Any, paths: dict[str, str]) -> str:
    experiment = results.experiments[0]
    attack = experiment.attacks[0]
    metrics = attack.metrics
    if data.kind == AttackKind.MEMBERSHIP:
        head = f"{data.path}: membership scores, {len(data.runs)} run(s) × {len(data.units)} {attack.unit}s"
    else:
        head = (f"{data.path}: canary scores, {data.truth.size} canaries over {len(data.runs)} run(s), "
                f"{int(data.truth.sum())} inserted")
    lines = [head,
             f"  AUC {_interval(metrics.get('auc'))}; TPR at 1 % FPR {_interval(metrics.get('tpr_at_fpr_1%'), True)} "
             "(two-way bootstrap over runs and units, 95 %)"]
    steinke, fdp = metrics.get("epsilon_one_run"), metrics.get("epsilon_one_run_fdp")
    if steinke is not None and fdp is not None:
        coins = f"{len(data.units)} coins of run '{data.runs[0]}'" if data.kind == AttackKind.MEMBERSHIP else \
            f"{data.truth.size} canaries"
        lines.append(f"  ε lower bound (95 %, {coins}): Steinke et al. {steinke.value:.3g}, f-DP {fdp.value:.3g}")
    else:
        lines.append("  no ε lower bound: " + attack.notes.rsplit("no one-run ε: ", 1)[-1])
    fit = metrics.get("epsilon_gaussian_fit")
    if fit is not None:
        lines.append(f"  Gaussian-fit ε estimate {_interval(fit)} (an estimate, not a bound)")
    elif data.kind == AttackKind.CANARY and "no Gaussian-fit estimate" in attack.notes:
        lines.append("  no Gaussian-fit estimate at δ = 0: a Gaussian pair has no finite ε there")
    claim = experiment.claim
    if claim.is_private:
        stated = f"ε = {claim.epsilon:g}, δ = {claim.delta:g} per {claim.unit} ({claim.relation})"
        # power matters where no violation was found: could the audit have found one?
        figures = "; ".join(f"{FIGURE_NAMES.get(v.metric, v.metric)}: {v.status}"
                            + (f", power {v.power.detection:.0%} to detect 2ε" if v.power is not None
                               and v.status != VerdictStatus.VIOLATION else "") for v in attack.verdicts)
        status = experiment.soundness.upper() if experiment.soundness == VerdictStatus.VIOLATION else experiment.soundness
        lines.append(f"  claim {stated}: {status}" + (f" ({figures})" if figures else ""))
    else:
        lines.append("  verdict: no claim (give --claim-epsilon to compare the bounds with a claim)")
    if paths:
        lines.append(f"  written: {', '.join(Path(p).name for p in paths.values())} in {Path(next(iter(paths.values()))).parent}")
    return "\n".join(lines)
