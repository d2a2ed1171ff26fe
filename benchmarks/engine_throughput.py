"""Client updates per second on workload 1: the batched engine vs the plain per-client loop.

Workload 1 (benchmarks/workloads.py): DP-FedAvg on digits, 100 clients of 15 records, MLP
64→128→10, one local epoch of batch 5, flat clip 1, σ = 1 on the aggregate, 10 rounds. Both
paths run the same defense, schedule and noise (they agree to float rounding). Each path first
trains two warm-up rounds (torch's first-use costs), then the timed trainings, whose rounds
only are timed (as Flower's are); the figure is the median over ``--repeats``. Run on an idle machine: another busy process makes torch's
threads collapse.

    python benchmarks/engine_throughput.py [--rounds 10] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

from workloads import Workload, dp_fedavg, workload_one  # noqa: E402

from defenses.engine import FederatedEngine  # noqa: E402


def updates_per_second(workload: Workload, engine: str, rounds: int) -> tuple[float, float]:
    """(client updates per second, final test accuracy) of one training, its rounds only: the
    run's set-up (model initialisation, the ε trajectory) and its final claim are not timed, as
    Flower's start-up is not."""
    run = FederatedEngine(dp_fedavg(), workload.job(rounds, engine))
    state = run.start()
    ended: list[float] = []
    started = time.perf_counter()
    outcome = run.train_from(state, lambda done, total, row: ended.append(time.perf_counter()))
    return sum(m["participants"] for m in outcome.metrics) / (ended[-1] - started), outcome.metrics[-1]["test_accuracy"]


def measure_engine(rounds: int = 10, repeats: int = 3) -> dict:
    """Median client updates/s of the batched engine and of the per-client loop, and their ratio."""
    workload = workload_one()
    result: dict = {"rounds": rounds, "repeats": repeats}
    for engine in ("batched", "loop"):
        dp_fedavg().train(workload.job(2, engine))  # warm-up
        timings = [updates_per_second(workload, engine, rounds) for _ in range(repeats)]
        result[engine] = {"updates_per_second": statistics.median(t[0] for t in timings),
                          "all": [round(t[0], 1) for t in timings], "test_accuracy": timings[-1][1]}
    result["ratio"] = result["batched"]["updates_per_second"] / result["loop"]["updates_per_second"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure_engine(args.rounds, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for engine in ("batched", "loop"):
        print(f"{engine:8s}: {result[engine]['updates_per_second']:9.1f} client updates/s (median of {args.repeats})")
    print(f"ratio batched/loop: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
