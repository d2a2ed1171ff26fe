"""Every benchmark in one run, side by side.

    python benchmarks/run_all.py [--json] [--skip-flower] [--skip-memory] [--skip-sequential] [--skip-canaries]
                                 [--workloads mlp cnn] [--device cpu|cuda] [--quick]

For each workload (benchmarks/workloads.py; DP-FedAvg, 100 clients, 1 local epoch, clip 1,
σ = 1 on the aggregate, 10 rounds) — 1 = ``mlp`` (digits, 15 records per client, MLP 64→128→10,
batch 5) and 2 = ``cnn`` (MNIST's test split, 80 records per client, the sigmoid LeNet, batch 16):

1. client updates per second of the batched engine, the plain per-client PyTorch loop and
   Flower's simulation (both of its engines; the faster counts) — rounds only, after warm-up
   rounds; Flower's start-up apart;
2. the wall time of a 64-run membership experiment trained together vs one run after another,
   and of one run alone (target: together ≤ 16× one run);
3. the roofline, measured in the same run: the fp32 matrix-multiply peak P and the memory
   bandwidth B; the workload's counted FLOPs, its bytes (a stated model) and arithmetic
   intensity I; each engine's achieved FLOP/s as a fraction of min(P, I·B);

and once:

4. σ calibration for a target ε at 10⁴ rounds, beside opacus's ``get_noise_multiplier``;
5. the peak resident memory and wall time of the default ``dpfl-audit run``;
6. the default DP-FedAvg run with 10⁴ canary clients a round vs without (``canary_scale.py``).

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
from canary_scale import describe as canary_lines  # noqa: E402
from canary_scale import measure_canary_scale  # noqa: E402
from engine_throughput import measure_engine  # noqa: E402
from measures import MEMORY_TARGET_MIB, WALL_TARGET_SECONDS, calibration_time, matmul_peak, peak_memory_default_run  # noqa: E402
from membership_batching import measure_membership_batching  # noqa: E402
from resume import describe as describe_resume  # noqa: E402
from resume import measure_resume  # noqa: E402
from roofline import memory_bandwidth, workload_roofline  # noqa: E402
from workloads import WORKLOADS, load_workload  # noqa: E402

#: the targets: batched engine >= 10x the plain loop and >= 40x Flower, the CNN at >= 50 % of its roofline bound,
#: 64 runs together <= 16x (mlp) or 24x (cnn) one run
TARGETS = {"batched_vs_loop": 10.0, "batched_vs_flower": 40.0, "cnn_fraction_of_roofline": 0.5,
           "together_vs_one_run": {"mlp": 16.0, "cnn": 24.0}}  # per workload

#: the CNN workload's targets for the grouped-convolution engine (convolutions at the matrix-multiply peak; the LeNet
#: 64-run experiment)
CNN_TARGETS = {"fraction_of_roofline": 0.40, "batched_vs_loop": 3.5, "together_vs_one_run": 24.0}

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
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _met(value: float | None, target: float, at_most: bool = False) -> str:
    if value is None:
        return "n/a"
    return "met" if (value <= target if at_most else value >= target) else "MISSED"


def run_all(skip_flower: bool = False, skip_memory: bool = False, workloads: tuple[str, ...] = WORKLOADS,
            device: str = "cpu", quick: bool = False, skip_sequential: bool = False, progress=print,
            skip_canaries: bool = False) -> dict:
    started = time.perf_counter()
    result: dict = {"machine": machine(), "device": device, "quick": quick, "idle_before": idle_check(),
                    "targets": TARGETS, "cnn_targets_34": CNN_TARGETS, "workloads": {}}
    rounds, runs = (3, 8) if quick else (10, 64)
    progress("roofline: matrix-multiply peak and memory bandwidth")
    peak = matmul_peak(device=device, repeats=3 if quick else 7)
    bandwidth = memory_bandwidth(device=device, repeats=3 if quick else 7)
    result["roofline"] = {"matmul_peak": peak, "bandwidth": bandwidth}
    for name in workloads:
        label = f"workload {1 + WORKLOADS.index(name)} ({name})"
        data = load_workload(name, device=device)
        progress(f"{label}: batched engine and per-client loop")
        repeats = 1 if quick else (5 if name == "mlp" else 3)
        engine = measure_engine(rounds=rounds, repeats=repeats, workload=data)
        entry: dict = {"description": data.description, "engine": engine,
                       "batched_updates_per_second": engine["batched"]["updates_per_second"],
                       "loop_updates_per_second": engine["loop"]["updates_per_second"],
                       "batched_vs_loop": engine["ratio"]}
        if skip_flower or device != "cpu":
            flower = {"error": "skipped (--skip-flower)" if skip_flower else "skipped (Flower runs on the CPU only here)"}
        else:
            progress(f"{label}: Flower simulation (run_simulation, start_simulation)")
            from flower_baseline import measure_flower

            flower = measure_flower(rounds=rounds, warmup_rounds=2, repeats=1 if quick else 3, workload=name)
        entry["flower"] = flower
        if "best_updates_per_second" in flower:
            best = flower["best_updates_per_second"]
            entry.update(flower_updates_per_second=best, flower_engine=flower["best_engine"],
                         flower_startup_seconds={e: flower[e].get("startup_seconds")
                                                 for e in ("run_simulation", "start_simulation")
                                                 if isinstance(flower.get(e), dict)},
                         batched_vs_flower=engine["batched"]["updates_per_second"] / best,
                         loop_vs_flower=engine["loop"]["updates_per_second"] / best)
        progress(f"{label}: FLOP count and roofline fraction")
        entry["roofline"] = workload_roofline(data, engine, peak["peak_flops"], bandwidth["bandwidth"])
        progress(f"{label}: {runs}-run membership experiment: together, one after another, one run")
        try:
            entry["membership"] = measure_membership_batching(runs, name, device, sequential=not skip_sequential)
        except ImportError as error:  # the audit's MNIST loader needs torchvision
            entry["membership"] = {"error": f"skipped ({error})"}
        result["workloads"][name] = entry
    progress("sigma calibration at 10^4 rounds vs opacus")
    try:
        result["calibration"] = calibration_time(repeats=2 if quick else 5)
    except ImportError as error:  # opacus or dp-accounting missing (a bare GPU machine)
        result["calibration"] = {"error": f"skipped ({error})"}
    if skip_canaries:
        result["canaries"] = {"error": "skipped (--skip-canaries)"}
    else:
        progress("canary clients at scale: the default DP-FedAvg run with 10^4 canary clients a round vs without")
        try:
            result["canaries"] = measure_canary_scale(repeats=1 if quick else 3, dense_rounds=2 if quick else 5,
                                                      device=device, progress=progress)
        except ImportError as error:  # the default audit's planning needs dp-accounting (a bare GPU machine)
            result["canaries"] = {"error": f"skipped ({error})"}
    if skip_memory:
        result["memory"] = {"error": "skipped (--skip-memory)"}
    else:
        progress("peak memory of the default dpfl-audit run")
        result["memory"] = peak_memory_default_run(extra_args=("--device", device) if device != "cpu" else ())
    progress("rerun of a finished smoke audit (read back from OUT/cache)")
    result["resume"] = measure_resume("smoke", reruns=2 if quick else 5)
    result["idle_after"] = idle_check()
    result["total_seconds"] = time.perf_counter() - started
    return result


def _cnn_targets(w: dict) -> str:
    """One line: the CNN workload against CNN_TARGETS (the 64-run ratio when it was measured)."""
    t, fraction = CNN_TARGETS, w["roofline"]["engines"]["batched"]["fraction_of_bound"]
    b = w.get("membership", {})
    runs = (f", 64 runs together {b['together_vs_one_run']:.1f}x one run (<= {t['together_vs_one_run']:g}x: "
            f"{_met(b['together_vs_one_run'], t['together_vs_one_run'], at_most=True)})" if b.get("runs") == 64 else "")
    return (f"  CNN targets: batched {100 * fraction:.1f}% of the roofline bound "
            f"(>= {100 * t['fraction_of_roofline']:.0f}%: "
            f"{_met(fraction, t['fraction_of_roofline'])}), batched/loop {w['batched_vs_loop']:.1f}x "
            f"(>= {t['batched_vs_loop']:g}x: {_met(w['batched_vs_loop'], t['batched_vs_loop'])}){runs}")


def _table(result: dict) -> str:
    m = result["machine"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']} "
             f"({m['torch_threads']} threads), python {m['python']}, device {result['device']}"
             + (" [--quick: not the benchmark's figures]" if result.get("quick") else "")]
    for when in ("idle_before", "idle_after"):
        check = result[when]
        lines.append(f"{when.replace('_', ' ')}: {'idle' if check['idle'] else 'NOT IDLE'} "
                     f"(busy {100 * check['busy_share']:.0f}% of the cores, load {check['load_1min']})")
    peak, bw = result["roofline"]["matmul_peak"], result["roofline"]["bandwidth"]
    lines.append(f"roofline: fp32 matmul peak P = {peak['peak_flops'] / 1e9:.1f} GFLOP/s (n = {peak['peak_size']}), "
                 f"memory bandwidth B = {bw['bandwidth'] / 1e9:.1f} GB/s ({bw['kernel']}, {bw['tensor_mib']} MiB), "
                 f"ridge P/B = {peak['peak_flops'] / bw['bandwidth']:.1f} FLOP/byte")
    for name, w in result["workloads"].items():
        lines.append(f"workload {WORKLOADS.index(name) + 1} ({name}): {w['description']}")
        engine = w["engine"]
        lines.append(f"  client updates/s (rounds only, median of {engine['repeats']}, {engine['rounds']} rounds):")
        lines.append(f"    batched engine  {w['batched_updates_per_second']:10.1f}   (test accuracy "
                     f"{engine['batched']['test_accuracy']:.3f})")
        lines.append(f"    per-client loop {w['loop_updates_per_second']:10.1f}   batched/loop {w['batched_vs_loop']:.1f}x "
                     f"(target >= {TARGETS['batched_vs_loop']:g}x: {_met(w['batched_vs_loop'], TARGETS['batched_vs_loop'])})")
        if "flower_updates_per_second" in w:
            startup = ", ".join(f"{k} {v:.1f} s" for k, v in w["flower_startup_seconds"].items() if v is not None)
            lines.append(f"    Flower ({w['flower_engine']}) {w['flower_updates_per_second']:8.1f}   batched/Flower "
                         f"{w['batched_vs_flower']:.1f}x (target >= {TARGETS['batched_vs_flower']:g}x: "
                         f"{_met(w['batched_vs_flower'], TARGETS['batched_vs_flower'])}), loop/Flower "
                         f"{w['loop_vs_flower']:.1f}x; start-up {startup}; test accuracy "
                         f"{w['flower'].get('final_test_accuracy', float('nan')):.3f}")
        else:
            lines.append(f"    Flower: {w['flower'].get('error')}")
        r = w["roofline"]
        lines.append(f"  roofline: {r['analytical']['per_example'] / 1e6:.3f} MFLOP per example and step (counted = "
                     f"analytical), {r['bytes']['bytes_per_example'] / 1e3:.1f} kB (model), I = "
                     f"{r['intensity_flops_per_byte']:.2f} FLOP/byte -> bound min(P, I*B) = {r['bound_flops'] / 1e9:.1f} "
                     f"GFLOP/s ({r['bound_by']}-bound)")
        for engine_name, e in r["engines"].items():
            target = ""
            if name == "cnn" and engine_name == "batched":
                target = (f" (target >= {100 * TARGETS['cnn_fraction_of_roofline']:.0f}%: "
                          f"{_met(e['fraction_of_bound'], TARGETS['cnn_fraction_of_roofline'])})")
            lines.append(f"    {engine_name:7s} {e['achieved_flops'] / 1e9:7.2f} GFLOP/s = {100 * e['fraction_of_bound']:5.1f}% "
                         f"of the roofline bound{target}, {100 * e['fraction_of_peak']:.1f}% of P")
        if name == "cnn" and "batched" in r["engines"]:
            lines.append(_cnn_targets(w))
        b = w["membership"]
        if "error" in b:
            lines.append(f"  membership experiment: {b['error']}")
            continue
        after = (f", one after another {b['one_after_another_seconds']:.1f} s (identical runs: {b['identical_runs']})"
                 if b["one_after_another_seconds"] is not None else "")
        bound = TARGETS['together_vs_one_run'][name]
        met = _met(b['together_vs_one_run'], bound, at_most=True) if b['runs'] == 64 else 'n/a: the target is for 64 runs'
        lines.append(f"  {b['runs']}-run membership experiment ({b['experiment']}): together {b['together_seconds']:.1f} s"
                     f"{after}, one run {b['one_run_seconds']:.2f} s -> together = {b['together_vs_one_run']:.1f}x one run "
                     f"(target <= {bound:g}x: {met})")
    c = result["calibration"]
    if "ours_seconds" in c:
        lines.append(f"sigma for eps={c['target_epsilon']:g} at {c['rounds']} rounds (q={c['sample_rate']:g}, "
                     f"delta={c['delta']:g}, improved RDP conversion): ours {c['ours_seconds']:.3f} s (sigma "
                     f"{c['ours_sigma']:.5f}, tolerance 1e-4 relative), opacus {c['opacus_seconds']:.3f} s "
                     f"(sigma {c['opacus_sigma']:.5f}, tolerance 0.01 absolute)")
    else:
        lines.append(f"calibration: {c.get('error')}")
    lines.extend(canary_lines(result["canaries"]) if "error" not in result["canaries"]
                 else [f"canary clients at scale: {result['canaries']['error']}"])
    mem = result["memory"]
    if "peak_mib" in mem:
        lines.append(f"default dpfl-audit run: peak {mem['peak_mib']:.0f} MiB (target <= {MEMORY_TARGET_MIB} MiB: "
                     f"{_met(mem['peak_mib'], MEMORY_TARGET_MIB, at_most=True)}), {mem['wall_seconds']:.0f} s (target <= "
                     f"{WALL_TARGET_SECONDS:g} s: {_met(mem['wall_seconds'], WALL_TARGET_SECONDS, at_most=True)})")
    else:
        lines.append(f"memory: {mem.get('error')}")
    lines.append(describe_resume(result["resume"]))
    lines.append(f"total {result['total_seconds']:.0f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document (progress goes to stderr)")
    parser.add_argument("--skip-flower", action="store_true", help="leave out Flower's simulation (about 3 min)")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the default run's peak memory (about 1 min)")
    parser.add_argument("--skip-canaries", action="store_true",
                        help="leave out the canary clients at scale (about 1.5 min)")
    parser.add_argument("--skip-sequential", action="store_true",
                        help="leave out the 64 runs one after another (about 1.5 min)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--device", default="cpu", help="where the engines train (cpu, cuda); Flower runs on the CPU only")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 3 rounds, 1 repeat, 8 membership runs (not the benchmark's figures)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    result = run_all(args.skip_flower, args.skip_memory, tuple(args.workloads), args.device, args.quick,
                     args.skip_sequential, progress=lambda text: print(text, file=sys.stderr, flush=True),
                     skip_canaries=args.skip_canaries)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else _table(result))


if __name__ == "__main__":
    main()
