"""The public API in under 30 lines: load a task, train two defenses, attack them, print the table.

Run: python examples/api_minimal.py [OUT_DIR]   (the smoke preset, two attacks; rerunning resumes)
"""

import sys

import audit

# the smoke preset: digits, 5 clients, FedAvg and DP-FedAvg at ε = 8, 8 membership runs; two attacks
config = audit.load_config(preset_name="smoke", overrides={"attacks": [{"name": "lira"}, {"name": "loss-threshold"}]})
plan = audit.plan(config)  # every check first: nothing is written before this returns
attacked = audit.attack(plan, sys.argv[1] if len(sys.argv) > 1 else "api-out")  # trains the runs, then attacks

print(f"{'configuration':<18} {'claimed ε':>9}  {'attack':<14} {'AUC':>6}  {'95 % interval':<16}")
for experiment in plan.experiments:
    claimed = experiment.claim.epsilon
    for result in attacked.results[experiment.key]:
        auc = result.metrics["auc"]
        print(f"{experiment.label:<18} {claimed:>9.3g}  {result.name:<14} {auc.value:>6.3f}  "
              f"[{auc.low:.3f}, {auc.high:.3f}]")
