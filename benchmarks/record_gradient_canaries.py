"""What do record-level gradient canaries certify of UDP-FL's three mechanisms, and what do they catch?

Every audit goes through the real command line — ``audit.cli.main(["run", design.yaml, "--out",
folder, "--quiet"])`` — with the ``record-gradient-canaries`` audit alone and no diagnostics, and
is read back from its ``results.json`` (``detection.run_audit``, this folder's). The audit (Nasr et
al. 2023, "Tight Auditing of Differentially Private Machine Learning", gradient canaries read at
every step; Steinke, Nasr, Jagielski 2023, one-run counts; Mahloujifar, Melis, Chaudhuri 2024, their
f-DP analysis) gives each client canary records whose per-example gradient is ±10·C on one
coordinate, clipped and noised by UDP-FL's own DP-SGD step (Feng et al. 2024, §3.2), and scores
each with the claimed mechanism's likelihood ratio over every step, participation hidden.

The design: digits, 10 IID clients, the MLP (9,610 parameters), 5 rounds of one local epoch of
Poisson batches at q = 0.05 (100 steps a client), C = 1; Gaussian noise under ℓ2 clipping, Laplace
and Staircase under ℓ1 clipping (the clip their sound accounting is tight for, and the Staircase's
only finite one); tight claims (each mechanism calibrated by the Harmonizer to the claimed ε);
10⁵ coins (``--coins``) in runs of 5,000 canaries a client.

Per cell (mechanism × variant × claimed ε, over ``--seeds``): the VIOLATION rate, and the median
and range of the best rigorous bound over the claim (ε_LB/ε); beside them the same for the test
against the accounted mechanism's own composed curve (Gaussian and Laplace: dp-accounting's PLD),
whose ratio is over that mechanism's exact ε* at the claim's δ. Variants: ``honest`` (UDP-FL as
registered) and ``half`` — a user's subclass whose objective draws the noise at half its scale
(Laplace scale or Gaussian σ halved; for the Staircase, its noise halved the same way) while the
claim keeps the calibrated mechanism.

Run: ``python benchmarks/record_gradient_canaries.py [--seeds 3] [--epsilons 1 4]
[--mechanisms gaussian laplace staircase] [--variants honest half] [--coins 100000]``. Prints the
table and writes ``benchmarks/results/record-gradient-canaries.json`` (no timings: the same
command gives the same file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

from detection import run_audit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "record-gradient-canaries.json"
CLIP_NORM = {"gaussian": "l2", "laplace": "l1", "staircase": "l1"}

#: a user's broken UDP-FL: the objective draws its noise at half the scale the claim accounts
HALF_NOISE = '''
from defenses.udp_fl import UDPFL, UDPFLObjective


class HalfNoiseObjective(UDPFLObjective):
    def noise(self, client, shapes, device):
        return {name: 0.5 * value for name, value in super().noise(client, shapes, device).items()}


class HalfNoiseUDPFL(UDPFL):
    name = "udp-fl-half-noise"

    def local_objective(self):
        return HalfNoiseObjective(self)
'''


def design(seed: int, mechanism: str, variant: str, epsilons: list[float], coins: int, plugin: Path) -> dict[str, Any]:
    name = "udp-fl" if variant == "honest" else f"{plugin}:HalfNoiseUDPFL"
    params = {"mechanism": mechanism, "clip_norm": CLIP_NORM[mechanism], "clip": 1.0, "sample_rate": 0.05}
    return {"name": f"record-gradient-canaries-{mechanism}-{variant}", "seed": seed,
            "dataset": {"name": "digits"}, "partition": {"name": "iid", "clients": 10},
            "training": {"rounds": 5, "local_unit": "epochs", "local_steps": 1, "lr": 0.05},
            "defenses": [{"name": name, "label": f"{mechanism}-{variant}", "epsilons": epsilons, "params": params}],
            "membership": {"runs": 2}, "diagnostics": {"enabled": False},
            "attacks": [{"name": "record-gradient-canaries", "params": {"coins": coins, "per_run": 50_000}}]}


def _best(attacks: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = [v for a in attacks for v in a.get("verdicts", [])]
    bounds = [v for v in verdicts if v.get("kind") == "lower_bound" and v.get("measured") is not None]
    best = max(bounds, key=lambda v: v["measured"], default=None)
    return {"violation": any(v["status"] == "violation" for v in bounds),
            "best_lower_bound": best["measured"] if best else None, "best_metric": best["metric"] if best else None,
            "claimed": best["claimed"] if best else None,
            "ratio": best["measured"] / best["claimed"] if best and best["claimed"] else None}


def figures(experiment: dict[str, Any]) -> dict[str, Any]:
    """The audit's rigorous bounds against the claim's (ε, δ) curve (the every-step result) and, where
    the mechanism has a PLD, against the accounted mechanism's own composed curve (held to its exact ε)."""
    attacks = experiment.get("attacks", [])
    curve = [a for a in attacks if str(a.get("attack", "")).endswith("mechanism-curve")]
    plain = [a for a in attacks if a not in curve]
    return {"epsilon": experiment.get("target_epsilon"), "status": experiment.get("status"), **_best(plain),
            "mechanism_curve": _best(curve) if curve else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--mechanisms", nargs="+", default=list(CLIP_NORM), choices=list(CLIP_NORM))
    parser.add_argument("--variants", nargs="+", default=["honest", "half"], choices=["honest", "half"])
    parser.add_argument("--coins", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="record-gradient-canaries-") as work:
        plugin = Path(work) / "half_noise.py"
        plugin.write_text(HALF_NOISE, encoding="utf-8")
        for mechanism in args.mechanisms:
            for variant in args.variants:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    config = design(seed, mechanism, variant, args.epsilons, args.coins, plugin)
                    results, error = run_audit(config, Path(work) / f"{mechanism}-{variant}-{seed}")
                    if results is None:
                        print(f"{mechanism} {variant} seed {seed}: {error}", file=sys.stderr)
                        continue
                    for experiment in results["experiments"]:
                        records.append({"mechanism": mechanism, "variant": variant, "seed": seed, **figures(experiment)})
                        print(json.dumps(records[-1]), flush=True)
    rows = []
    for mechanism in args.mechanisms:
        for variant in args.variants:
            for epsilon in args.epsilons:
                cell = [r for r in records if (r["mechanism"], r["variant"], r["epsilon"]) == (mechanism, variant, epsilon)]
                ratios = [r["ratio"] for r in cell if r["ratio"] is not None]
                curve = [r["mechanism_curve"] for r in cell if r.get("mechanism_curve")]
                rows.append({"mechanism": mechanism, "variant": variant, "epsilon": epsilon, "seeds": len(cell),
                             "violations": sum(r["violation"] for r in cell),
                             "curve_violations": sum(c["violation"] for c in curve) if curve else None,
                             "curve_median_ratio": statistics.median(c["ratio"] for c in curve) if curve else None,
                             "median_ratio": statistics.median(ratios) if ratios else None,
                             "min_ratio": min(ratios, default=None), "max_ratio": max(ratios, default=None)})
    print(f"{'mechanism':10} {'variant':7} {'ε':>4} {'VIOLATION':>10} {'median ε_LB/ε':>14} {'range':>14} "
          f"{'curve VIOLATION':>16} {'curve ε_LB/ε*':>14}")
    for row in rows:
        ratio = "-" if row["median_ratio"] is None else f"{row['median_ratio']:.3f}"
        spread = "-" if row["min_ratio"] is None else f"{row['min_ratio']:.2f}–{row['max_ratio']:.2f}"
        curve = "-" if row["curve_violations"] is None else f"{row['curve_violations']}/{row['seeds']}"
        curve_ratio = "-" if row["curve_median_ratio"] is None else f"{row['curve_median_ratio']:.3f}"
        print(f"{row['mechanism']:10} {row['variant']:7} {row['epsilon']:>4g} {row['violations']:>5}/{row['seeds']:<4} "
              f"{ratio:>14} {spread:>14} {curve:>16} {curve_ratio:>14}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"coins": args.coins, "rows": rows, "records": records}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
