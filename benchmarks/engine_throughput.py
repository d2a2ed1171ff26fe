"""Client updates per second of the batched engine and the per-client reference loop.

Workload: the default audit's (digits, 20 iid clients of ~36 records, MLP 64→128→10, 3 local
epochs of batch 10, momentum 0.9) with DP-FedAvg (flat clip 1, σ = 1). Each path first trains
two warm-up rounds (torch's first-use costs), then the timed rounds; the figure is the median
over ``--repeats`` repetitions. Run on an idle machine: another busy process makes torch's
threads collapse.

    python benchmarks/engine_throughput.py [--rounds 10] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import numpy as np

from audit.config import AuditConfig
from audit.pipeline import plan_audit
from audit.seeding import derive_seed
from defenses.engine import TrainingJob
from defenses.fedavg import DPFedAvg, DPFedAvgParams


def default_job(rounds: int) -> TrainingJob:
    config = AuditConfig()
    plan = plan_audit(replace(config, defenses=config.defenses[:1]))
    task = plan.task
    training = replace(config.training, rounds=rounds, eval_every=rounds)
    return TrainingJob(task.model_factory, task.pool.features, task.pool.labels, plan.clients[0],
                       task.test.features, task.test.labels, training, seed=derive_seed(config.seed, "run", 0))


def updates_per_second(job: TrainingJob, engine: str) -> float:
    defense = DPFedAvg(DPFedAvgParams(clip=1.0, noise_multiplier=1.0))
    engine_job = replace(job, training=replace(job.training, engine=engine))
    defense.train(replace(engine_job, training=replace(engine_job.training, rounds=2, eval_every=2)))  # warm-up
    started = time.perf_counter()
    outcome = defense.train(engine_job)
    seconds = time.perf_counter() - started
    return sum(m["participants"] for m in outcome.metrics) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    job = default_job(args.rounds)
    results = {engine: [updates_per_second(job, engine) for _ in range(args.repeats)] for engine in ("batched", "loop")}
    medians = {engine: statistics.median(values) for engine, values in results.items()}
    summary = {
        "workload": f"digits, {len(job.clients)} clients, mlp, {job.training.local_steps} local epochs of batch "
                    f"{job.training.batch_size}, dp-fedavg clip 1 sigma 1, {args.rounds} timed rounds",
        "batched_updates_per_second": medians["batched"],
        "loop_updates_per_second": medians["loop"],
        "ratio": medians["batched"] / medians["loop"],
        "repeats": {k: [round(v, 1) for v in values] for k, values in results.items()},
        "client_sizes": [int(np.size(c)) for c in job.clients][:5],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"workload: {summary['workload']}")
    print(f"batched engine : {medians['batched']:9.1f} client updates/s (median of {args.repeats})")
    print(f"per-client loop: {medians['loop']:9.1f} client updates/s (median of {args.repeats})")
    print(f"ratio batched/loop: {summary['ratio']:.2f}x")


if __name__ == "__main__":
    main()
