"""Do the verdict statistics mean what they say? Coverage of the 95 % intervals and the false
VIOLATION rate, by simulation.

Three designs, each replicated many times with fresh seeds:

(a) **pipeline null** — the real training, attack and report code (``dpfl-audit run``) on a
    configuration where membership cannot leak: client-level DP-FedAvg at ε = 0.05, so the
    model is at chance and every run is as informative about a unit as any other; whole clients
    in and out (10 units: no TPR is estimable) and records in and out (400 units: TPR at 0.1 %
    and 1 % FPR are). True values:
    AUC 0.5, TPR = FPR at each operating point, ε = 0.
(b) **leaky designs with a known effect** — (b1) the same pipeline on non-private FedAvg whose
    clients overfit; the estimand of a fixed design (the expectation of the figure over training
    randomness and the unit population) is estimated by the mean over the replicates, and the
    table also gives the seed-to-seed SD beside the SE the intervals imply; (b2) membership
    scores of a crossed runs × units design with a run effect, a unit effect and a Gaussian shift
    μ for members, through the same metric code as the attacks
    (:func:`attacks.membership_metrics.membership_metrics`), where the truth is exact: with total score variance
    s² = σ²_run + σ²_unit + σ²_cell the AUC is Φ(μ/(s√2)) and TPR at FPR x is
    1 − Φ(Φ⁻¹(1 − x) − μ/s).
(c) **tight claim** — canary coins scored by the optimal attack on a mechanism exactly as
    private as the claim (the μ-GDP pair meeting (ε, δ), or ε-randomised response for δ = 0),
    several correlated ε figures per experiment, decided by the report's verdict code (Holm over
    the family): the rate of experiments with a VIOLATION must stay ≤ 5 %.

(e) **Gaussian fit** (Andrew et al. 2024) — canary statistics drawn exactly from the μ-GDP pair
    N(μ, 1) vs N(0, 1), each canary inserted by a fair coin: coverage of the pair's ε at δ = 1e-5
    by the fit's 95 % interval, at 100 and 1,000 canaries and μ ∈ {0.5, 1, 2}.
(f) **membership accuracy** — the accuracy at each target's threshold fitted on the other runs,
    on the crossed design of (b2) with 16 runs × 200 units: under the null its expectation is ½;
    with μ = 1 the design's expectation is estimated by the mean over the replicates.

Run: ``python benchmarks/coverage.py [--replicates 200] [--pipeline-replicates 200]``; prints a
table and writes ``benchmarks/results/coverage.json``. A small version runs in the test suite
(``tests/attacks/test_coverage.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from audit.validation import (  # noqa: E402
    accuracy_coverage,
    gaussian_fit_coverage,
    known_effect,
    pipeline_leaky,
    pipeline_null,
    tight_claim,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=200, help="replicates of the simulated designs (b) and (c)")
    parser.add_argument("--pipeline-replicates", type=int, default=200,
                        help="replicates of the pipeline designs (a) and (b1); 0 skips them")
    parser.add_argument("--fit-replicates", type=int, default=1000,
                        help="replicates of each Gaussian-fit design (e) (100 and 1,000 canaries × μ ∈ {0.5, "
                             "1, 2}); 0 skips them")
    parser.add_argument("--accuracy-replicates", type=int, default=200,
                        help="replicates of the accuracy designs (f) (null and μ = 1); 0 skips them")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "coverage.json")
    args = parser.parse_args(argv)
    started = time.time()
    report: dict[str, dict] = {}
    rows = []
    for label, tallies in ((("(b2) crossed design, μ = 0", known_effect(args.replicates, mu=0.0)),
                            ("(b2) crossed design, μ = 1", known_effect(args.replicates, mu=1.0))) if args.replicates else ()):
        for name, tally in tallies.items():
            rows.append((label, name, tally.hits, tally.total, tally.rate, ""))
    for epsilon, delta in ((1.0, 1e-5), (2.0, 0.0), (0.5, 0.0)) if args.replicates else ():
        rate, n = tight_claim(args.replicates, epsilon, delta)
        rows.append((f"(c) tight claim ε = {epsilon:g}, δ = {delta:g}", "experiments with a VIOLATION",
                     round(rate * n), n, rate, ""))
    for canaries in (100, 1000) if args.fit_replicates else ():
        for mu in (0.5, 1.0, 2.0):
            tally = gaussian_fit_coverage(args.fit_replicates, canaries, mu)
            rows.append((f"(e) Gaussian fit, {canaries} canaries, μ = {mu:g}", "ε interval covers the pair's ε",
                         tally.hits, tally.total, tally.rate, ""))
    for mu in (0.0, 1.0) if args.accuracy_replicates else ():
        tally, truth, sd, implied = accuracy_coverage(args.accuracy_replicates, mu)
        rows.append((f"(f) accuracy, 16 runs × 200 units, μ = {mu:g}", "interval covers " + ("½" if mu == 0 else "the mean"),
                     tally.hits, tally.total, tally.rate, f"mean {truth:.4f}, SD {sd:.4f} vs implied SE {implied:.4f}"))
    if args.pipeline_replicates:
        for unit in ("client", "record"):
            for name, tally in pipeline_null(args.pipeline_replicates, unit=unit).items():
                rows.append((f"(a) pipeline null, {unit}s (DP-FedAvg ε = 0.05)", name, tally.hits, tally.total, tally.rate, ""))
        for name, (tally, truth, sd, implied) in pipeline_leaky(args.pipeline_replicates).items():
            rows.append(("(b1) pipeline leaky (FedAvg)", name, tally.hits, tally.total, tally.rate,
                         f"mean {truth:.3f}, SD {sd:.3f} vs implied SE {implied:.3f}"))
    width = max(len(r[0]) for r in rows)
    print(f"{'design':<{width}}  {'figure':<40} {'hits':>6} {'of':>5}  rate")
    for label, name, hits, total, rate, note in rows:
        print(f"{label:<{width}}  {name:<40} {hits:>6} {total:>5}  {rate:.3f}  {note}")
        report.setdefault(label, {})[name] = {"hits": hits, "of": total, "rate": rate, **({"note": note} if note else {})}
    print(f"({time.time() - started:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
