"""Client updates per second on a workload: the batched engine vs the plain per-client loop.

Workloads (benchmarks/workloads.py): 1 = ``mlp`` (DP-FedAvg on digits, 100 clients of 15
records, MLP 64→128→10, batch 5), 2 = ``cnn`` (DP-FedAvg on MNIST's test split, 100 clients of
80 records, the sigmoid LeNet, batch 16); one local epoch, flat clip 1, σ = 1 on the aggregate,
10 rounds. Both paths run the same defense, schedule and noise (they agree to float rounding).
Each path first trains two warm-up rounds (torch's first-use costs), then the timed trainings,
whose rounds only are timed (as Flower's are; the last round's evaluation of the global model is
inside the timed span); the figure is the median over ``--repeats``. Run on an idle machine:
another busy process makes torch's threads collapse.

    python benchmarks/engine_throughput.py [--workload mlp|cnn] [--rounds 10] [--repeats 3] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

from measures import sync  # noqa: E402
from workloads import WORKLOADS, Workload, dp_fedavg, load_workload  # noqa: E402

from defenses.federated.engine import FederatedEngine  # noqa: E402


def updates_per_second(workload: Workload, engine: str, rounds: int) -> tuple[float, float, float]:
    """(client updates per second, timed seconds, final test accuracy) of one training, its rounds
    only: the run's set-up (model initialisation, the ε trajectory) and its final claim are not
    timed, as Flower's start-up is not."""
    run = FederatedEngine(dp_fedavg(), workload.job(rounds, engine))
    state = run.start()
    ended: list[float] = []
    sync(workload.device)
    started = time.perf_counter()
    outcome = run.train_from(state, lambda done, total, row: ended.append(time.perf_counter()))
    seconds = ended[-1] - started  # the metrics row of the last round holds floats: the device is done
    return sum(m["participants"] for m in outcome.metrics) / seconds, seconds, outcome.metrics[-1]["test_accuracy"]


def measure_engine(rounds: int = 10, repeats: int = 3, workload: str | Workload = "mlp", device: str = "cpu",
                   engines: tuple[str, ...] = ("batched", "loop")) -> dict:
    """Median client updates/s of the batched engine and of the per-client loop, and their ratio."""
    data = load_workload(workload, device=device) if isinstance(workload, str) else workload
    result: dict = {"workload": data.name, "description": data.description, "rounds": rounds, "repeats": repeats,
                    "device": data.device}
    for engine in engines:
        dp_fedavg().train(data.job(2, engine))  # warm-up
        timings = [updates_per_second(data, engine, rounds) for _ in range(repeats)]
        median = statistics.median(t[0] for t in timings)
        result[engine] = {"updates_per_second": median, "seconds": statistics.median(t[1] for t in timings),
                          "all": [round(t[0], 1) for t in timings], "test_accuracy": timings[-1][2]}
    if "batched" in result and "loop" in result:
        result["ratio"] = result["batched"]["updates_per_second"] / result["loop"]["updates_per_second"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="mlp")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure_engine(args.rounds, args.repeats, args.workload, args.device)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(result["description"])
    for engine in ("batched", "loop"):
        print(f"{engine:8s}: {result[engine]['updates_per_second']:9.1f} client updates/s (median of {args.repeats})")
    print(f"ratio batched/loop: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
