"""Wall time of a 64-run membership experiment: runs trained together vs one after another.

The experiment is the default audit's DP-FedAvg one (digits, 20 clients, MLP 64→128→10,
60 rounds of 3 local epochs, ε = 8, membership by whole clients) with 64 reference runs
instead of 16. Three timings, each training into a fresh run store (writing the runs is
part of the cost, as in an audit):

* together — the 64 runs as one group (:func:`defenses.run_batch.train_together`: round t of
  all runs is one batched computation);
* one after another — the same 64 runs, each trained alone;
* one run alone — the cost unit the target (64 runs together ≤ 8× one run) is stated in.

Every side first trains one warm-up run (torch's first-use costs). The two 64-run sides give
bit-identical runs (checked here on the final models, as tests/defenses/test_run_batch.py does).

    python benchmarks/membership_batching.py [--runs 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace

import torch

from audit.config import AuditConfig, DefenseEntry
from audit.planning import Plan, plan_audit, run_id
from audit.store import RunStore
from audit.training import train_membership_runs


def experiment_plan(runs: int) -> Plan:
    """The default audit reduced to its DP-FedAvg ε = 8 experiment, with ``runs`` membership runs."""
    config = AuditConfig()
    config = replace(config, defenses=[DefenseEntry(name="dp-fedavg", epsilons=[8.0])],
                     membership=replace(config.membership, runs=runs))
    return plan_audit(config)


def _timed(plan: Plan, groups: list[list[int]]) -> tuple[float, RunStore, tempfile.TemporaryDirectory]:
    directory = tempfile.TemporaryDirectory(prefix="dpfl-bench-")
    store = RunStore(directory.name)
    experiment = plan.experiments[0]
    started = time.perf_counter()
    for group in groups:
        train_membership_runs(plan, store, experiment, group)
    return time.perf_counter() - started, store, directory


def measure_membership_batching(runs: int = 64) -> dict:
    """Seconds for ``runs`` runs together, one after another, and one run alone."""
    plan = experiment_plan(runs)
    experiment = plan.experiments[0]
    _timed(plan, [[runs - 1]])[2].cleanup()  # warm-up
    alone, _, directory = _timed(plan, [[0]])
    directory.cleanup()
    together, joint_store, joint_dir = _timed(plan, [list(range(runs))])
    sequential, seq_store, seq_dir = _timed(plan, [[r] for r in range(runs)])
    identical = all(
        all(torch.equal(a, b) for a, b in zip(joint_store.load_params(rid).values(), seq_store.load_params(rid).values()))
        for rid in (run_id(plan, experiment, r) for r in range(runs)))
    joint_dir.cleanup()
    seq_dir.cleanup()
    return {
        "experiment": f"default audit's dp-fedavg eps=8 experiment with {runs} runs "
                      f"({plan.config.training.rounds} rounds, {plan.config.partition.clients} clients)",
        "runs": runs,
        "together_seconds": together,
        "one_after_another_seconds": sequential,
        "one_run_seconds": alone,
        "together_vs_one_run": together / alone,
        "speedup_vs_one_after_another": sequential / together,
        "target_together_vs_one_run": 8.0,
        "identical_runs": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure_membership_batching(args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(result["experiment"])
    print(f"together          : {result['together_seconds']:8.1f} s")
    print(f"one after another : {result['one_after_another_seconds']:8.1f} s")
    print(f"one run alone     : {result['one_run_seconds']:8.1f} s")
    print(f"together / one run: {result['together_vs_one_run']:.2f}x (target <= 8x); "
          f"runs identical: {result['identical_runs']}")


if __name__ == "__main__":
    main()
