"""How much a run's figures depend on the runs it trains with, on a device: every registered
defense, three runs of one experiment trained alone (one defense object each) and together (the
one object planning binds, their rounds joined in batched computations).

On the CPU the answer is exactly nothing — bit-identical models, equal claims and metrics
(``tests/defenses/test_defense_values.py``). On a GPU, batched kernels may reduce in another order
for another batch shape, so a run trained together can differ from the run alone in its last bits;
this script measures that spread instead of leaving it silent: per defense, the largest absolute
difference of a final parameter, of the test accuracy and of the claimed ε (which depends on the
run's data only, so it must be 0 everywhere).

    python benchmarks/company_spread.py --device cuda [--defenses nbafl fl-top-dp] [--out spread.json]

Runs on a digits MLP task of 8 Dirichlet clients, 3 rounds (about a minute on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import defenses.catalog  # noqa: E402,F401  (registers every defense)
from audit.core.datasets import load_dataset  # noqa: E402
from audit.core.errors import UserInputError  # noqa: E402
from audit.core.models import build_model  # noqa: E402
from audit.partitions import partition  # noqa: E402
from defenses.base import DEFENSES, Defense  # noqa: E402
from defenses.blocks.flat import ParamLayout  # noqa: E402
from defenses.federated.training_job import TrainingConfig, TrainingDiverged, TrainingJob  # noqa: E402
from defenses.run_batch import train_together  # noqa: E402


def task(device: str) -> TrainingJob:
    digits = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(digits.train))
    test, pool = order[:200], order[200:600]
    clients = partition(digits.train.labels[pool].numpy(), "dirichlet", 8, seed=3, alpha=2.0, min_client_size=5)
    return TrainingJob(lambda: build_model("mlp", (1, 8, 8), 10, {"hidden": [32]}), digits.train.features[pool].to(device),
                       digits.train.labels[pool].to(device), clients, digits.train.features[test].to(device),
                       digits.train.labels[test].to(device),
                       TrainingConfig(rounds=3, local_steps=1, batch_size=8, lr=0.1, client_rate=0.7), seed=11,
                       device=device)


def valid_job(cls: type[Defense], job: TrainingJob) -> TrainingJob | None:
    layout = ParamLayout.of(job.model_factory())
    for training in (job.training, replace(job.training, sampling="fixed", clients_per_round=4)):
        try:
            cls(None, layout).validate(training, len(job.clients))
            return replace(job, training=training)
        except UserInputError:
            continue
    return None


def spread(name: str, job: TrainingJob) -> dict:
    cls = DEFENSES.get(name)
    job = valid_job(cls, job)
    if job is None:
        return {"defense": name, "skipped": "no training settings of this task are valid"}
    layout = ParamLayout.of(job.model_factory())
    runs = [replace(job, seed=job.seed + 7 * k, clients=[c if i != k else c[: k + 1] for i, c in enumerate(job.clients)])
            for k in range(3)]
    started = time.perf_counter()
    alone = []
    for run in runs:
        try:
            alone.append(cls(None, layout).train(run))
        except TrainingDiverged as diverged:
            alone.append(diverged)
    together = train_together(cls(None, layout), runs)
    out = {"defense": name, "parameter": 0.0, "test_accuracy": 0.0, "claimed_epsilon": 0.0, "diverged": 0,
           "seconds": time.perf_counter() - started}
    for a, b in zip(alone, together):
        if isinstance(a, TrainingDiverged) or isinstance(b, TrainingDiverged):
            out["diverged"] += 1
            continue
        out["parameter"] = max(out["parameter"], max(float((a.final_params[n].double() - b.final_params[n].double()).abs().max())
                                                     for n in a.final_params))
        out["test_accuracy"] = max(out["test_accuracy"], abs(a.metrics[-1]["test_accuracy"] - b.metrics[-1]["test_accuracy"]))
        if a.claim.epsilon != b.claim.epsilon:
            out["claimed_epsilon"] = max(out["claimed_epsilon"], abs(a.claim.epsilon - b.claim.epsilon))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--defenses", nargs="*", default=None, help="registered names (default: all)")
    parser.add_argument("--out", default=None, help="also write the table as JSON here")
    args = parser.parse_args(argv)
    job = task(args.device)
    names = args.defenses or [n for n in DEFENSES.names() if not n.startswith("test-")]
    rows = []
    print(f"{'defense':<20} {'max |Δ parameter|':>18} {'max |Δ accuracy|':>17} {'max |Δ ε|':>10}  ({args.device})")
    for name in names:
        row = spread(name, job)
        rows.append(row)
        if "skipped" in row:
            print(f"{name:<20} skipped: {row['skipped']}")
        else:
            print(f"{name:<20} {row['parameter']:>18.3g} {row['test_accuracy']:>17.3g} {row['claimed_epsilon']:>10.3g}"
                  + (f"  ({row['diverged']} diverged)" if row["diverged"] else ""))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "torch": torch.__version__, "rows": rows}, indent=1))
    claims_differ = [r["defense"] for r in rows if r.get("claimed_epsilon")]
    if claims_differ:
        print(f"claims differ alone vs together: {', '.join(claims_differ)}")
    return 1 if claims_differ or (args.device == "cpu" and any(r.get("parameter") for r in rows)) else 0


if __name__ == "__main__":
    sys.exit(main())
