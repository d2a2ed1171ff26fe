"""What a Dirac canary audit costs each client-level defense: one run trained with its canaries —
one per model coordinate, each read through the defense's own code
(``defenses/federated/dirac_passage.py``) — against the same run without them.

The run is the first canary run of the detection benchmark's small design (``detection.py``:
digits, the 9,610-parameter MLP, 20 clients, 10 rounds of one local epoch, every client every
round), each defense at its calibrated σ for ε = 4, built by the audit's own functions. Where
the defense's code is known to treat alike the canaries of one tensor and value (DP-FedAvg's own
privatisation, the top-k sparsifiers) one probe per class reads them; elsewhere each canary is
read on a probe row of its own, n − 1 canaries a computation of the round — the cost this
benchmark shows. A defense that refuses Dirac canaries is listed with its reason.

Per defense: the median wall time of ``--repeats`` runs without and with canaries (one torch
thread; run it on an idle machine), their ratio, and whether the canary audit's probes were read
per class or canary by canary.

    python benchmarks/canary_cost.py [--repeats 3] [--out benchmarks/results/canary_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the audit package
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from audit.canary_runs import dirac_rows  # noqa: E402
from audit.config import load_config  # noqa: E402
from audit.core.seeding import derive_seed  # noqa: E402
from audit.planning import canary_context, canary_relation, plan_audit  # noqa: E402
from audit.run_training import training_job  # noqa: E402
from defenses.federated.engine import FederatedEngine  # noqa: E402

DEFENSES = ("dp-fedavg", "dp-fedavg-blur", "dp-fedavg-lus", "dp-fedavg-blur-lus", "dp-fedsam", "dp-fedsam-topk",
            "fed-smp-randk", "fed-smp-topk", "fl-basic-dp", "fl-std-dp", "fl-top-dp", "fl-cs-dp", "ddgauss", "nbafl")


def setting(name: str):
    """The small design's experiment for ``name`` at ε = 4, its first canary run's job and canaries."""
    config = {"name": "canary-cost", "seed": 0, "partition": {"clients": 20}, "training": {"rounds": 10, "local_steps": 1},
              "defenses": [{"name": name, "epsilons": [4.0]}], "membership": {"runs": 2},
              "attacks": [{"name": "dirac-canaries", "params": {"coins": 9610}}], "diagnostics": {"enabled": False}}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "design.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        plan = plan_audit(load_config(path))
    experiment = plan.experiments[0]
    audit = next(a for a in plan.canary_audits if a.name == "dirac-canaries")
    context = canary_context(plan, experiment)
    clients = plan.clients[plan.canary_base_run(0)]
    job = training_job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, 0))
    rows = dirac_rows(audit.injection(context, 0), canary_relation(experiment, audit), context.layout.dim, "cpu")
    return experiment, job, rows


def timed(defense, job) -> float:
    started = time.perf_counter()
    FederatedEngine(defense, job).run()
    return time.perf_counter() - started


def measure(name: str, repeats: int) -> dict:
    experiment, job, rows = setting(name)
    defense = experiment.defense
    hooks = defense.audit_hooks()
    refused = hooks.dirac_canaries_refused(job.training)
    if refused:
        return {"defense": name, "refused": refused}
    timed(defense, replace(job, training=replace(job.training, rounds=1)))  # warm-up: torch's first steps
    plain = [timed(defense, job) for _ in range(repeats)]
    canaries = [timed(defense, replace(job, dirac_canaries=rows)) for _ in range(repeats)]
    return {"defense": name, "probes": "per class" if hooks.dirac_canaries_alike() else "canary by canary",
            "canaries": len(rows), "inserted": int((rows.values != 0).sum()), "rounds": job.training.rounds,
            "train_s": statistics.median(plain), "with_canaries_s": statistics.median(canaries),
            "ratio": statistics.median(canaries) / statistics.median(plain)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "canary_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'defense':<22}{'probes':<19}{'train s':>9}{'with canaries s':>17}{'ratio':>8}")
    for name in args.defenses:
        row = measure(name, args.repeats)
        rows.append(row)
        if "refused" in row:
            print(f"{name:<22}refused: {row['refused']}", flush=True)
        else:
            print(f"{name:<22}{row['probes']:<19}{row['train_s']:>9.2f}{row['with_canaries_s']:>17.2f}{row['ratio']:>8.2f}",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "canary_cost", "repeats": args.repeats, "torch_threads": 1,
                                    "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
