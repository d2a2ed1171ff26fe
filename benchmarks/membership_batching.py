"""Wall time of a 64-run membership experiment: runs trained together vs one after another.

Two experiments (``--workload``):

* ``mlp`` — the default audit's DP-FedAvg one (digits, 20 clients, MLP 64→128→10, 60 rounds
  of 3 local epochs of batch 10, ε = 8, membership by whole clients) with 64 reference runs
  instead of 16;
* ``cnn`` — the same audit on the CNN workload's data and model: MNIST's test split (a pool of
  800 records in 20 clients of 40, 200 test records), the sigmoid ``lenet``, batch 16, one local
  epoch, 5 rounds (every other setting as the default audit: DP-FedAvg ε = 8, momentum 0.9,
  evaluation every round, whole clients in or out).

Three timings, each training into a fresh run store (writing the runs is
part of the cost, as in an audit):

* together — the 64 runs as one group (:func:`defenses.run_batch.train_together`: round t of
  all runs is one batched computation);
* one after another — the same 64 runs, each trained alone;
* one run alone — the cost unit the target (64 runs together ≤ 16× one run for ``mlp``,
  ≤ 24× for ``cnn``) is stated in.

Every side first trains one warm-up run (torch's first-use costs). The two 64-run sides give
bit-identical runs (checked here on the final models, as tests/defenses/federated/test_run_batch.py does).

    python benchmarks/membership_batching.py [--workload mlp|cnn] [--runs 64] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

import torch  # noqa: E402
from workloads import MNIST_ROOT  # noqa: E402

from audit.config import AuditConfig, DatasetConfig, DefenseEntry, ModelConfig  # noqa: E402
from audit.planning import Plan, plan_audit  # noqa: E402
from audit.run_training import train_membership_runs  # noqa: E402
from audit.store import RunStore, run_id  # noqa: E402

#: 64 runs together <= 16x one run for the MLP experiment, <= 24x for the CNN one
TARGETS = {"mlp": 16.0, "cnn": 24.0}


def experiment_plan(runs: int, workload: str = "mlp", device: str = "cpu") -> Plan:
    """The default audit reduced to its DP-FedAvg ε = 8 experiment, with ``runs`` membership runs
    (``cnn``: on MNIST with the LeNet, see the module's docstring)."""
    config = AuditConfig()
    config = replace(config, defenses=[DefenseEntry(name="dp-fedavg", epsilons=[8.0])],
                     membership=replace(config.membership, runs=runs), device=device)
    if workload == "cnn":
        config = replace(config, dataset=DatasetConfig(name="mnist", root=str(MNIST_ROOT), options={"download": False},
                                                       max_pool=800, max_test=200),
                         model=ModelConfig(name="lenet", options={}),
                         training=replace(config.training, rounds=5, local_steps=1, batch_size=16))
    elif workload != "mlp":
        raise ValueError(f"unknown workload {workload!r}")
    return plan_audit(config)


def _timed(plan: Plan, groups: list[list[int]]) -> tuple[float, RunStore, tempfile.TemporaryDirectory]:
    directory = tempfile.TemporaryDirectory(prefix="dpfl-bench-")
    store = RunStore(directory.name)
    experiment = plan.experiments[0]
    started = time.perf_counter()
    for group in groups:
        train_membership_runs(plan, store, experiment, group)
    return time.perf_counter() - started, store, directory


def measure_membership_batching(runs: int = 64, workload: str = "mlp", device: str = "cpu",
                                sequential: bool = True) -> dict:
    """Seconds for ``runs`` runs together, one after another (unless ``sequential`` is false), and one run alone."""
    plan = experiment_plan(runs, workload, device)
    experiment = plan.experiments[0]
    _timed(plan, [[runs - 1]])[2].cleanup()  # warm-up
    alone, _, directory = _timed(plan, [[0]])
    directory.cleanup()
    together, joint_store, joint_dir = _timed(plan, [list(range(runs))])
    one_after_another, identical = None, None
    if sequential:
        one_after_another, seq_store, seq_dir = _timed(plan, [[r] for r in range(runs)])
        identical = all(
            all(torch.equal(a, b) for a, b in zip(joint_store.load_params(rid).values(),
                                                   seq_store.load_params(rid).values()))
            for rid in (run_id(plan, experiment, r) for r in range(runs)))
        seq_dir.cleanup()
    joint_dir.cleanup()
    return {
        "workload": workload,
        "experiment": f"default audit's dp-fedavg eps=8 experiment with {runs} runs "
                      f"({plan.config.dataset.name}, {plan.config.model.name}, {plan.config.training.rounds} rounds, "
                      f"{plan.config.partition.clients} clients)",
        "runs": runs,
        "device": device,
        "together_seconds": together,
        "one_after_another_seconds": one_after_another,
        "one_run_seconds": alone,
        "together_vs_one_run": together / alone,
        "speedup_vs_one_after_another": None if one_after_another is None else one_after_another / together,
        "target_together_vs_one_run": TARGETS[workload],
        "met": together / alone <= TARGETS[workload],
        "identical_runs": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-sequential", action="store_true", help="leave out the runs one after another")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure_membership_batching(args.runs, args.workload, args.device, not args.skip_sequential)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(result["experiment"])
    print(f"together          : {result['together_seconds']:8.1f} s")
    if result["one_after_another_seconds"] is not None:
        print(f"one after another : {result['one_after_another_seconds']:8.1f} s")
    print(f"one run alone     : {result['one_run_seconds']:8.1f} s")
    print(f"together / one run: {result['together_vs_one_run']:.2f}x (target <= {result['target_together_vs_one_run']:g}x); "
          f"runs identical: {result['identical_runs']}")


if __name__ == "__main__":
    main()
