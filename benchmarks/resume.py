"""A rerun of a finished audit: how long ``dpfl-audit run`` takes when every stage is read back.

    python benchmarks/resume.py [--preset smoke] [--reruns 3]

Runs ``python -m audit run --preset PRESET --seed 0 --out DIR --quiet`` (the console script's
entry point) once into a fresh folder, then ``--reruns`` times on that finished folder, each in a
fresh process, and reports the wall time of the first run and the median of the reruns beside the
interpreter's start-up — the median of ``python -m audit --version`` (Python, the CLI module and
its argument parser: what every command pays before it does anything). The target is a rerun
within 5 s of that start-up. It also checks what a rerun must not change: results.csv,
results.json and report.html byte for byte and with their time stamps, and that the manifest
lists nothing as computed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: a rerun of a finished audit: at most this many seconds more than the interpreter's start-up
TARGET_SECONDS_OVER_STARTUP = 5.0
COMPARED = ("results.csv", "results.json", "report.html")


def _timed(arguments: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "audit", *arguments], cwd=REPO_ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"`dpfl-audit {' '.join(arguments)}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds


def _state(out: Path) -> dict[str, tuple[int, bytes]]:
    return {name: ((out / name).stat().st_mtime_ns, (out / name).read_bytes()) for name in COMPARED}


def measure_resume(preset: str = "smoke", reruns: int = 3, startups: int = 5) -> dict:
    """First run, reruns on the finished folder and the start-up, in seconds (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="dpfl-audit-resume-") as folder:
        out = Path(folder) / "out"
        command = ["run", "--preset", preset, "--seed", "0", "--out", str(out), "--quiet"]
        first = _timed(command)
        state = _state(out)
        times = [_timed(command) for _ in range(reruns)]
        unchanged = _state(out) == state
        manifest = json.loads((out / "manifest.json").read_text())
        computed = (manifest.get("cache") or {}).get("computed")
    startup = statistics.median(_timed(["--version"]) for _ in range(startups))
    rerun = statistics.median(times)
    return {"preset": preset, "first_run_seconds": first, "rerun_seconds": times, "rerun_median_seconds": rerun,
            "startup_seconds": startup, "rerun_over_startup_seconds": rerun - startup,
            "target_over_startup_seconds": TARGET_SECONDS_OVER_STARTUP,
            "met": rerun - startup <= TARGET_SECONDS_OVER_STARTUP,
            "outputs_unchanged": unchanged, "computed_on_rerun": computed}


def describe(result: dict) -> str:
    return (f"rerun of a finished {result['preset']} audit: median {result['rerun_median_seconds']:.2f} s of "
            f"{len(result['rerun_seconds'])} (first run {result['first_run_seconds']:.1f} s), start-up "
            f"(python -m audit --version) {result['startup_seconds']:.2f} s -> {result['rerun_over_startup_seconds']:.2f} s "
            f"over start-up (target <= {result['target_over_startup_seconds']:g} s: {'met' if result['met'] else 'MISSED'}); "
            f"outputs unchanged: {result['outputs_unchanged']}, computed on the rerun: {result['computed_on_rerun']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure_resume(args.preset, args.reruns)
    print(json.dumps(result, indent=2) if args.json else describe(result))


if __name__ == "__main__":
    main()
