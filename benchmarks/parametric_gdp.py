"""The gated parametric test of a Gaussian claim, validated by simulation before any verdict uses it.

:func:`audit.core.parametric_gdp.parametric_gdp_test` is exact when a Dirac canary's standardised
sum is Gaussian, which holds by construction for a Gaussian mechanism; its goodness-of-fit gate
must keep it silent when the noise has the claimed variance but another shape. This benchmark
measures, with fresh fair coins in every replicate:

* **false VIOLATION** at an exactly tight claim (scores shifted by μ_claim, noise of unit
  variance) and at a conservative one (the claim 2ε, so μ_claim is larger than the truth), for
  Gaussian, Laplace, Student-t (5 degrees of freedom, rescaled) and uniform noise: target ≤ α,
  the 95 % Clopper–Pearson upper end ≤ 6.5 %;
* **the gate**: how often it lets the test speak, per noise (uniform must be refused ≥ 9/10);
* **power**: half the claimed noise (the shift 2·μ_claim) with Gaussian noise;
* **reach**: ε of the lower confidence bound over the claimed ε at a tight claim.

μ_claim of a claim (ε, δ) is :func:`audit.core.audit_power.gdp_mu` (ε, δ): the single Gaussian
release tight at (ε, δ), as in ``null_validity.py``.

Run: ``python benchmarks/parametric_gdp.py [--replicates 1000] [--coins 10000] [--seed 0]``;
prints the table and writes ``benchmarks/results/parametric-gdp.json`` (no timings).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

from null_validity import TARGET_RATE, TARGET_UPPER, finish  # noqa: E402  # one false-VIOLATION target for both
from null_validity import meets_target as meets_false_violation_target  # noqa: E402

from audit.core.audit_power import gdp_mu  # noqa: E402
from audit.core.metrics import clopper_pearson  # noqa: E402
from audit.core.parametric_gdp import parametric_gdp_test  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "parametric-gdp.json"
DELTA = 1e-5
EPSILONS = (1.0, 4.0, 8.0)
NOISES = ("gaussian", "laplace", "student-t5", "uniform")
#: scenario → (the true shift over μ_claim, the claimed ε over the ε the scores are tight at)
SCENARIOS = {"tight": (1.0, 1.0), "conservative": (1.0, 2.0), "half noise": (2.0, 1.0)}
#: the test's level: an exact test rejects an exactly tight claim at its level, so a test at 5 %
#: would sit on the 5 % target with no margin; beside the rigorous bounds it takes half the
#: verdict's 5 % (as a weighted Holm family would give it), and is measured at that level
ALPHA = 0.025


def unit_noise(rng: np.random.Generator, kind: str, size: int) -> np.ndarray:
    """Noise of mean 0 and variance 1 of the named shape."""
    if kind == "gaussian":
        return rng.standard_normal(size)
    if kind == "laplace":
        return rng.laplace(0.0, 1.0 / math.sqrt(2.0), size)
    if kind == "student-t5":
        return rng.standard_t(5, size) / math.sqrt(5.0 / 3.0)
    if kind == "uniform":
        return rng.uniform(-math.sqrt(3.0), math.sqrt(3.0), size)
    raise ValueError(f"noise: {kind!r}; allowed: {', '.join(NOISES)}")


def one_audit(rng: np.random.Generator, coins: int, epsilon: float, noise: str, scenario: str, delta: float = DELTA):
    """One simulated audit: fair coins, scores = shift·inserted + noise, the test of the claim."""
    shift, claim_factor = SCENARIOS[scenario]
    inserted = rng.random(coins) < 0.5
    scores = shift * gdp_mu(epsilon, delta) * inserted + unit_noise(rng, noise, coins)
    return parametric_gdp_test(scores, inserted, gdp_mu(claim_factor * epsilon, delta), alpha=ALPHA)


def run(epsilons: tuple[float, ...], replicates: int, coins: int, seed: int, progress: bool = True) -> dict[str, Any]:
    """Every ε × noise × scenario cell (the power cell with Gaussian noise only), each with its
    own generator spawned from ``seed``."""
    cells = [(e, n, s) for e in epsilons for n in NOISES for s in SCENARIOS if s != "half noise" or n == "gaussian"]
    streams = np.random.SeedSequence(seed).spawn(len(cells))
    rows = []
    for (epsilon, noise, scenario), stream in zip(cells, streams):
        rng = np.random.default_rng(stream)
        start = time.perf_counter()
        tests = [one_audit(rng, coins, epsilon, noise, scenario) for _ in range(replicates)]
        claimed = SCENARIOS[scenario][1] * epsilon
        spoke = sum(t.applies for t in tests)
        violations = sum(t.violation for t in tests)
        reach = [t.epsilon_low(DELTA) / claimed for t in tests if t.applies]
        rows.append({"epsilon": epsilon, "claimed": claimed, "noise": noise, "scenario": scenario, "replicates": replicates,
                     "gate_passed": spoke, "gate_passed_rate": spoke / replicates,
                     "violation": violations, "violation_rate": violations / replicates,
                     "violation_ci95": list(clopper_pearson(violations, replicates)),
                     "median_epsilon_low_ratio": float(np.median(reach)) if reach else None})
        if progress:
            print(f"  ε = {epsilon:g} {noise:<10} {scenario:<12} {time.perf_counter() - start:.0f} s", flush=True)
    return {"design": {"coins": coins, "delta": DELTA, "seed": seed, "replicates": replicates, "alpha": ALPHA,
                       "gate_alpha": 0.01, "target": {"false_violation_rate": TARGET_RATE, "ci_upper": TARGET_UPPER}},
            "rows": rows}


def meets_target(row: dict[str, Any]) -> bool | None:
    """False-VIOLATION target for tight and conservative cells; None for the power cells."""
    return None if row["scenario"] == "half noise" else meets_false_violation_target(row)


def table(result: dict[str, Any]) -> str:
    design = result["design"]
    lines = [f"m = {design['coins']} coins, δ = {design['delta']:g}, {design['replicates']} replicates a cell, "
             f"α = {design['alpha']}, gate at {design['gate_alpha']}",
             "| ε | noise | scenario | gate passed | VIOLATION rate [95 %] | median ε_low/ε claimed | target |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        low, high = row["violation_ci95"]
        ratio = row["median_epsilon_low_ratio"]
        ok = meets_target(row)
        lines.append(f"| {row['epsilon']:g} | {row['noise']} | {row['scenario']} | {row['gate_passed_rate']:.3f} | "
                     f"{row['violation_rate']:.3f} [{low:.3f}, {high:.3f}] | {'—' if ratio is None else f'{ratio:.3f}'} | "
                     f"{'power' if ok is None else ('yes' if ok else 'NO')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--coins", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(tuple(args.epsilons), args.replicates, args.coins, args.seed)
    finish(result, table(result), args.out, start)
    return result


if __name__ == "__main__":
    main()
