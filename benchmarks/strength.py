"""How strong are our LiRA and RMIA? A strength check against the figures the papers' own code
prints.

Runs our registered attacks — ``lira`` (online and offline; the global "fixed" variance by
default, and per-example variance as a second entry), ``rmia`` (online and offline) and the
``loss-threshold`` baseline — through the real pipeline (:func:`audit.audit`, what ``dpfl-audit
run`` does: training, attacks, metrics with their two-way 95 % intervals, results files) on a
record-level membership design with the non-private ``fedavg`` defense and **one client**, i.e.
centralised training that overfits, so the setting resembles the papers': each model trains on
a random half of a pool, every record is in by a fair coin, every run is the target once with the
others as reference (shadow) models (leave-one-out, as LiRA's own evaluation).

Two settings:

* ``many`` — ``--runs`` runs (default 32: 31 reference models per target), the regime of
  LiRA's evaluation (its code's CIFAR-10 demo uses 16 models: 1 target, 15 references);
* ``few`` — ``--few-runs`` runs (default 4: 3 reference models per target, the fewest LiRA
  accepts), the low-cost regime in which RMIA claims to beat LiRA.

Data: the MNIST test split (its t10k IDX files in ``--data-root``): 2,000 records (20 % of each class) held
out, 1,000 of which measure test accuracy, and the other 8,000 as the pool; model: an MLP
784→256→10 trained 30 epochs with SGD (momentum 0.9, batch 32, no regularisation) to 100 %
training accuracy.
``--dataset digits`` uses scikit-learn's embedded digits instead (no files needed).

Beside them, the global threshold of the LiRA authors' code (a threshold on LiRA's logit-scaled
confidence φ; not a registered attack) is scored on the same stored runs with the same metric code:
it ranks records exactly as the loss threshold does (the loss is log(1 + e^{−φ})): the two rows
agree, a check on both.

Prints one table per setting — attack, AUC [95 % interval], TPR at 0.1 % and 1 % FPR, and the
target models' train/test accuracy — then the reference figures with their sources and whether
the orderings the papers report hold here; writes the JSON to ``benchmarks/results/strength.json``
(``--quick``: a tiny version for the tests, written only where ``--out`` says). Numbers and their
explanation: ``benchmarks/README.md``, section "Attack strength against the papers' figures".

Run: ``python benchmarks/strength.py [--runs 32] [--few-runs 4] [--quick] [--out FILE]``
(7¼ minutes on 2 cores with one torch thread; ``--quick`` about 15 s).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import audit  # noqa: E402
from audit import provenance  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "strength.json"
DEFAULT_MNIST = ROOT.parent / "shared" / "data" / "mnist"

#: the attacks measured, as config entries; the per-example entry is labelled so its results are
#: named ``lira-per-example-online`` / ``-offline``
ATTACKS = [
    {"name": "lira"},  # variance: global (the paper's fixed variance), variants online + offline
    {"name": "lira", "label": "lira-per-example", "params": {"variance": "per-example"}},
    {"name": "rmia"},  # a = 0.3, γ = 1, population: up to 10,000 non-members of the target
    {"name": "loss-threshold"},
]
METRICS = ("auc", "tpr_at_fpr_0.1%", "tpr_at_fpr_1%")
#: not a registered attack: the global threshold of the LiRA authors' code, a threshold on LiRA's
#: logit-scaled confidence φ — the same ranking as the loss threshold's −loss in exact arithmetic,
#: (the loss is log(1 + e^{−φ}); before it was computed through φ it saturated at 0 above ≈ 37 nats: see the README)
PHI_BASELINE = "global-threshold-phi"

#: Figures printed by the LiRA authors' own code (tensorflow/privacy, research/mi_lira_2021), read in
#: its README (it prints AUC and TPR at 0.1 % FPR only). Only figures read in a source go here.
LIRA_DEMO_URL = ("https://github.com/tensorflow/privacy/blob/158aba77116453bd23cf0808d4089ea898c017e9/"
                 "research/mi_lira_2021/README.md")
REFERENCES: list[dict[str, Any]] = [
    {"source": "LiRA authors' code (tensorflow/privacy research/mi_lira_2021), README, 'PLOTTING THE RESULTS'",
     "url": LIRA_DEMO_URL,
     "setting": ("CIFAR-10, 16 wide ResNets (wrn28-2, 100 epochs, '~91% accuracy'), each on a random half of the "
                 "50,000 training images; plot.py attacks the last model with the other 15 as references; "
                 "logit-scaled confidence, 2 queries (image and its mirror)"),
     "references_per_target": 15,
     "figures": [
         {"attack": "LiRA online (per-example variance)", "ours": "lira-per-example-online", "auc": 0.6676,
          "tpr_at_fpr_0.1%": 0.0169},
         {"attack": "LiRA online, fixed variance", "ours": "lira-online", "auc": 0.6856, "tpr_at_fpr_0.1%": 0.0593},
         {"attack": "LiRA offline (per-example variance)", "ours": "lira-per-example-offline", "auc": 0.5488,
          "tpr_at_fpr_0.1%": 0.0130},
         {"attack": "LiRA offline, fixed variance", "ours": "lira-offline", "auc": 0.5549, "tpr_at_fpr_0.1%": 0.0299},
         {"attack": "global threshold (logit-scaled confidence)", "ours": PHI_BASELINE, "auc": 0.5921, "tpr_at_fpr_0.1%": 0.0009},
     ]},
]


@dataclass(frozen=True)
class Setting:
    name: str
    runs: int
    what: str


def _sizes(quick: bool, dataset: str) -> dict[str, Any]:
    """Pool, test split, model and epochs of the design."""
    if quick:  # a few seconds of training; still ≥ 1,000 non-member scores per member
        return {"pool": 600, "test": 300, "hidden": [128], "epochs": 15}
    if dataset == "digits":  # all 1,437 non-test digits
        return {"pool": 1437, "test": 360, "hidden": [256], "epochs": 30}
    # all 8,000 non-test records: RMIA's population (the target's non-members) is then ≈ 4,000 records,
    # fine enough for its score (a share of the population) to resolve an FPR of 0.1 %
    return {"pool": 8000, "test": 1000, "hidden": [256], "epochs": 30}


def overrides(dataset: str, root: Path | None, runs: int, seed: int, quick: bool) -> dict[str, Any]:
    """The audit configuration of one setting, as overrides of the default audit."""
    sizes = _sizes(quick, dataset)
    data: dict[str, Any] = {"name": dataset, "max_pool": sizes["pool"], "max_test": sizes["test"]}
    if dataset == "mnist":
        data.update(root=str(root), options={"download": False})
    return {
        "name": f"strength-{dataset}-{runs}-runs",
        "seed": seed,
        "dataset": data,
        "partition": {"name": "iid", "clients": 1},  # one client: FedAvg is centralised training
        "model": {"name": "mlp", "options": {"hidden": sizes["hidden"]}},
        "training": {"rounds": 1, "local_unit": "epochs", "local_steps": sizes["epochs"], "batch_size": 32,
                     "lr": 0.1, "momentum": 0.9, "optimizer": "sgd", "eval_every": 1},
        "defenses": [{"name": "fedavg"}],
        "membership": {"runs": runs, "unit": "record"},
        "record": {"global_rounds": "final", "upload_rounds": "none"},
        "diagnostics": {"enabled": False},
        "attacks": ATTACKS,
    }


def _estimate(estimate: Any) -> dict[str, float | None]:
    def number(x: Any) -> float | None:
        return None if x is None or not math.isfinite(float(x)) else float(x)

    # reports.document.Estimate names its bounds ci_low/ci_high, audit.core.metrics.IntervalEstimate low/high
    low = estimate.ci_low if hasattr(estimate, "ci_low") else estimate.low
    high = estimate.ci_high if hasattr(estimate, "ci_high") else estimate.high
    return {"value": number(estimate.value), "low": number(low), "high": number(high)}


def run_setting(setting: Setting, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Train and attack one setting through the real pipeline; its figures as a JSON-ready dict."""
    config = audit.load_config(overrides=overrides(args.dataset, args.data_root, setting.runs, args.seed, args.quick))
    started = time.perf_counter()
    # groups of --batch-runs runs train together: the progress bar moves after each group
    result = audit.audit(config, folder / setting.name, quiet=args.quiet, batch_runs=args.batch_runs)
    seconds = time.perf_counter() - started
    assert result.results is not None
    experiment = result.results.experiments[0]
    sizes = _sizes(args.quick, args.dataset)
    attacks = []
    for record in experiment.attacks:
        if record.kind == "membership":
            attacks.append({"attack": record.attack, **{m: _estimate(record.metrics[m]) for m in METRICS},
                            "notes": record.notes})
    attacks.append(phi_baseline(config, folder / setting.name))
    return {
        "name": setting.name, "what": setting.what, "runs": setting.runs, "references_per_target": setting.runs - 1,
        "dataset": args.dataset, "pool": sizes["pool"], "test_records": sizes["test"],
        "model": f"mlp {sizes['hidden']}", "epochs": sizes["epochs"],
        "train_accuracy": _estimate(experiment.diagnostics.train_accuracy),
        "test_accuracy": _estimate(experiment.utility.test_accuracy),
        "generalization_gap": _estimate(experiment.diagnostics.generalization_gap),
        "skipped": [{"attack": s.attack, "reason": s.reason} for s in experiment.skipped_attacks],
        "seconds": round(seconds, 1),
        "attacks": attacks,
    }


def phi_baseline(config: Any, folder: Path) -> dict[str, Any]:
    """The LiRA code's global threshold on the runs just stored: every (target run, record) scored
    by the target's logit-scaled confidence φ (:func:`attacks.signals.logit_scaled_confidence`),
    through the same metric code and two-way intervals as the registered attacks."""
    from attacks import signals
    from attacks.membership_metrics import membership_metrics
    from audit.targets import membership_experiment

    plan = audit.plan(config)
    trained = audit.train(plan, folder, quiet=True)  # every run is stored already: this only lists them
    experiment = membership_experiment(plan, trained, plan.experiments[0])
    logits = experiment.logits(experiment.round_list("final")[0])[:, 0]  # [runs, records, classes]
    scores = signals.logit_scaled_confidence(logits, experiment.labels.numpy())
    metrics, _, _ = membership_metrics(scores, experiment.keep.astype(bool), seed=config.seed)
    return {"attack": PHI_BASELINE, **{m: _estimate(metrics[m]) for m in METRICS},
            "notes": "not a registered attack: a global threshold on the logit-scaled confidence (tensorflow/privacy "
                     "mi_lira_2021 plot.py)"}


def _value(setting: dict[str, Any], attack: str, metric: str) -> float | None:
    row = next((a for a in setting["attacks"] if a["attack"] == attack), None)
    return None if row is None else row[metric]["value"]


def orderings(settings: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The orderings the papers report, checked on our point estimates: does each hold here?"""
    checks = []

    def compare(setting: str, metric: str, better: str, worse: str, claim: str, factor: float = 1.0) -> None:
        if setting not in settings:
            return
        a, b = _value(settings[setting], better, metric), _value(settings[setting], worse, metric)
        holds = None if a is None or b is None else a >= factor * b
        checks.append({"setting": setting, "claim": claim, "metric": metric, "left": better, "left_value": a,
                       "right": worse, "right_value": b, "factor": factor, "holds": holds})

    for setting in ("many", "few"):
        for metric in ("tpr_at_fpr_0.1%", "auc"):
            compare(setting, metric, "lira-online", "lira-offline", "online LiRA ≥ offline LiRA")
    for setting in ("few", "many"):
        for variant in ("online", "offline"):
            for metric in ("auc", "tpr_at_fpr_0.1%"):
                compare(setting, metric, f"rmia-{variant}", f"lira-{variant}", "RMIA ≥ LiRA (RMIA abstract)")
    for setting in ("many", "few"):
        for baseline in ("loss-threshold", PHI_BASELINE):
            for attack in ("lira-online", "rmia-online", "rmia-offline"):
                compare(setting, "tpr_at_fpr_0.1%", attack, baseline,
                        "reference-model attacks ≫ a global threshold at low FPR (≥ 10×; LiRA abstract)", factor=10.0)
    return checks


def _percent(estimate: dict[str, float | None]) -> str:
    value = estimate["value"]
    return "n/a" if value is None else f"{100 * value:.2f} %"


def _interval(estimate: dict[str, float | None]) -> str:
    value, low, high = estimate["value"], estimate["low"], estimate["high"]
    if value is None:
        return "n/a"
    bounds = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
    return f"{value:.3f}{bounds}"


def table(setting: dict[str, Any]) -> str:
    """One setting's measured figures as a fixed-width table."""
    lines = [f"{setting['name']}: {setting['what']} — {setting['runs']} runs ({setting['references_per_target']} "
             f"reference models per target), {setting['dataset']} pool of {setting['pool']}, {setting['model']}, "
             f"{setting['epochs']} epochs; {setting['seconds']:.0f} s",
             f"  target models: train accuracy {_interval(setting['train_accuracy'])}, "
             f"test accuracy {_interval(setting['test_accuracy'])}, gap {_interval(setting['generalization_gap'])}",
             f"  {'attack':<26} {'AUC [95 % interval]':<24} {'TPR@0.1 % FPR':>14} {'TPR@1 % FPR':>12}"]
    for row in setting["attacks"]:
        lines.append(f"  {row['attack']:<26} {_interval(row['auc']):<24} {_percent(row['tpr_at_fpr_0.1%']):>14} "
                     f"{_percent(row['tpr_at_fpr_1%']):>12}")
    for skipped in setting["skipped"]:
        lines.append(f"  (not run: {skipped['attack']}: {skipped['reason']})")
    return "\n".join(lines)


def reference_table(settings: dict[str, dict[str, Any]]) -> str:
    lines = []
    for reference in REFERENCES:
        lines.append(f"reference: {reference['source']}\n  {reference['url']}\n  {reference['setting']}")
        lines.append(f"  {'reference attack':<44} {'AUC':>7} {'TPR@0.1 %':>10}   {'ours (many)':<26} "
                     f"{'AUC':>6} {'TPR@0.1 %':>10}")
        ours = settings.get("many")
        for figure in reference["figures"]:
            auc = tpr = "n/a"
            if ours is not None:
                a, t = _value(ours, figure["ours"], "auc"), _value(ours, figure["ours"], "tpr_at_fpr_0.1%")
                auc = "n/a" if a is None else f"{a:.3f}"
                tpr = "n/a" if t is None else f"{100 * t:.2f} %"
            lines.append(f"  {figure['attack']:<44} {figure['auc']:>7.4f} {100 * figure['tpr_at_fpr_0.1%']:>8.2f} %   "
                         f"{figure['ours']:<26} {auc:>6} {tpr:>10}")
    return "\n".join(lines)


def orderings_text(checks: list[dict[str, Any]]) -> str:
    lines = ["orderings (point estimates):"]
    for c in checks:
        verdict = {True: "holds", False: "does NOT hold", None: "not measurable"}[c["holds"]]
        scale = f"{c['factor']:g} × " if c["factor"] != 1 else ""
        left = "n/a" if c["left_value"] is None else f"{c['left_value']:.4f}"
        right = "n/a" if c["right_value"] is None else f"{c['right_value']:.4f}"
        lines.append(f"  [{c['setting']}] {c['metric']}: {c['left']} {left} ≥ {scale}{c['right']} {right}: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="membership runs of the 'many' setting (default 32; --quick 6)")
    parser.add_argument("--few-runs", type=int, default=4,
                        help="membership runs of the 'few' setting (default 4, the fewest LiRA takes; 0 skips it)")
    parser.add_argument("--quick", action="store_true", help="a tiny version (seconds): 600-record pool, MLP 128, 15 epochs")
    parser.add_argument("--dataset", choices=("mnist", "digits"), default="mnist")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_MNIST, help="folder with the MNIST t10k IDX files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help=f"JSON file to write (default {DEFAULT_OUT.relative_to(ROOT)}; with --quick nothing unless given)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the audits' folders (report.html, runs) here; default: a temporary folder")
    parser.add_argument("--batch-runs", type=int, default=8,
                        help="runs trained together (the progress bar moves after each group)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: with another busy process on the machine, 2 threads ran 7x slower here)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    runs = args.runs if args.runs is not None else (6 if args.quick else 32)
    if runs < 4 or (args.few_runs and args.few_runs < 4):
        parser.error("LiRA needs at least 4 runs (3 reference models per target): --runs and --few-runs must be "
                     "≥ 4 (or --few-runs 0)")
    if args.dataset == "mnist" and not (args.data_root / "t10k-labels-idx1-ubyte.gz").exists() \
            and not (args.data_root / "t10k-labels-idx1-ubyte").exists():
        parser.error(f"--data-root: no MNIST t10k files in {args.data_root} (or set $DPFL_AUDIT_DATA), or "
                     "use --dataset digits")
    out = args.out if args.out is not None else (None if args.quick else DEFAULT_OUT)
    torch.set_num_threads(args.threads)
    settings = [Setting("many", runs, "many reference models")]
    if args.few_runs:
        settings.append(Setting("few", args.few_runs, "few reference models"))

    started = time.perf_counter()
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dpfl-strength-") as scratch:
        folder = args.workdir or Path(scratch)
        for i, setting in enumerate(settings, 1):
            print(f"[{i}/{len(settings)}] {setting.name}: {setting.runs} runs, training and attacking ...",
                  file=sys.stderr, flush=True)
            measured[setting.name] = run_setting(setting, args, folder)
            print(table(measured[setting.name]), flush=True)
            print(flush=True)
    checks = orderings(measured)
    print(reference_table(measured))
    print()
    print(orderings_text(checks))
    seconds = time.perf_counter() - started
    print(f"({seconds:.0f} s)")
    if out is not None:
        document = {
            "benchmark": "strength", "quick": args.quick, "seed": args.seed,
            "command": "python benchmarks/strength.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1), "torch_threads": args.threads,
            "machine": provenance.machine(), "versions": provenance.versions(),
            "settings": list(measured.values()), "references": REFERENCES, "orderings": checks,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
