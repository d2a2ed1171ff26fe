"""Every benchmark of issue 9 in one run, side by side.

    python benchmarks/run_all.py [--json] [--skip-flower] [--skip-memory]

1. client updates per second on workload 1 (benchmarks/workloads.py: DP-FedAvg on digits, 100
   clients of 15 records, MLP 64→128→10, 1 local epoch of batch 5, clip 1, σ = 1, 10 rounds) for
   the batched engine, the plain per-client PyTorch loop and Flower's simulation (both of its
   engines; the faster counts) — rounds only, after warm-up rounds; Flower's start-up apart;
2. the wall time of a 64-run membership experiment trained together vs one run after another,
   and of one run alone;
3. the training's achieved FLOP/s as a share of the machine's fp32 matrix-multiply peak;
4. σ calibration for a target ε at 10⁴ rounds, beside opacus's ``get_noise_multiplier``;
5. the peak resident memory of the default ``dpfl-audit run``.

Flower needs the benchmark extra: ``pip install -e '.[bench]'``. The machine should be idle
(another busy process makes torch's threads collapse): the CPU load is sampled before and after
and printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

import torch  # noqa: E402
from engine_throughput import measure_engine  # noqa: E402
from measures import calibration_time, matmul_peak, peak_memory_default_run, training_flops  # noqa: E402
from membership_batching import measure_membership_batching  # noqa: E402

#: busier than this share of all cores, in the sample before a benchmark, is not idle
IDLE_BUSY_SHARE = 0.10


def cpu_busy_share(seconds: float = 2.0) -> float:
    """Share of all cores' time spent busy (not idle or waiting on I/O) over ``seconds``, from /proc/stat."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)


def idle_check() -> dict:
    share = cpu_busy_share()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"busy_share": round(share, 3), "load_1min": round(load, 2), "idle": share < IDLE_BUSY_SHARE}


def machine() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
        with open("/proc/meminfo") as info:
            memory = int(next(line.split()[1] for line in info if line.startswith("MemTotal"))) / 1024 ** 2
    except OSError:
        memory = float("nan")
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(memory, 1), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "gpu": torch.cuda.is_available()}


def run_all(skip_flower: bool = False, skip_memory: bool = False, progress=print) -> dict:
    started = time.perf_counter()
    result: dict = {"machine": machine(), "idle_before": idle_check()}
    progress("1/5 workload 1: batched engine and per-client loop")
    engine = measure_engine(rounds=10, repeats=5)
    if skip_flower:
        flower = {"error": "skipped (--skip-flower)"}
    else:
        progress("1/5 workload 1: Flower simulation (run_simulation, start_simulation)")
        from flower_baseline import measure_flower

        flower = measure_flower(rounds=10, warmup_rounds=2, repeats=3)
    workload = {"batched_updates_per_second": engine["batched"]["updates_per_second"],
                "loop_updates_per_second": engine["loop"]["updates_per_second"],
                "batched_vs_loop": engine["ratio"], "target_batched_vs_loop": 10.0, "engine": engine, "flower": flower}
    if "best_updates_per_second" in flower:
        best = flower["best_updates_per_second"]
        workload.update(flower_updates_per_second=best, flower_engine=flower["best_engine"],
                        flower_startup_seconds={e: flower[e].get("startup_seconds") for e in ("run_simulation", "start_simulation")
                                                if isinstance(flower.get(e), dict)},
                        batched_vs_flower=engine["batched"]["updates_per_second"] / best,
                        loop_vs_flower=engine["loop"]["updates_per_second"] / best, target_batched_vs_flower=40.0)
    result["workload_1"] = workload
    progress("2/5 64-run membership experiment: together, one after another, one run")
    result["membership_64"] = measure_membership_batching(64)
    progress("3/5 matrix-multiply peak and the training's FLOP/s")
    peak = matmul_peak()
    result["flops"] = {"matmul_peak": peak, "training": training_flops(peak_flops=peak["peak_flops"])}
    progress("4/5 sigma calibration at 10^4 rounds vs opacus")
    result["calibration"] = calibration_time()
    if skip_memory:
        result["memory"] = {"error": "skipped (--skip-memory)"}
    else:
        progress("5/5 peak memory of the default dpfl-audit run")
        result["memory"] = peak_memory_default_run()
    result["idle_after"] = idle_check()
    result["total_seconds"] = time.perf_counter() - started
    return result


def _table(result: dict) -> str:
    m, w = result["machine"], result["workload_1"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']} "
             f"({m['torch_threads']} threads), python {m['python']}"]
    for when in ("idle_before", "idle_after"):
        check = result[when]
        lines.append(f"{when.replace('_', ' ')}: {'idle' if check['idle'] else 'NOT IDLE'} "
                     f"(busy {100 * check['busy_share']:.0f}% of the cores, load {check['load_1min']})")
    lines.append("1. workload 1 (client updates/s, rounds only)")
    lines.append(f"   batched engine      {w['batched_updates_per_second']:10.1f}")
    lines.append(f"   per-client loop     {w['loop_updates_per_second']:10.1f}   batched/loop {w['batched_vs_loop']:.1f}x (target >= 10x)")
    if "flower_updates_per_second" in w:
        startup = ", ".join(f"{k} {v:.1f} s" for k, v in w["flower_startup_seconds"].items() if v is not None)
        lines.append(f"   Flower ({w['flower_engine']}) {w['flower_updates_per_second']:8.1f}   batched/Flower "
                     f"{w['batched_vs_flower']:.1f}x (target >= 40x), loop/Flower {w['loop_vs_flower']:.1f}x; start-up {startup}")
    else:
        lines.append(f"   Flower: {w['flower'].get('error')}")
    b = result["membership_64"]
    lines.append(f"2. 64-run membership experiment: together {b['together_seconds']:.1f} s, one after another "
                 f"{b['one_after_another_seconds']:.1f} s, one run {b['one_run_seconds']:.2f} s -> together = "
                 f"{b['together_vs_one_run']:.1f}x one run (target <= 8x); identical runs: {b['identical_runs']}")
    f = result["flops"]
    for engine in ("batched", "loop"):
        t = f["training"]["engines"].get(engine)
        if t is not None:
            lines.append(f"3. {engine:7s} training {t['achieved_flops'] / 1e9:6.2f} GFLOP/s = "
                         f"{100 * t['share_of_peak']:.2f}% of the fp32 matmul peak {f['matmul_peak']['peak_flops'] / 1e9:.0f} GFLOP/s")
    c = result["calibration"]
    lines.append(f"4. sigma for eps={c['target_epsilon']:g} at {c['rounds']} rounds (q={c['sample_rate']:g}, "
                 f"delta={c['delta']:g}, improved RDP conversion): ours {c['ours_seconds']:.3f} s (sigma "
                 f"{c['ours_sigma']:.5f}, tolerance 1e-4 relative), opacus {c['opacus_seconds']:.3f} s "
                 f"(sigma {c['opacus_sigma']:.5f}, tolerance 0.01 absolute)")
    mem = result["memory"]
    if "peak_mib" in mem:
        lines.append(f"5. default dpfl-audit run: peak {mem['peak_mib']:.0f} MiB (target <= 2048 MiB), {mem['wall_seconds']:.0f} s")
    else:
        lines.append(f"5. memory: {mem.get('error')}")
    lines.append(f"total {result['total_seconds']:.0f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document (progress goes to stderr)")
    parser.add_argument("--skip-flower", action="store_true", help="leave out Flower's simulation")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the default run's peak memory (about 2 min)")
    args = parser.parse_args()
    result = run_all(args.skip_flower, args.skip_memory, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2) if args.json else _table(result))


if __name__ == "__main__":
    main()
