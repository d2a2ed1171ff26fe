"""Does ``dpfl-audit check --baseline`` tolerate honest randomness?

Runs the smoke preset at ``--seeds`` seeds (the same code, only the seed differs) and checks the
no-regression rules of ``examples/policy.yaml`` between them — baseline one audit, new another —
with the real gate (:func:`reports.gate.evaluate_policy`). Two audits of the same code must fail
the check at most 5 % of the time (the family-wise level of its regression comparisons); the
same pairs with the new audit's DP-FedAvg stripped of its noise (its figures replaced by FedAvg's)
must fail it. Prints the rates over independent pairs (seeds 0–1, 2–3, …) and over every ordered
pair, and writes ``benchmarks/results/gate_false_alarms.json``. A small version runs in the test
suite (``tests/reports/test_gate_false_alarms.py``).

Run: ``python benchmarks/gate_false_alarms.py [--seeds 40]`` (about 30 s per seed on 2 cores).
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

from audit.validation import gate_false_alarms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="smoke audits (seeds 0 … N−1); N/2 independent pairs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gate_false_alarms.json")
    args = parser.parse_args(argv)
    started = time.time()
    rates = gate_false_alarms(args.seeds)
    rows = {"false alarms, independent pairs": rates.false_alarms,
            "false alarms, every ordered pair": rates.false_alarms_all_pairs,
            "detections (DP-FedAvg without noise), independent pairs": rates.detections}
    print(f"{rates.comparisons} interval comparisons per check (Holm at 5 %)")
    for name, tally in rows.items():
        print(f"{name:<58} {tally.hits:>5} of {tally.total:<5} {tally.rate:.3f}")
    print(f"({time.time() - started:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seeds": args.seeds, "comparisons_per_check": rates.comparisons,
                                    **{k: {"hits": t.hits, "of": t.total, "rate": t.rate} for k, t in rows.items()}},
                                   indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
