"""The ``dpfl-audit`` command line.

    dpfl-audit run [CONFIG] [--out DIR] [--preset NAME] [--seed N] [--device D]
    dpfl-audit train CONFIG [--out DIR] ...        train and store the runs only
    dpfl-audit list [--json]                       datasets, models, defenses, attacks, presets
    dpfl-audit epsilon --noise σ | --target-epsilon ε  --rate q --steps T --delta δ [--json]
    dpfl-audit config [CONFIG] [--preset NAME]     print the resolved configuration
    dpfl-audit reproduce STUDY [--quick]           a paper's comparison on a CPU proxy, claims checked
    dpfl-audit audit-mechanism --mechanism M ...   the optimal test on one noised step: ε lower bound vs claim
    dpfl-audit conformance [DEFENSE ...|--all]     does each defense release the noise its claim accounts for?
    dpfl-audit invert --attack A ...               gradient inversion of one client's (noisy) gradient: SSIM, PSNR, MSE
    dpfl-audit report RESULTS_DIR [--out FILE]     regenerate report.html from stored results
    dpfl-audit check RESULTS --policy P.yaml       CI gate: exit 1 when a policy rule fails

Bad input — an unknown field, a bad value, a missing dataset — prints one line
``dpfl-audit: error: ...`` on stderr and exits with code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from audit import __version__
from audit.budget import DEFAULT_MAX_HOURS
from audit.core.errors import UserInputError
from audit.core.extensions import NO_PLUGINS_ENV

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _bounded(kind: type, low: float, high: float, low_open: bool = False):
    """argparse type: a finite ``kind`` (int or float) in [low, high] (open at ``low`` if asked);
    the bounds stop typos (1e30 trials) before any work or allocation."""
    def shown(bound: float) -> str:
        return str(bound) if kind is int else f"{bound:g}"

    span = f"{'(' if low_open else '['}{shown(low)}, {shown(high)}]"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'} in {span}, "
                                             f"got '{text}'") from None
        if (kind is float and not math.isfinite(value)) or value < low or value > high or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value

    return parse


#: every --seed: seeds key random streams whole, up to 64 bits
_seed = _bounded(int, 0, 2**64 - 1)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        # the library's format: "dpfl-audit: error: --option: what is wrong" (the command in the hint)
        message = message.removeprefix("argument ")
        self.exit(EXIT_USAGE, f"dpfl-audit: error: {message} (see {self.prog} --help)\n")


def _add_run_options(parser: argparse.ArgumentParser, config_required: bool) -> None:
    if config_required:
        parser.add_argument("config", help="YAML configuration file")
    else:
        parser.add_argument("config", nargs="?", help="YAML configuration file (default: the embedded default audit)")
    parser.add_argument("--out", default="dpfl-audit-out", help="output directory (default: %(default)s)")
    parser.add_argument("--preset", help="start from a built-in preset (see `dpfl-audit list`)")
    parser.add_argument("--seed", type=_seed, help="override the config's seed")
    parser.add_argument("--device", help="torch device, e.g. cpu or cuda (default: the config's, cpu)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--executor", default="local",
                        help="where membership runs train: local (default), process (a pool) or ray (Ray tasks)")
    parser.add_argument("--workers", type=_bounded(int, 1, 1024),
                        help="processes of the process executor, or Ray tasks at a time (default: the CPU count)")
    parser.add_argument("--batch-runs", type=_bounded(int, 0, 4096), metavar="N",
                        help="membership runs of an experiment trained together as one batched computation "
                             "(default: as many as fit one; 1: one after another); results do not depend on it")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="with --executor ray: join this Ray cluster (default: start a local Ray instance)")
    parser.add_argument("--max-hours", type=_bounded(float, 0, 1e6), default=DEFAULT_MAX_HOURS, metavar="H",
                        help="refuse a plan whose training needs more than H hours at this machine's peak "
                             "(a lower bound on its time; default: %(default)g; 0: no limit)")


def _common_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (SUPPRESS: a subcommand's default
    must not overwrite a value given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="on an unexpected error, print the full traceback")
    common.add_argument("--no-plugins", action="store_true", default=argparse.SUPPRESS,
                        help=f"refuse every code-loading name (module:callable, file.py:callable) in configs; "
                             f"also set by {NO_PLUGINS_ENV}=1 (for CI jobs that audit configs they did not write)")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = _Parser(prog="dpfl-audit", description="Train DPFL defenses, attack them, and report claimed vs measured privacy.",
                     parents=[common])
    parser.add_argument("--version", action="version", version=f"dpfl-audit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_parser = commands.add_parser

    def add_command(name: str, **kwargs):
        return add_parser(name, parents=[common], **kwargs)

    commands.add_parser = add_command  # type: ignore[method-assign]

    run = commands.add_parser("run", help="train, attack and write results.csv, results.json, report.html")
    _add_run_options(run, config_required=False)

    train = commands.add_parser("train", help="train and store the runs of a config (no attacks, no report)")
    _add_run_options(train, config_required=True)

    listing = commands.add_parser("list", help="registered datasets, models, defenses, attacks and presets")
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    epsilon = commands.add_parser("epsilon", help="ε of a (subsampled) Gaussian mechanism, or σ for a target ε")
    noise = epsilon.add_mutually_exclusive_group(required=True)
    noise.add_argument("--noise", type=_bounded(float, 0, 1e7, low_open=True), help="noise multiplier σ (noise std / clip)")
    noise.add_argument("--target-epsilon", type=_bounded(float, 0, 1e4, low_open=True), help="calibrate σ to this ε instead")
    epsilon.add_argument("--rate", type=_bounded(float, 0, 1, low_open=True), required=True, help="sampling rate q (Poisson) or m/N (fixed)")
    epsilon.add_argument("--steps", type=_bounded(int, 0, 10**9), required=True, help="number of rounds/steps T")
    epsilon.add_argument("--delta", type=_bounded(float, 0, 1, low_open=True), required=True, help="δ")
    epsilon.add_argument("--accountant", choices=["rdp", "pld"], default="rdp")
    epsilon.add_argument("--conversion", choices=["improved", "classic"], default="improved",
                         help="RDP→(ε,δ): improved (Balle et al. 2020, default) or classic (Mironov 2017)")
    epsilon.add_argument("--sampling", choices=["poisson", "fixed"], default="poisson")
    epsilon.add_argument("--population", type=_bounded(int, 1, 10**12), help="N, for fixed-size sampling")
    epsilon.add_argument("--json", action="store_true", help="machine-readable output")

    reproduce = commands.add_parser("reproduce", help="rerun a paper's comparison on a CPU proxy and check its claims")
    reproduce.add_argument("study", help="blur-lus, dp-fedsam, ... (see `dpfl-audit list`)")
    reproduce.add_argument("--quick", action="store_true", help="the short CPU proxy (minutes); without it the full proxy")
    reproduce.add_argument("--out", help="output directory (default: reproduce-STUDY[-quick])")
    reproduce.add_argument("--dataset", default="mnist", help="proxy data: mnist (default) or digits")
    reproduce.add_argument("--data-root", help="directory of the MNIST IDX files (default: $DPFL_AUDIT_DATA/mnist or the cache)")
    reproduce.add_argument("--seeds", type=_bounded(int, 1, 100), help="override the number of seeds")
    reproduce.add_argument("--quiet", action="store_true", help="no progress bars")
    reproduce.add_argument("--device", help="torch device, e.g. cpu or cuda (default: cpu)")

    mechanism = commands.add_parser("audit-mechanism", help="audit one clipped-and-noised step with the optimal test")
    mechanism.add_argument("--mechanism", required=True, help="gaussian, laplace, staircase or ldp-two-point")
    mechanism.add_argument("--noise", type=_bounded(float, 0, 1e7, low_open=True), help="z (gaussian), λ (laplace) or ε (staircase)")
    mechanism.add_argument("--epsilon", type=_bounded(float, 0, 100, low_open=True), help="ε of the ldp-two-point mechanism")
    mechanism.add_argument("--clip", type=_bounded(float, 0, 1e6, low_open=True), default=1.0, help="C: sensitivity of the clipped gradient (default 1)")
    mechanism.add_argument("--dim", type=_bounded(int, 1, 10**6), default=1000, help="d: coordinates the noise is added to (default 1000)")
    mechanism.add_argument("--trials", type=_bounded(int, 1, 10**7), default=100000, help="runs of the mechanism, half with the canary")
    mechanism.add_argument("--accounting", default="paper_1d", help="paper_1d (UDP-FL's claim) or sound")
    mechanism.add_argument("--clip-norm", default="l2", help="l2 (default) or l1")
    mechanism.add_argument("--canary", default="both", help="concentrated, spread or both (default; the larger bound counts)")
    mechanism.add_argument("--delta", type=_bounded(float, 0, 1, low_open=True), default=1e-5)
    mechanism.add_argument("--conversion", choices=["classic", "improved"], default="classic")
    mechanism.add_argument("--seed", type=_seed, default=0)
    mechanism.add_argument("--json", action="store_true", help="machine-readable output")

    conformance = commands.add_parser(
        "conformance", help="check that each defense's code releases the noise its claim accounts for, per observer")
    conformance.add_argument("defenses", nargs="*", metavar="DEFENSE", help="registered defense names (see `dpfl-audit list`)")
    conformance.add_argument("--all", action="store_true", help="every registered defense")
    conformance.add_argument("--param", action="append", default=[], metavar="[DEFENSE.]FIELD=VALUE",
                             help="a hyper-parameter (YAML value) for every named defense, or for one: "
                                  "fed-smp-randk.keep_fraction=0.25; repeatable")
    conformance.add_argument("--trials", type=_bounded(int, 1, 10**6), default=1000, help="coupled trials per candidate input (default: %(default)s)")
    conformance.add_argument("--alpha", type=_bounded(float, 0, 1, low_open=True), default=0.05,
                             help="family-wise error level of the run's intervals and bounds (default: %(default)s)")
    conformance.add_argument("--delta", type=_bounded(float, 0, 1, low_open=True), default=1e-5, help="δ of the claims checked (default: %(default)s)")
    conformance.add_argument("--seed", type=_seed, default=0)
    conformance.add_argument("--quiet", action="store_true", help="no progress bar")
    conformance.add_argument("--json", action="store_true", help="machine-readable output")

    invert = commands.add_parser("invert", help="reconstruct a client's images from its (clipped, noised) gradient; SSIM, PSNR, MSE")
    invert.add_argument("--attack", required=True, help="dlg, idlg or inverting-gradients")
    invert.add_argument("--dataset", default="lfw-faces", help="image dataset (default: %(default)s)")
    invert.add_argument("--model", default="lenet", help="model, untrained, initialised from the seed (default: %(default)s)")
    invert.add_argument("--batch-size", type=_bounded(int, 1, 256), default=1, help="images per gradient (default: %(default)s)")
    invert.add_argument("--clip", type=_bounded(float, 0, 1e6), help="clip the gradient to this ℓ2 norm C (flat, all parameters)")
    invert.add_argument("--noise", type=_bounded(float, 0, 1e7), help="noise multiplier σ: add N(0, (σC)²) per coordinate (needs --clip)")
    invert.add_argument("--iterations", type=_bounded(int, 0, 10**6), help="optimiser iterations per restart (default: the attack's)")
    invert.add_argument("--restarts", type=_bounded(int, 0, 1000), default=1, help="random restarts, the best matching loss kept (default: 1)")
    invert.add_argument("--images", type=_bounded(int, 0, 10**4), help="private images attacked, in batches of --batch-size (default: one batch)")
    invert.add_argument("--seed", type=_seed, default=0, help="seed of the model, the images, the noise and the attack")
    invert.add_argument("--data-root", help="directory of the dataset's files (for mnist, cifar10, ...)")
    invert.add_argument("--out", default="invert-out", help="where grid.png and results.json go (default: %(default)s)")
    invert.add_argument("--json", action="store_true", help="machine-readable output")

    report = commands.add_parser("report", help="regenerate report.html from a results directory (no retraining)")
    report.add_argument("results", help="a results directory (with results.json) or a results.json file")
    report.add_argument("--out", help="report file to write (default: RESULTS_DIR/report.html)")

    check = commands.add_parser("check", help="CI gate: hold results to a policy of leakage/utility rules; exit 1 when one fails")
    check.add_argument("results", metavar="RESULTS", help="results directory of `dpfl-audit run` (holding results.json) or its results.json")
    check.add_argument("--policy", required=True, metavar="POLICY.yaml", help="policy YAML file of rules (see examples/policy.yaml)")
    check.add_argument("--baseline", metavar="OLD_RESULTS", help="results of an earlier audit (directory or results.json) for no-regression rules")
    check.add_argument("--junit", metavar="FILE", help="also write the outcomes as JUnit XML to this file")
    check.add_argument("--json", action="store_true", help="machine-readable output")

    config = commands.add_parser("config", help="print the resolved configuration as YAML")
    config.add_argument("config", nargs="?", help="YAML configuration file")
    config.add_argument("--preset", help="built-in preset")
    config.add_argument("--reference", action="store_true",
                        help="instead: every field of a config with its type, default and allowed range")
    return parser


# --------------------------------------------------------------------------- commands


def _load(args: argparse.Namespace):
    from audit.config import load_config

    overrides: dict[str, Any] = {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.device is not None:
        overrides["device"] = args.device
    return load_config(args.config, args.preset, overrides)


def _server_epsilon(claim: dict[str, Any]) -> str:
    """The claim against the server, for the summary table ('–' when not covered or no claim)."""
    server = next((a for a in claim.get("adversaries") or [] if a["adversary"] == "server"), None)
    return "–" if server is None or server["epsilon"] is None else f"{server['epsilon']:.3g}"


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"{'configuration':<28} {'accuracy':>9} {'claimed ε':>10} {'server ε':>9} {'unit':>7}  leakage")
    for experiment in summary["experiments"]:
        accuracy = experiment["utility"]["test_accuracy"]["value"]
        epsilon = experiment["claim"]["epsilon"]
        leak = ", ".join(
            f"{a['attack']} AUC {a['metrics']['auc']['value']:.3f} TPR@1% {100 * a['metrics']['tpr_at_fpr_1%']['value']:.1f}%"
            for a in experiment["attacks"] if a.get("kind") != "run")
        soundness = experiment.get("soundness")
        accuracy = "diverged" if experiment.get("status") == "diverged" else "n/a" if accuracy is None else f"{100 * accuracy:.1f}%"
        print(f"{experiment['label'][:28]:<28} {accuracy:>9} {('∞' if epsilon is None else f'{epsilon:.3g}'):>10} "
              f"{_server_epsilon(experiment['claim']):>9} {experiment['claim']['unit']:>7}  {leak}"
              + (f"; soundness: {soundness}" if soundness else ""))


def command_run(args: argparse.Namespace, attack: bool) -> int:
    from audit.budget import check_budget
    from audit.executors import check_executor, check_executor_plan
    from audit.pipeline import run_audit
    from audit.planning import plan_audit

    check_executor(args.executor, args.workers, args.ray_address, args.batch_runs)  # for ray: that Ray is installed
    config = _load(args)
    if not (math.isfinite(args.max_hours) and args.max_hours >= 0):
        raise UserInputError(f"--max-hours: must be a finite number >= 0 (0: no limit), got {args.max_hours:g}")
    plan = plan_audit(config)  # every check happens here, before the output directory exists
    check_executor_plan(args.executor, plan)
    cost = check_budget(plan, args.out, args.max_hours)
    if not args.quiet:
        print(f"plan: {cost.describe()}", file=sys.stderr)
    result = run_audit(config, Path(args.out), attack=attack, quiet=args.quiet, plan=plan, executor=args.executor,
                       workers=args.workers, batch_runs=args.batch_runs, ray_address=args.ray_address)
    paths = result["paths"]
    if attack:
        _print_summary(result["summary"])
        print(f"report:  {paths['report']}")
        print(f"results: {paths['results_csv']}, {paths['results_json']}")
    else:
        print(f"runs stored in {paths['runs']}")
    return EXIT_OK


def command_list(args: argparse.Namespace) -> int:
    import attacks.catalog  # noqa: F401
    import defenses.catalog  # noqa: F401
    from attacks.base import ATTACKS
    from audit.config import preset_names
    from audit.core.datasets import DATASETS
    from audit.core.models import MODELS
    from audit.core.schema import field_help
    from defenses.base import DEFENSES

    def doc(entry) -> str:
        return (entry.__doc__ or "").strip().split("\n")[0]

    details = {
        "datasets": {n: {"summary": doc(DATASETS.get(n))} for n in DATASETS.names()},
        "models": {n: {"summary": doc(MODELS.get(n))} for n in MODELS.names()},
        "defenses": {n: {"summary": DEFENSES.get(n).summary, "reference": DEFENSES.get(n).reference,
                         "private": DEFENSES.get(n).private,
                         "params": {f: {"type": t, "default": d, "help": h} for f, t, d, h in field_help(DEFENSES.get(n).Params)}}
                     for n in DEFENSES.names()},
        "attacks": {n: {"summary": ATTACKS.get(n).summary, "reference": ATTACKS.get(n).reference,
                        "params": {f: {"type": t, "default": d, "help": h} for f, t, d, h in field_help(ATTACKS.get(n).Params)}}
                    for n in ATTACKS.names()},
    }
    for name, claim in _claims_at_defaults(DEFENSES).items():
        details["defenses"][name]["claim_at_defaults"] = claim
    listing = {kind: sorted(entries) for kind, entries in details.items()}
    listing["presets"] = preset_names()
    from audit.reproduce import study_names

    listing["studies"] = study_names()
    if args.json:
        print(json.dumps({**listing, "details": details}, indent=2, ensure_ascii=False))
        return EXIT_OK
    for kind in ("datasets", "models", "defenses", "attacks"):
        print(f"{kind}:")
        for name in listing[kind]:
            print(f"  {name:<16} {details[kind][name]['summary']}")
            for field_name, spec in details[kind][name].get("params", {}).items():
                print(f"      {field_name} = {spec['default']!r}  ({spec['type']}) {spec['help']}")
    print("presets: " + ", ".join(listing["presets"]))
    print("reproduction studies: " + ", ".join(listing["studies"]))
    return EXIT_OK


def _claims_at_defaults(registry) -> dict[str, dict[str, Any]]:
    """Every defense's claim per observer with its default hyper-parameters at the default audit's
    settings (digits, the default model, 20 clients, every client every round, 30 rounds, δ = 1e-5)."""
    from audit.config import AuditConfig
    from audit.core.models import build_model
    from defenses.base import AccountingSettings
    from defenses.engine import TrainingConfig
    from defenses.flat import ParamLayout

    config = AuditConfig()
    layout = ParamLayout.of(build_model(config.model.name, (1, 8, 8), 10, dict(config.model.options)))
    training, clients = TrainingConfig(), config.partition.clients
    out = {}
    for name in registry.names():
        claim = registry.get(name)(None, layout).privacy_claim(training, clients, training.rounds, 1e-5, AccountingSettings())
        out[name] = {"settings": f"defaults; {clients} clients, every client every round, {training.rounds} rounds, δ = 1e-5",
                     "unit": claim.unit, "headline": claim.adversary if claim.is_private else None,
                     "mechanism": claim.mechanism,
                     "adversaries": {a.adversary: {"epsilon": a.epsilon if a.covered else None, "relation": a.relation,
                                                   "observes": a.observes, "amplification": a.amplification,
                                                   "notes": a.notes} for a in claim.adversaries}}
    return out


def command_epsilon(args: argparse.Namespace) -> int:
    from defenses.accounting import GaussianSchedule, calibrate_noise, compute_epsilon

    schedule = GaussianSchedule(args.noise if args.noise is not None else 1.0, args.rate, args.steps,
                                args.sampling, args.population)
    calibrated = args.target_epsilon is not None
    if calibrated:
        sigma = calibrate_noise(args.target_epsilon, schedule, args.delta, args.accountant, args.conversion)
        schedule = schedule.with_noise(sigma)
    report = compute_epsilon(schedule, args.delta, args.accountant, args.conversion)
    out = {**report.as_dict(), "noise": schedule.noise_multiplier, "rate": schedule.sampling_rate,
           "steps": schedule.steps, "sampling": schedule.sampling, "mechanism": schedule.describe()}
    if calibrated:
        out["target_epsilon"] = args.target_epsilon
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return EXIT_OK
    if calibrated:
        print(f"noise multiplier σ = {schedule.noise_multiplier:.6g} for target ε = {args.target_epsilon:g}")
    order = f", optimal order {report.optimal_order:g}" if report.optimal_order is not None else ""
    print(f"ε = {report.epsilon:.6g} at δ = {args.delta:g}  [{report.label}{order}]")
    print(f"mechanism: {schedule.describe()}")
    return EXIT_OK


def command_reproduce(args: argparse.Namespace) -> int:
    from audit.reproduce import make_study, reproduce

    study = make_study(args.study, args.quick, args.dataset, args.data_root, args.seeds)
    if args.device is not None:
        study.config["device"] = args.device
    out = Path(args.out or f"reproduce-{args.study}{'-quick' if args.quick else ''}")
    result = reproduce(study, out, quiet=args.quiet)
    print(result["markdown"])
    print(f"written: {result['paths']['md']}, {result['paths']['json']}, {result['paths']['csv']}")
    return EXIT_OK


def command_audit_mechanism(args: argparse.Namespace) -> int:
    from attacks.mechanism_audit import audit_mechanism, audit_two_point

    if args.mechanism == "ldp-two-point":
        if args.epsilon is None:
            raise UserInputError("--epsilon: ldp-two-point needs the ε of the mechanism")
        result = audit_two_point(args.epsilon, args.trials, args.seed)
        header = f"two-point ε-LDP mechanism (LDP-FL), one weight at the two ends of its range, {args.trials} trials"
        delta = 0.0
    else:
        if args.noise is None:
            raise UserInputError(f"--noise: {args.mechanism} needs its noise parameter")
        result = audit_mechanism(args.mechanism, args.noise, args.clip, args.dim, args.trials, args.accounting,
                                 args.clip_norm, args.delta, args.conversion, args.canary, args.seed)
        header = f"{result['mechanism']}, C = {args.clip:g}, d = {args.dim}, {args.trials} trials, accounting {args.accounting}"
        delta = args.delta
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return EXIT_OK
    print(header)
    claimed = result["epsilon_claimed"]
    print(f"claimed ε:       {'none (no finite bound)' if claimed is None else f'{claimed:.4f}'} at δ = {delta:g}")
    each = 100 * result.get("confidence_per_canary", result["confidence"])
    for canary, bound in result["canaries"].items():
        print(f"ε lower bound:   {bound:.4f}  ({canary}, Clopper–Pearson {each:.4g} %, threshold on a held-out half)")
    print(result["verdict"])
    return EXIT_OK


def _conformance_defenses(args: argparse.Namespace) -> tuple[list, list[dict[str, Any]]]:
    """The defenses ``conformance`` checks, with their hyper-parameters validated (one-line errors)."""
    import yaml

    import defenses.catalog  # noqa: F401
    from audit.core.schema import from_mapping
    from defenses.base import DEFENSES

    if args.all and args.defenses:
        raise UserInputError("conformance: name defenses or give --all, not both")
    names = DEFENSES.names() if args.all else list(args.defenses)
    if not names:
        raise UserInputError("conformance: name at least one defense (see `dpfl-audit list`) or give --all")
    if args.trials < 100:
        raise UserInputError(f"--trials: must be >= 100, got {args.trials}")
    if not 0 < args.alpha < 1:
        raise UserInputError(f"--alpha: must lie in (0, 1), got {args.alpha:g}")
    if not 0 < args.delta < 1:
        raise UserInputError(f"--delta: must lie in (0, 1), got {args.delta:g}")
    overrides: dict[str, dict[str, Any]] = {name: {} for name in names}
    for item in args.param:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserInputError(f"--param: '{item}' is not FIELD=VALUE or DEFENSE.FIELD=VALUE")
        target, dot, field = key.rpartition(".")
        if dot and target not in overrides:
            raise UserInputError(f"--param: '{key}' names a defense not checked here; checked: {', '.join(names)}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserInputError(f"--param: the value of '{key}' is not valid YAML") from None
        for name in ([target] if dot else names):
            overrides[name][field] = parsed
    chosen, shown = [], []
    for name in names:
        cls = DEFENSES.get(name, "conformance: defense")
        params = from_mapping(cls.Params, overrides[name], f"--param ({name})")
        chosen.append(cls(params))
        shown.append(overrides[name])
    return chosen, shown


def command_conformance(args: argparse.Namespace) -> int:
    from attacks.conformance import CONFORMS, VIOLATES, conformance

    chosen, shown = _conformance_defenses(args)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="trial", file=sys.stderr, leave=False)

    def progress(name: str, done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.set_description(name)
            bar.refresh()

    result = conformance(chosen, args.trials, args.seed, args.alpha, args.delta,
                         [{**to_params(d), **o} for d, o in zip(chosen, shown)], progress)
    if bar is not None:
        bar.close()
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(f"conformance: {result['task']}; {result['trials']} coupled trials per input; every interval and bound "
              f"at {100 * result['level']:.4g} % (α = {result['alpha']:g} over {result['family_size']} tests), δ = {result['delta']:g}")
        for entry in result["defenses"]:
            print(f"{entry['defense']:<20} {entry['status'].upper() if entry['status'] == VIOLATES else entry['status']}")
            for check in entry["adversaries"]:
                print(f"    {check['adversary']:<9} {check['status']:<9} {check['detail']}")
            for adversary, why in entry["not_covered"].items():
                print(f"    {adversary:<9} {'—':<9} {why}")
            if entry["status"] != "conforms" or not entry["adversaries"]:
                print(f"    {entry['note']}")
        print(f"overall: {result['status']}")
    return EXIT_OK if result["status"] == CONFORMS else EXIT_FAILURE


def to_params(defense) -> dict[str, Any]:
    from dataclasses import asdict

    from audit.core.schema import to_mapping

    return to_mapping(asdict(defense.params))


def _check_invert_options(args: argparse.Namespace) -> None:
    """Every option of ``invert`` checked before anything is loaded or written."""
    from attacks.inversion import RECONSTRUCTION_ATTACKS
    from audit.core.datasets import DATASETS
    from audit.core.models import MODELS

    if args.attack not in RECONSTRUCTION_ATTACKS:
        raise UserInputError(f"--attack: unknown attack '{args.attack}'; allowed: {', '.join(RECONSTRUCTION_ATTACKS)}")
    if args.dataset not in DATASETS:
        raise UserInputError(f"--dataset: unknown dataset '{args.dataset}'; allowed: {', '.join(DATASETS.names())}")
    if args.model not in MODELS:
        raise UserInputError(f"--model: unknown model '{args.model}'; allowed: {', '.join(MODELS.names())}")
    for option, value in (("--batch-size", args.batch_size), ("--restarts", args.restarts),
                          ("--iterations", args.iterations), ("--images", args.images)):
        if value is not None and value < 1:
            raise UserInputError(f"{option}: must be >= 1, got {value}")
    if args.clip is not None and not args.clip > 0:
        raise UserInputError(f"--clip: must be > 0, got {args.clip:g}")
    if args.noise is not None:
        if not args.noise >= 0:
            raise UserInputError(f"--noise: must be >= 0, got {args.noise:g}")
        if args.clip is None:
            raise UserInputError("--noise: needs --clip (the noise std is σ·C)")
    if args.images is not None and args.images % args.batch_size:
        raise UserInputError(f"--images: {args.images} images do not split into batches of --batch-size {args.batch_size}")


def command_invert(args: argparse.Namespace) -> int:
    import time

    from attacks.inversion import invert
    from audit.core.atomic import write_bytes, write_json
    from audit.core.datasets import load_dataset

    _check_invert_options(args)
    dataset = load_dataset(args.dataset, args.data_root)
    if dataset.kind != "image" or len(dataset.input_shape) != 3:
        raise UserInputError(f"--dataset: '{args.dataset}' is not an image dataset; gradient inversion reconstructs images")
    started = time.perf_counter()
    result = invert(args.attack, dataset, args.model, args.batch_size, args.images, args.clip, args.noise or 0.0,
                    args.iterations, args.restarts, args.seed)
    seconds = time.perf_counter() - started
    out = Path(args.out)
    grid, results = out / "grid.png", out / "results.json"
    write_bytes(grid, result.pop("png"))
    result["grid"] = str(grid)
    write_json(results, result)
    if args.json:
        from audit.core.atomic import dumps

        print(dumps(result))
        return EXIT_OK
    print(f"{result['attack']} ({result['reference']}) on {result['dataset']}, {result['model']} untrained "
          f"(seed {result['seed']}): {result['threat']}; {result['images']} images, {result['iterations']} iterations "
          f"× {result['restarts']} restart(s), {seconds:.1f} s")
    per_image = result["per_image"]
    print(f"{'image':>6} {'label':>6} {'recovered':>10} {'SSIM':>7} {'PSNR dB':>8} {'MSE':>10}")
    for i, index in enumerate(per_image["index"]):
        print(f"{index:>6} {per_image['label'][i]:>6} {per_image['recovered_label'][i]:>10} {per_image['ssim'][i]:>7.3f} "
              f"{per_image['psnr'][i]:>8.2f} {per_image['mse'][i]:>10.3g}")
    print(f"{'mean':>6} {'':>6} {100 * result['label_accuracy']:>9.0f}% {result['ssim']:>7.3f} {result['psnr']:>8.2f} "
          f"{result['mse']:>10.3g}")
    print(f"grid:    {grid} (top: private images, bottom: reconstructions)")
    print(f"results: {results}")
    return EXIT_OK


def command_report(args: argparse.Namespace) -> int:
    from reports.html import write_report
    from reports.results import load_results

    document, manifest, folder = load_results(args.results)
    extra = {"versions": manifest.get("versions", {}), "machine": manifest.get("machine", {})}
    path = write_report(document, Path(args.out) if args.out else folder / "report.html", manifest_extra=extra)
    print(f"report: {path}")
    return EXIT_OK


def command_config(args: argparse.Namespace) -> int:
    from audit.config import AuditConfig, config_to_yaml, load_config
    from audit.core.schema import MAX_INT, field_reference

    if args.reference:
        print(f"{'field':<34} {'type':<40} {'range':<26} default")
        for row in field_reference(AuditConfig):
            default = json.dumps(row["default"], ensure_ascii=False)
            print(f"{row['field']:<34} {row['type'][:40]:<40} {row['range']:<26} {default[:40]}")
        print(f"Numbers must be finite; an integer without its own bound is at most {MAX_INT}; lists hold at most "
              "10000 values. A defense's or attack's params: `dpfl-audit list` (same rules).")
        return EXIT_OK
    print(config_to_yaml(load_config(args.config, args.preset)), end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors (2, one line already printed), --help and --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if getattr(args, "no_plugins", False):
        import os

        os.environ[NO_PLUGINS_ENV] = "1"  # also reaches the process and Ray executors' workers
    try:
        return _dispatch(args)
    except UserInputError as exc:
        print(f"dpfl-audit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dpfl-audit: interrupted; rerun the same command to resume (finished runs are kept)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as exc:  # a bug or an unforeseen failure: one line, the traceback on request
        if getattr(args, "verbose", False):
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"dpfl-audit: internal error: {type(exc).__name__}: {text} (rerun with -v for the traceback)",
              file=sys.stderr)
        return EXIT_FAILURE


def command_check(args: argparse.Namespace) -> int:
    from reports.policy import check_command

    return EXIT_OK if check_command(args.results, args.policy, args.baseline, args.junit, args.json) else EXIT_FAILURE


COMMANDS = {
    "run": lambda args: command_run(args, attack=True),
    "train": lambda args: command_run(args, attack=False),
    "list": command_list,
    "epsilon": command_epsilon,
    "config": command_config,
    "reproduce": command_reproduce,
    "audit-mechanism": command_audit_mechanism,
    "invert": command_invert,
    "conformance": command_conformance,
    "check": command_check,
    "report": command_report,
}


def _dispatch(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
