"""Validity on nulls: do the one-run ε lower bounds invent leakage where there is none?

An auditor must show, on inputs whose truth is known, that it does not report leakage the
mechanism does not have. The failure is not hypothetical: a well-known empirical-ε estimator
returned ε ≈ 3.5 on pure null scores because it took the distance between the two score
distributions through an ``abs(μ)`` shortcut, so the noise of a shift of zero became a "leak".
This benchmark replicates audits whose truth is known and counts how often each method claims
more than the truth allows.

The methods, each through the functions the command line uses (no bound is re-implemented here):

- ``epsilon_one_run``: the one-run count bound of Steinke, Nasr & Jagielski (2023), "Privacy
  Auditing with One (1) Training Run" (:func:`attacks.membership_metrics.one_run_bounds`);
- ``epsilon_one_run_fdp``: the f-DP analysis of the same counts against the claim's (ε, δ) curve,
  Mahloujifar, Melis & Chaudhuri (2024), "Auditing f-Differential Privacy in One Run" (same call);
- ``own_curve``: the same counts against the accounted mechanism's own trade-off curve (Dong, Roth
  & Su 2022), held to that mechanism's exact ε, as
  :func:`attacks.canaries.mechanism_curve.mechanism_curve_result` does
  (:func:`audit.core.mechanism_tradeoff.mechanism_one_run_audit`, ``composed_epsilon``).

Each figure is decided by the report's verdict code (:func:`reports.soundness.attack_verdicts`
then :func:`reports.soundness.family_verdicts`) as a family of one, so every rate is per method.
A claim of ε at δ names the single Gaussian release tight at (ε, δ): multiplier σ = 1/μ with μ =
:func:`audit.core.audit_power.gdp_mu` (ε, δ), sensitivity 1, rate 1, one step.

Scenarios, per claimed ε, with fresh fair coins and fresh scores in every replicate:

(a) ``null``: scores independent of the coins (standard normal). Truth ε = 0: ε_LB > 0 must
    happen at most at the bound's level α (one-sided, confidence 1 − α), and a VIOLATION at most
    at the verdict's level.
(b) ``tight``: the optimal attack on a mechanism exactly as private as claimed
    (:func:`audit.core.audit_power.tight_scores`: shift μ, i.e. score = coin/σ + N(0, 1), which is
    also exactly the claimed Gaussian mechanism of the own-curve method). A VIOLATION is false:
    target rate ≤ 5 %, its 95 % Clopper–Pearson upper end ≤ 6.5 %.
(c) ``conservative``: the scores of (b), the claim 2ε (for the own curve: the Gaussian release
    tight at 2ε, i.e. less noise claimed than released). A VIOLATION is false.

Run: ``python benchmarks/null_validity.py [--replicates 1000 400] [--coins 10000] [--seed 0]
[--scenarios null tight conservative] [--out FILE]`` (``--replicates``: one count per claimed ε, or
one for all; ``--scenarios tight`` with many coins measures how far each bound reaches). Prints the table and writes
``benchmarks/results/null-validity.json`` (no timings: the same command gives the same file).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attacks.membership_metrics import one_run_bounds
from audit.core.audit_power import gdp_mu, tight_scores
from audit.core.empirical_epsilon import OneRunAudit
from audit.core.mechanism_tradeoff import composed_epsilon, mechanism_one_run_audit
from audit.core.metrics import clopper_pearson
from audit.core.vocabulary import EpsilonKind, Relation, Unit, VerdictStatus
from defenses.privacy.claims import PrivacyClaim
from reports.document import Estimate
from reports.soundness import FAMILY_ALPHA, attack_verdicts, family_verdicts

RESULTS = Path(__file__).resolve().parent / "results" / "null-validity.json"
DELTA = 1e-5
EPSILONS = (1.0, 4.0)
#: the figure of one_run_bounds whose counts the own-curve test reads (as mechanism_curve_result)
FDP_FIGURE = "epsilon_one_run_fdp"
METHODS = ("epsilon_one_run", FDP_FIGURE, "own_curve")
SCENARIOS = ("null", "tight", "conservative")
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: targets at a tight or conservative claim: the false-VIOLATION rate and its interval's upper end
TARGET_RATE, TARGET_UPPER = 0.05, 0.065


@dataclass(frozen=True)
class Outcome:
    """One method's figure in one audit: its ε_LB, the ε it is held to, and whether the verdict
    code calls that a VIOLATION."""

    epsilon: float
    held_to: float
    violation: bool
    alpha: float


def gaussian_multiplier(epsilon: float, delta: float = DELTA) -> float:
    """σ of the single Gaussian release (sensitivity 1) that is exactly (ε, δ)-DP."""
    return 1.0 / gdp_mu(epsilon, delta)


def violates(claim: PrivacyClaim, figure: str, audit: OneRunAudit) -> bool:
    """The verdict code's decision on one figure alone (a family of one): VIOLATION or not."""
    family = attack_verdicts(claim, Unit.CLIENT, {figure: Estimate(audit.epsilon, audit.epsilon, None)},
                             {figure: EpsilonKind.LOWER_BOUND}, Relation.ADD_REMOVE, {figure: audit})
    return family_verdicts(family)[0].status == VerdictStatus.VIOLATION


def judge(bounds: dict[str, OneRunAudit], epsilon: float, delta: float = DELTA) -> dict[str, Outcome]:
    """Every method's outcome against a claim of ``epsilon`` at ``delta``: the (ε, δ)-curve figures
    of ``bounds`` (:func:`one_run_bounds`) held to the claim, and the f-DP figure's counts against
    the Gaussian release tight at the claim, held to that mechanism's exact ε (PLD)."""
    claim = PrivacyClaim(epsilon, delta, Unit.CLIENT, "simulated", relation=Relation.ADD_REMOVE)
    out = {figure: Outcome(audit.epsilon, epsilon, violates(claim, figure, audit), audit.alpha)
           for figure, audit in bounds.items()}
    counted, sigma = bounds[FDP_FIGURE], gaussian_multiplier(epsilon, delta)
    exact = composed_epsilon("gaussian", sigma, 1.0, 1, counted.delta)
    own = mechanism_one_run_audit(counted.canaries, counted.tried, "gaussian", sigma, 1.0, 1, counted.delta,
                                  counted.alpha, counted.fractions)
    out["own_curve"] = Outcome(own.epsilon, exact, violates(replace(claim, epsilon=exact), FDP_FIGURE, own), own.alpha)
    return out


def replicate(rng: np.random.Generator, coins: int, epsilon: float, delta: float = DELTA,
              scenarios: tuple[str, ...] = SCENARIOS, shift: float = 1.0) -> dict[str, dict[str, Outcome]]:
    """One replicate of each scenario at the claim ``epsilon``: fresh fair coins, fresh null
    scores and fresh scores of the Gaussian mechanism with ``shift`` × the claim's μ (1: exactly
    tight; 2: a mechanism with half the claimed noise, which every sound method may flag)."""
    inserted = rng.random(coins) < 0.5
    out: dict[str, dict[str, Outcome]] = {}
    if "null" in scenarios:
        out["null"] = judge(one_run_bounds(rng.standard_normal(coins), inserted, delta), epsilon, delta)
    if "tight" in scenarios or "conservative" in scenarios:
        scores = tight_scores(rng, inserted, epsilon, delta) if shift == 1.0 else \
            shift * gdp_mu(epsilon, delta) * inserted + rng.standard_normal(coins)
        bounds = one_run_bounds(scores, inserted, delta)
        if "tight" in scenarios:
            out["tight"] = judge(bounds, epsilon, delta)
        if "conservative" in scenarios:
            out["conservative"] = judge(bounds, 2.0 * epsilon, delta)
    return out


@dataclass
class Cell:
    """One method × scenario × claimed ε over the replicates."""

    positives: int = 0  # ε_LB > 0
    violations: int = 0
    ratios: list[float] = field(default_factory=list)  # ε_LB / the ε it is held to
    alpha: float = math.nan
    held_to: float = math.nan

    def add(self, outcome: Outcome) -> None:
        self.positives += int(outcome.epsilon > 0.0)
        self.violations += int(outcome.violation)
        self.ratios.append(outcome.epsilon / outcome.held_to)
        self.alpha, self.held_to = outcome.alpha, outcome.held_to

    def summary(self) -> dict[str, Any]:
        n = len(self.ratios)
        quantiles = np.quantile(np.asarray(self.ratios), QUANTILES) if n else [math.nan] * len(QUANTILES)
        return {"replicates": n, "held_to": self.held_to, "alpha": self.alpha,
                "positive": self.positives, "positive_rate": self.positives / n if n else math.nan,
                "positive_ci95": list(clopper_pearson(self.positives, n)),
                "violation": self.violations, "violation_rate": self.violations / n if n else math.nan,
                "violation_ci95": list(clopper_pearson(self.violations, n)),
                "ratio_quantiles": {f"{q:g}": float(v) for q, v in zip(QUANTILES, quantiles)}}


def run(epsilons: tuple[float, ...], replicates: tuple[int, ...], coins: int, seed: int,
        delta: float = DELTA, progress: bool = True, scenarios: tuple[str, ...] = SCENARIOS) -> dict[str, Any]:
    """The benchmark: per claimed ε (its own generator, spawned from ``seed``), its replicates of
    every scenario, tallied per method."""
    cells: dict[tuple[float, str, str], Cell] = {}
    streams = np.random.SeedSequence(seed).spawn(len(epsilons))
    for epsilon, count, stream in zip(epsilons, replicates, streams):
        rng = np.random.default_rng(stream)
        start = time.perf_counter()
        for r in range(count):
            for scenario, outcomes in replicate(rng, coins, epsilon, delta, scenarios).items():
                for method, outcome in outcomes.items():
                    cells.setdefault((epsilon, scenario, method), Cell()).add(outcome)
            if progress and (r + 1) % 100 == 0:
                print(f"  ε = {epsilon:g}: {r + 1}/{count} replicates, {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for (epsilon, scenario, method), cell in sorted(cells.items(), key=lambda kv: (
            METHODS.index(kv[0][2]), SCENARIOS.index(kv[0][1]), kv[0][0])):
        row = {"method": method, "scenario": scenario, "epsilon": epsilon,
               "claimed": 2.0 * epsilon if scenario == "conservative" else epsilon, **cell.summary()}
        row["within_target"] = meets_target(row)
        rows.append(row)
    return {"design": {"coins": coins, "delta": delta, "seed": seed, "epsilons": list(epsilons), "scenarios": list(scenarios),
                       "replicates": list(replicates), "verdict_alpha": FAMILY_ALPHA,
                       "mechanism": "single Gaussian release, sensitivity 1, rate 1, 1 step, σ = 1/gdp_mu(ε, δ)",
                       "target": {"false_violation_rate": TARGET_RATE, "ci_upper": TARGET_UPPER,
                                  "null_positive": "Clopper–Pearson 95 % lower end ≤ α"}},
            "rows": rows}


def meets_target(row: dict[str, Any]) -> bool:
    """Null: neither ε_LB > 0 nor VIOLATION significantly above its level (95 % interval's lower
    end ≤ α); tight or conservative: false-VIOLATION rate ≤ 5 % with its upper end ≤ 6.5 %."""
    if row["scenario"] == "null":
        return row["positive_ci95"][0] <= row["alpha"] and row["violation_ci95"][0] <= FAMILY_ALPHA
    return row["violation_rate"] <= TARGET_RATE and row["violation_ci95"][1] <= TARGET_UPPER


def table(result: dict[str, Any]) -> str:
    design = result["design"]
    lines = [f"m = {design['coins']} coins, δ = {design['delta']:g}, seed {design['seed']}, verdict level "
             f"{design['verdict_alpha']:g}; ratio = ε_LB / the ε each figure is held to",
             f"{'method':<20} {'scenario':<12} {'ε':>4} {'held to':>7} {'n':>5} {'α':>5} "
             f"{'ε_LB>0 rate [95 %]':>22} {'VIOLATION rate [95 %]':>22}  "
             f"{'ratio q5 / q25 / q50 / q75 / q95':<34} ok"]
    for row in result["rows"]:
        pos_low, pos_high = row["positive_ci95"]
        vio_low, vio_high = row["violation_ci95"]
        quantiles = " / ".join(f"{v:.3f}" for v in row["ratio_quantiles"].values())
        lines.append(f"{row['method']:<20} {row['scenario']:<12} {row['epsilon']:>4g} {row['held_to']:>7.4g} "
                     f"{row['replicates']:>5} {row['alpha']:>5g} "
                     f"{row['positive_rate']:>6.3f} [{pos_low:.3f}, {pos_high:.3f}]    "
                     f"{row['violation_rate']:>6.3f} [{vio_low:.3f}, {vio_high:.3f}]  "
                     f"{quantiles:<34} {'yes' if row['within_target'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, nargs="+", default=[1000, 400],
                        help="replicates per claimed ε, one count per --epsilons entry (one count: all)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--coins", type=int, default=10_000, help="fair coins (canaries) per audit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="which scenarios to run (e.g. only 'tight': how far each bound reaches)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    replicates = args.replicates * len(args.epsilons) if len(args.replicates) == 1 else args.replicates
    if len(replicates) != len(args.epsilons):
        parser.error("--replicates takes one count, or one per --epsilons entry")
    start = time.perf_counter()
    result = run(tuple(args.epsilons), tuple(replicates), args.coins, args.seed, scenarios=tuple(args.scenarios))
    finish(result, table(result), args.out, start)
    return result


def finish(result: dict[str, Any], text: str, out: Path, started: float) -> None:
    """Print a validation benchmark's table and its time, and write its result (no timings in it)."""
    print(text)
    print(f"{time.perf_counter() - started:.0f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
