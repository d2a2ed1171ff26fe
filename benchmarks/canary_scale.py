"""Canary clients at scale: the default audit's DP-FedAvg run with 10⁴ canary clients joining each
round vs the same run without them (target: ≤ 2× the run's wall time).

The run is the one the default ``dpfl-audit run`` trains for its ``dirac-canaries`` audit, built
by the audit's own functions (:func:`audit.planning.plan_audit` on the default config,
:func:`audit.run_training.training_job`, :func:`audit.canary_runs.dirac_rows`): DP-FedAvg at
the first claimed ε, digits, the MLP, 20 clients, the default training (60 rounds of 3 local
epochs), the canary runs' seed and record (every round's global model). Canary clients join
each round like clients, Poisson at the clients' rate q, so ⌈10⁴/q⌉ of them give ≈ 10⁴ a round
(the default's full participation: 10⁴). Two kinds go through the defense's real code path:

* **Dirac** canary clients (:class:`defenses.blocks.dirac_rows.DiracRows`, one non-zero
  coordinate each: the ``dirac-canaries`` audit's rows, taken from as many of its runs' designs
  as 10⁴ need), clipped, noised and summed in structured form;
* **dense** update canary clients (the ``client-canaries`` audit's random unit directions, 10⁴
  rows of d floats), appended after the real participants and privatised as dense rows, each
  with its own keyed noise stream. Their rounds are far slower, so they are timed on the first
  ``dense_rounds`` rounds of the run (beside the same shortened run without them): a round's
  cost does not depend on how many rounds follow.

Each kind is timed as a whole run (:meth:`FederatedEngine.run`: start, rounds, outcome) after a
2-round warm-up of each; the repeats interleave the runs with and without canaries (their order
alternating), and the figure is the median of each over ``repeats``, with the ratio of medians.

    python benchmarks/canary_scale.py [--per-round 10000] [--repeats 3] [--no-dense] [--dense-rounds 5]
                                      [--device cpu] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

import torch  # noqa: E402
from measures import sync  # noqa: E402

from attacks.canaries.update_canaries import ClientCanaries  # noqa: E402
from audit.canary_runs import dirac_rows  # noqa: E402
from audit.config import load_config  # noqa: E402
from audit.core.seeding import derive_seed  # noqa: E402
from audit.planning import canary_context, canary_relation, plan_audit  # noqa: E402
from audit.run_training import training_job  # noqa: E402
from defenses.blocks.dirac_rows import DiracRows  # noqa: E402
from defenses.federated.engine import FederatedEngine  # noqa: E402
from defenses.federated.training_job import TrainingJob  # noqa: E402

#: canary clients joining each round, and the target: a run with them ≤ 2× the same run without
PER_ROUND = 10_000
TARGET_RATIO = 2.0


def default_canary_jobs(per_round: int = PER_ROUND, device: str = "cpu", dense: bool = True) -> dict:
    """The default audit's first DP-FedAvg experiment as its Dirac canary audit trains it: the
    run without canaries, with ⌈per_round/q⌉ Dirac canary clients, and (``dense``) with as many
    dense update canary clients; plus the defense and what the jobs are."""
    config = replace(load_config(), device=device)
    plan = plan_audit(config)
    experiment = next(e for e in plan.experiments if e.defense.name == "dp-fedavg")
    audit = next(a for a in plan.canary_audits if a.name == "dirac-canaries")
    context = canary_context(plan, experiment)
    clients = plan.clients[plan.canary_base_run(0)]
    rate = experiment.training.sampling_rate(len(clients))
    count = math.ceil(per_round / rate)
    plain = training_job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, 0),
                         record=plan.canary_record(audit), canary_rounds=audit.canary_rounds())
    parts: list[DiracRows] = []
    run = 0
    while sum(len(p) for p in parts) < count:  # the audit's own designs, run after run, until there are enough
        parts.append(dirac_rows(audit.injection(context, run), canary_relation(experiment, audit), context.layout.dim, device))
        run += 1
    rows = DiracRows(torch.cat([p.coords for p in parts])[:count], torch.cat([p.values for p in parts])[:count],
                     context.layout.dim)
    jobs: dict[str, TrainingJob] = {"plain": plain, "dirac": replace(plain, dirac_canaries=rows)}
    if dense:
        dense_audit = next((a for a in plan.canary_audits if isinstance(a, ClientCanaries)), ClientCanaries())
        directions = ClientCanaries(replace(dense_audit.params, canaries=count), dense_audit.label).directions(context, 0)
        jobs["dense"] = replace(plain, update_canaries=directions.to(device))
    return {"defense": experiment.defense, "jobs": jobs, "experiment": experiment.label, "clients": len(clients),
            "rate": rate, "canaries": count, "dim": context.layout.dim, "rounds": experiment.training.rounds}


def _rounds(job: TrainingJob, rounds: int) -> TrainingJob:
    return job if rounds == job.training.rounds else replace(job, training=replace(job.training, rounds=rounds))


def run_seconds(defense, job: TrainingJob, device: str) -> tuple[float, float]:
    """Wall seconds of one whole run (start, every round, outcome) and its mean canary clients a round."""
    sync(device)
    started = time.perf_counter()
    outcome = FederatedEngine(defense, job).run()
    sync(device)
    seconds = time.perf_counter() - started
    joined = [row.get("canary_participants", 0) for row in outcome.metrics]
    return seconds, statistics.fmean(joined) if joined else 0.0


def measure_canary_scale(per_round: int = PER_ROUND, repeats: int = 3, dense: bool = True, dense_rounds: int = 5,
                         device: str = "cpu", progress=None) -> dict:
    """Median wall seconds of the default DP-FedAvg run with ≈ ``per_round`` canary clients a round
    (Dirac; dense on ``dense_rounds`` rounds) and without, interleaved, and their ratios."""
    setting = default_canary_jobs(per_round, device, dense)
    defense, jobs = setting["defense"], setting["jobs"]
    # (label, job, the job without canaries it is compared with)
    pairs = [("dirac", jobs["dirac"], jobs["plain"])]
    if dense:
        pairs.append(("dense", _rounds(jobs["dense"], dense_rounds), _rounds(jobs["plain"], dense_rounds)))
    for _, with_canaries, without in pairs:  # warm-up: torch's first-use costs, the lazy imports
        for job in (without, with_canaries):
            run_seconds(defense, _rounds(job, min(2, job.training.rounds)), device)
    result = {key: setting[key] for key in ("experiment", "clients", "rate", "canaries", "dim", "rounds")}
    result.update(per_round=per_round, repeats=repeats, device=device, torch_threads=torch.get_num_threads(),
                  target_ratio=TARGET_RATIO)
    for label, with_canaries, without in pairs:
        samples: dict[str, list[float]] = {"with": [], "without": []}
        joined = 0.0
        for r in range(repeats):
            order = (("without", without), ("with", with_canaries))
            for which, job in order if r % 2 == 0 else order[::-1]:  # alternate, so drift in the load cancels
                seconds, mean_joined = run_seconds(defense, job, device)
                samples[which].append(seconds)
                joined = mean_joined if which == "with" else joined
            if progress is not None:
                progress(f"  {label} repeat {r + 1}/{repeats}: with {samples['with'][-1]:.2f} s, "
                         f"without {samples['without'][-1]:.2f} s")
        with_s, without_s = statistics.median(samples["with"]), statistics.median(samples["without"])
        ratio = with_s / without_s
        result[label] = {"rounds": with_canaries.training.rounds, "canaries_per_round": joined,
                         "with_seconds": with_s, "without_seconds": without_s, "ratio": ratio,
                         "target_met": ratio <= TARGET_RATIO, "samples": samples}
    return result


def describe(result: dict) -> list[str]:
    """Lines for run_all.py's table."""
    lines = [f"canary clients at scale ({result['experiment']}, {result['clients']} clients, q = {result['rate']:g}, "
             f"{result['canaries']} canary clients, d = {result['dim']}; median of {result['repeats']}, "
             f"{result['torch_threads']} torch threads):"]
    for label, name in (("dirac", "Dirac canary clients"), ("dense", "dense update canary clients")):
        if label not in result:
            continue
        entry = result[label]
        lines.append(f"  {name:28s} {entry['canaries_per_round']:7.0f} a round, {entry['rounds']} rounds: "
                     f"{entry['with_seconds']:.2f} s vs {entry['without_seconds']:.2f} s without -> {entry['ratio']:.2f}x "
                     f"(target <= {TARGET_RATIO:g}x: {'met' if entry['target_met'] else 'MISSED'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-round", type=int, default=PER_ROUND, help="canary clients joining each round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-dense", action="store_true", help="leave out the dense update canary clients")
    parser.add_argument("--dense-rounds", type=int, default=5, help="rounds of the dense canaries' runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure_canary_scale(args.per_round, args.repeats, not args.no_dense, args.dense_rounds, args.device,
                                  progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2) if args.json else "\n".join(describe(result)))


if __name__ == "__main__":
    main()
