"""The hostile-input fuzz at length: ``tests/audit/test_fuzz_hostile.py`` with many more examples.

The test suite runs about 600 generated inputs (config files, ``--set``, ``--over``, numbers on
the command line, score files, policies, results.json documents) against what must hold whatever
the input: exit 0 or 2 (``check``: also 1), at most one line on stderr, no traceback, nothing
written outside ``--out``, nothing written on exit 2. This script runs the same module with
``--examples`` inputs per Hypothesis seed, for each of ``--seeds`` seeds, each in its own process,
and records per test how many examples passed, failed or were discarded, the failures' first
lines, the wall time and the peak memory. Writes ``benchmarks/results/fuzz-hostile.json``.

Run: ``python benchmarks/fuzz_hostile.py [--examples 2400] [--seeds 2]`` (about a minute per
1,000 examples on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "tests/audit/test_fuzz_hostile.py"
#: Hypothesis's statistics line for one test: "- 150 passing, 0 failing, and 7 invalid test cases"
COUNTS = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid test cases")
TEST = re.compile(r"^(tests/\S+::\w+):$")


def run_once(examples: int, seed: int) -> dict:
    """One pytest process over the fuzz module: per-test counts, failures, time and peak memory."""
    env = {**os.environ, "DPFL_FUZZ_EXAMPLES": str(examples)}
    started = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", MODULE, "-p", "no:cacheprovider",
                           f"--hypothesis-seed={seed}", "--hypothesis-show-statistics"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    tests: dict[str, dict[str, int]] = {}
    current = None
    for line in done.stdout.splitlines():
        match = TEST.match(line.strip())
        if match:
            current = match.group(1).split("::")[1]
            continue
        counts = COUNTS.search(line)
        if counts and current is not None:
            tally = tests.setdefault(current, {"passing": 0, "failing": 0, "invalid": 0})
            for key, value in zip(("passing", "failing", "invalid"), counts.groups()):
                tally[key] += int(value)
    failures = [line.strip()[:400] for line in done.stdout.splitlines() if line.startswith("E   ") and "Error" in line]
    return {"seed": seed, "exit_code": done.returncode, "wall_s": round(time.time() - started, 1),
            "peak_rss_mib": round(max(peak, before) / 1024), "tests": tests, "failures": failures[:20]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2400, help="generated inputs per seed, over all the tests")
    parser.add_argument("--seeds", type=int, default=2, help="Hypothesis seeds (0 … N−1), one process each")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz-hostile.json")
    args = parser.parse_args(argv)
    runs = []
    for seed in range(args.seeds):
        run = run_once(args.examples, seed)
        runs.append(run)
        passing = sum(t["passing"] for t in run["tests"].values())
        failing = sum(t["failing"] for t in run["tests"].values())
        print(f"seed {seed}: {passing} inputs held the contract, {failing} broke it (pytest exit {run['exit_code']}), "
              f"{run['wall_s']:.0f} s, peak {run['peak_rss_mib']} MiB", flush=True)
        for line in run["failures"]:
            print(f"  {line}")
    total = sum(t["passing"] + t["failing"] for run in runs for t in run["tests"].values())
    broken = sum(t["failing"] for run in runs for t in run["tests"].values())
    print(f"{total} generated inputs, {broken} broke the contract")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"examples_per_seed": args.examples, "inputs": total, "broke_contract": broken,
                                    "runs": runs}, indent=2), encoding="utf-8")
    return 0 if broken == 0 and all(run["exit_code"] == 0 for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
