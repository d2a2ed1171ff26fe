"""The canaries' path, probed: on the default audit's DP-FedAvg run, the noise a Dirac canary
statistic measures against the noise of the real aggregate, for DP-FedAvg and broken variants —
some whose bug lives in DP-FedAvg's hooks, some in a ``privatize`` rewritten with plain tensors
as a user writes it (``tests/defenses/broken_dp_fedavg.py``).

The run is the one the default ``dpfl-audit run`` trains for its ``dirac-canaries`` audit (built
by the audit's own functions, as ``benchmarks/canary_scale.py`` builds it): digits, the MLP
(d = 9,610), 20 clients, DP-FedAvg at the first claimed ε, one canary client per coordinate
(the audit's first run design: ±U raw on inserted canaries, 0 on held-out ones). Its first round
is run per seed with the canaries and without them; both start from the same model, so:

* **the real aggregate's noise** is the step without canaries less the real clients' noise-free
  share (``defenses.federated.dirac_passage.real_share``);
* **the canary statistic's noise** is the step with canaries, on the canaries' coordinates, less
  that share and the canaries' clipped signal (the step's change between the two runs, per
  class of canary);
* **canary-made noise** is what the canaries add to the step beyond their signal: the step with
  canaries less the step without them and the signal, its variance in units of the claimed
  mechanism's (σS/divisor)². Zero when canaries contribute no noise of their own code.

Per variant, over ``--seeds`` seeds: the std of each noise (×divisor/(σS): 1 for the claimed
mechanism), the ratio of each to DP-FedAvg's, their agreement (target: within 5 %) and the
canary-made share of the statistic's noise variance (target: 0).

    python benchmarks/canary_path.py [--seeds 5] [--out benchmarks/results/canary_path.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the audit package, and the broken variants under tests/
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from audit.canary_runs import dirac_rows  # noqa: E402
from audit.config import load_config  # noqa: E402
from audit.core.seeding import derive_seed  # noqa: E402
from audit.planning import canary_context, canary_relation, plan_audit  # noqa: E402
from audit.run_training import training_job  # noqa: E402
from defenses.federated.engine import FederatedEngine, initial_vector  # noqa: E402
from tests.defenses import broken_dp_fedavg as broken  # noqa: E402

VARIANTS = {
    "dp-fedavg": None,
    "halved-noise (hook)": broken.HalvedNoise,
    "noise-over-count (hook)": broken.NoiseOverCountNotItsRoot,
    "user-written (honest)": broken.UserWrittenHonest,
    "user-halved-noise": broken.UserHalvedNoise,
    "user-pairs-cancel": broken.UserNoiseCancelledInPairs,
    "user-uniform-noise": broken.UserUniformNoise,
}
TOLERANCE = 0.05


def setting():
    """The default audit's DP-FedAvg experiment, its first canary run's job (one round) and canaries."""
    plan = plan_audit(load_config())
    experiment = next(e for e in plan.experiments if e.defense.name == "dp-fedavg")
    audit = next(a for a in plan.canary_audits if a.name == "dirac-canaries")
    context = canary_context(plan, experiment)
    clients = plan.clients[plan.canary_base_run(0)]
    job = training_job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, 0))
    job = replace(job, training=replace(job.training, rounds=1))
    rows = dirac_rows(audit.injection(context, 0), canary_relation(experiment, audit), context.layout.dim, "cpu")
    return experiment, job, rows


def first_round(defense, job):
    """(step of round 1 as float64, its metrics row, the server view)."""
    outcome = FederatedEngine(defense, job).run()
    _, layout, start = initial_vector(job.model_factory, job.seed)
    return (layout.flatten(outcome.final_params) - start).double(), outcome.metrics[0], outcome.server_view


def measure(seeds: int) -> dict:
    experiment, job, rows = setting()
    params = experiment.defense.params
    scale = params.clip * params.noise_multiplier
    coords = rows.coords.numpy()
    out: dict = {"experiment": experiment.label, "dim": int(rows.dim), "canaries": len(rows), "seeds": seeds,
                 "noise_std_unit": "×divisor/(σS): 1 for the claimed mechanism", "variants": {}}
    for label, kind in VARIANTS.items():
        defense = experiment.defense if kind is None else kind(params).bind(experiment.defense.layout)
        real, canary, made = [], [], []
        for seed in range(seeds):
            seeded = replace(job, seed=derive_seed(job.seed, "canary-path", seed))
            free, _, _ = first_round(defense, seeded)
            with_canaries, row, view = first_round(defense, replace(seeded, dirac_canaries=rows))
            divisor = float(row["divisor"])
            drift = view["dirac/drift"][0].double().numpy() if "dirac/drift" in view else np.zeros(len(coords))
            change = (with_canaries - free).numpy()[coords]
            # the canaries' clipped signal: one value per class (tensor, raw value), read off the change
            values = rows.values.numpy()
            signal = np.zeros(len(coords))
            for value in np.unique(values[values != 0]):
                members = values == value
                signal[members] = np.median(change[members])
            real.append((free.numpy()[coords] - drift) * divisor / scale)
            canary.append((with_canaries.numpy()[coords] - drift - signal) * divisor / scale)
            made.append((change - signal) * divisor / scale)
        real_std, canary_std = float(np.std(np.concatenate(real))), float(np.std(np.concatenate(canary)))
        made_var = float(np.var(np.concatenate(made)))
        out["variants"][label] = {"real_aggregate_noise_std": real_std, "canary_statistic_noise_std": canary_std,
                                  "canary_made_noise_variance": made_var,
                                  "dirac_path": row.get("dirac_path")}
    honest = out["variants"]["dp-fedavg"]
    for entry in out["variants"].values():
        entry["real_ratio"] = entry["real_aggregate_noise_std"] / honest["real_aggregate_noise_std"]
        entry["canary_ratio"] = entry["canary_statistic_noise_std"] / honest["canary_statistic_noise_std"]
        entry["ratios_agree_within_5pct"] = abs(entry["canary_ratio"] - entry["real_ratio"]) <= \
            TOLERANCE * max(entry["real_ratio"], 1e-3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "canary_path.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = measure(args.seeds)
    print(f"{'variant':<26}{'real noise':>11}{'canary noise':>14}{'real ratio':>12}{'canary ratio':>14}"
          f"{'agree':>7}{'canary-made':>13}")
    for label, e in result["variants"].items():
        print(f"{label:<26}{e['real_aggregate_noise_std']:>11.4f}{e['canary_statistic_noise_std']:>14.4f}"
              f"{e['real_ratio']:>12.4f}{e['canary_ratio']:>14.4f}{'yes' if e['ratios_agree_within_5pct'] else 'NO':>7}"
              f"{e['canary_made_noise_variance']:>13.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
