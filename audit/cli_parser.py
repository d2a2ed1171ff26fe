"""The ``dpfl-audit`` command line's parser: every command, its options, and the allowed range of
each number, so that a bad option is one usage line (exit 2) before any command runs. The
commands it names live in :mod:`audit.commands`; :mod:`audit.cli` runs them."""

from __future__ import annotations

import argparse
import math

from audit import __version__
from audit.budget import DEFAULT_MAX_HOURS
from audit.commands import EXIT_USAGE
from audit.commands.scores import DEFAULT_DELTA
from audit.core.extensions import NO_PLUGINS_ENV


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


def _label(text: str) -> str:
    """argparse type: a name shown in reports (:data:`audit.core.schema.MAX_LABEL` characters, no NUL)."""
    from audit.core.schema import MAX_LABEL

    if len(text) > MAX_LABEL or "\0" in text:
        raise argparse.ArgumentTypeError(f"must be text of up to {MAX_LABEL} characters without NUL, "
                                         f"got {len(text)} characters")
    return text


#: every --seed: seeds key random streams whole, up to 64 bits
_seed = _bounded(int, 0, 2**64 - 1)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        # the library's format: "dpfl-audit: error: --option: what is wrong" (the command in the hint)
        message = message.removeprefix("argument ")
        self.exit(EXIT_USAGE, f"dpfl-audit: error: {message} (see {self.prog} --help)\n")


def _add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="sets",
                        help="set one config value, e.g. training.rounds=2, model.name=cnn-tiny, defenses.1.epsilons=[1,4] "
                             "(a YAML value; repeatable; applied after the file and the preset)")


def _add_run_options(parser: argparse.ArgumentParser, config_required: bool) -> None:
    if config_required:
        parser.add_argument("config", help="YAML configuration file")
    else:
        parser.add_argument("config", nargs="?", help="YAML configuration file (default: the embedded default audit)")
    parser.add_argument("--out", default="dpfl-audit-out", help="output directory (default: %(default)s)")
    parser.add_argument("--preset", help="start from a built-in preset (see `dpfl-audit list`)")
    parser.add_argument("--seed", type=_seed, help="override the config's seed")
    _add_set_option(parser)
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


def _add_track_options(parser: argparse.ArgumentParser) -> None:
    """--track/--track-uri (audit.tracking): checked with the other arguments, before training."""
    parser.add_argument("--track", action="append", metavar="{mlflow,tensorboard}",
                        help="once the results are written, also send them to an experiment tracker (repeatable): "
                             "mlflow — one MLflow run per configuration with its params, metrics, verdict tags and "
                             "the results, report and figures as artefacts (extra: mlflow); "
                             "tensorboard — per-round scalars of each configuration (extra: tensorboard)")
    parser.add_argument("--track-uri", metavar="URI",
                        help="with one --track: MLflow's tracking URI (sqlite:///PATH, http(s)://SERVER, ...) or a "
                             "directory for a local store (default: $MLFLOW_TRACKING_URI, else OUT/mlruns), or "
                             "TensorBoard's log directory (default: OUT/tensorboard)")


def _common_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (SUPPRESS: a subcommand's default
    must not overwrite a value given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="-v: what the pipeline is doing (INFO) and, on an unexpected error, the full traceback; "
                             "-vv: also DEBUG")
    common.add_argument("--log-file", metavar="FILE", default=argparse.SUPPRESS,
                        help="also write the log, DEBUG and up, to FILE (every output directory gets run.log anyway)")
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
    run.add_argument("--no-cache", action="store_true",
                     help="recompute every attack, diagnostic, figure and the report, even where OUT/cache holds them "
                          "for the same runs, parameters and code (default: reuse them)")
    _add_track_options(run)

    train = commands.add_parser("train", help="train and store the runs of a config (no attacks, no report)")
    _add_run_options(train, config_required=True)

    sweep = commands.add_parser(
        "sweep", help="an audit per point of a grid of config values (--over PATH=V1,V2,...), runs shared between points; "
                      "one combined table, privacy–utility figures and a sweep page")
    _add_run_options(sweep, config_required=False)
    sweep.add_argument("--over", action="append", default=[], metavar="PATH=V1,V2,...",
                       help="an axis of the grid: a config path (as --set takes) and its values, e.g. "
                            "defenses.1.epsilons=1,4,16 (one ε per point) or training.lr=0.05,0.1; repeatable: the grid "
                            "is the product of the axes")
    _add_track_options(sweep)
    sweep.set_defaults(out="dpfl-audit-sweep")

    listing = commands.add_parser("list", help="registered datasets, models, defenses, attacks and presets")
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    epsilon = commands.add_parser("epsilon", help="ε of a (subsampled) Gaussian mechanism, or σ for a target ε")
    noise = epsilon.add_mutually_exclusive_group(required=True)
    # σ below 1e-6 is no privacy at all (ε > 10¹⁰), and below ~1e-150 dp-accounting divides by σ² = 0
    noise.add_argument("--noise", type=_bounded(float, 1e-6, 1e7), help="noise multiplier σ (noise std / clip)")
    noise.add_argument("--target-epsilon", type=_bounded(float, 0, 1e4, low_open=True), help="calibrate σ to this ε instead")
    epsilon.add_argument("--rate", type=_bounded(float, 0, 1, low_open=True), required=True,
                         help="sampling rate q (Poisson) or m/N (fixed)")
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
    # the lower bounds keep the noise's scale z·C a normal float (its square underflowed to 0 at 1e-300);
    # the staircase's ε has its own upper bound, checked by the command
    mechanism.add_argument("--noise", type=_bounded(float, 1e-6, 1e7),
                           help="z (gaussian), λ (laplace) or ε (staircase, at most 100)")
    # below 1e-6 the mechanism's two outputs are equally likely to within rounding (its scores overflow)
    mechanism.add_argument("--epsilon", type=_bounded(float, 1e-6, 100), help="ε of the ldp-two-point mechanism")
    mechanism.add_argument("--clip", type=_bounded(float, 1e-6, 1e6), default=1.0,
                           help="C: sensitivity of the clipped gradient (default 1)")
    mechanism.add_argument("--dim", type=_bounded(int, 1, 10**6), default=1000,
                           help="d: coordinates the noise is added to (default 1000)")
    mechanism.add_argument("--trials", type=_bounded(int, 1, 10**7), default=100000,
                           help="runs of the mechanism, half with the canary")
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
    conformance.add_argument("--trials", type=_bounded(int, 1, 10**6), default=1000,
                             help="coupled trials per candidate input (default: %(default)s)")
    conformance.add_argument("--alpha", type=_bounded(float, 0, 1, low_open=True), default=0.05,
                             help="family-wise error level of the run's intervals and bounds (default: %(default)s)")
    conformance.add_argument("--delta", type=_bounded(float, 0, 1, low_open=True), default=1e-5,
                             help="δ of the claims checked (default: %(default)s)")
    conformance.add_argument("--seed", type=_seed, default=0)
    conformance.add_argument("--quiet", action="store_true", help="no progress bar")
    conformance.add_argument("--json", action="store_true", help="machine-readable output")

    invert = commands.add_parser("invert",
                                 help="reconstruct a client's images from its (clipped, noised) gradient; SSIM, PSNR, MSE")
    invert.add_argument("--attack", required=True, help="dlg, idlg or inverting-gradients")
    invert.add_argument("--dataset", default="lfw-faces", help="image dataset (default: %(default)s)")
    invert.add_argument("--model", default="lenet", help="model, untrained, initialised from the seed (default: %(default)s)")
    invert.add_argument("--batch-size", type=_bounded(int, 1, 256), default=1, help="images per gradient (default: %(default)s)")
    invert.add_argument("--clip", type=_bounded(float, 0, 1e6), help="clip the gradient to this ℓ2 norm C (flat, all parameters)")
    invert.add_argument("--noise", type=_bounded(float, 0, 1e7),
                        help="noise multiplier σ: add N(0, (σC)²) per coordinate (needs --clip)")
    invert.add_argument("--iterations", type=_bounded(int, 0, 10**6),
                        help="optimiser iterations per restart (default: the attack's)")
    invert.add_argument("--restarts", type=_bounded(int, 0, 1000), default=1,
                        help="random restarts, the best matching loss kept (default: 1)")
    invert.add_argument("--images", type=_bounded(int, 0, 10**4),
                        help="private images attacked, in batches of --batch-size (default: one batch)")
    invert.add_argument("--seed", type=_seed, default=0, help="seed of the model, the images, the noise and the attack")
    invert.add_argument("--data-root", help="directory of the dataset's files (for mnist, cifar10, ...)")
    invert.add_argument("--out", default="invert-out", help="where grid.png and results.json go (default: %(default)s)")
    invert.add_argument("--json", action="store_true", help="machine-readable output")

    report = commands.add_parser("report", help="regenerate report.html from a results directory (no retraining)")
    report.add_argument("results", help="a results directory (with results.json) or a results.json file")
    report.add_argument("--out", help="report file to write (default: RESULTS_DIR/report.html)")
    report.add_argument("--figures", action="store_true",
                        help="also regenerate RESULTS_DIR/figures/: ROC (log–log), privacy–utility, claimed vs measured ε, "
                             "reconstruction grids, as PNG and PDF")

    check = commands.add_parser("check", help="CI gate: hold results to a policy of leakage/utility rules; exit 1 when one fails")
    check.add_argument("results", metavar="RESULTS",
                       help="results directory of `dpfl-audit run` (holding results.json) or its results.json")
    check.add_argument("--policy", required=True, metavar="POLICY.yaml",
                       help="policy YAML file of rules (see examples/policy.yaml)")
    check.add_argument("--baseline", metavar="OLD_RESULTS",
                       help="results of an earlier audit (directory or results.json) for no-regression rules")
    check.add_argument("--junit", metavar="FILE", help="also write the outcomes as JUnit XML to this file")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--strict", action="store_true",
                       help="also exit 1 when a rule cannot fail (a threshold beyond its metric's range, such as AUC ≤ 1; "
                            "a rule that checked nothing); without it such a rule is a warning")

    scores = commands.add_parser(
        "scores", help="AUC, TPR at low FPR, one-run ε lower bounds and verdicts for membership or canary scores "
                       "that any tool wrote (CSV, Parquet, NPZ; see docs/how-to/score-files.md)")
    scores.add_argument("file", metavar="FILE", help="membership scores (run, unit, score, member) or canary scores "
                                                     "(canary, score, inserted[, run]): .csv, .parquet or .npz")
    scores.add_argument("--claim-epsilon", type=_bounded(float, 0, 1e4), metavar="ε",
                        help="the ε the system claims (default: no claim; the verdicts say 'no claim')")
    scores.add_argument("--delta", type=_bounded(float, 0, 1), default=DEFAULT_DELTA, metavar="δ",
                        help="the claim's δ, and the δ of the ε lower bounds (default: %(default)g)")
    scores.add_argument("--unit", choices=["record", "client"],
                        help="what a unit (or canary) stands for (default: the file's unit_kind column, else record)")
    scores.add_argument("--relation", choices=["add-remove", "replace-one", "zero-out"], default="add-remove",
                        help="the claim's neighbouring relation (default: %(default)s)")
    scores.add_argument("--out", metavar="DIR", help="write results.json, results.csv, report.html and manifest.json "
                                                     "here (default: write nothing, only print)")
    scores.add_argument("--json", action="store_true", help="print the results document (results.json) instead")
    scores.add_argument("--name", type=_label, help="the audited system's name in the report (default: the file's name)")
    scores.add_argument("--seed", type=_seed, default=0, help="seed of the bootstrap intervals (default: 0)")

    own = commands.add_parser(
        "audit-training", help="your own train(features, labels, seed) -> torch.nn.Module driven through membership and "
                               "one-run canary runs, audited against the record-level claim it makes")
    own.add_argument("train", metavar="SCRIPT.py:FUNCTION", help="the training function (or module:function)")
    own.add_argument("--dataset", required=True, help="registered dataset (see `dpfl-audit list`), e.g. digits")
    own.add_argument("--data-root", help="directory of the dataset's files (for mnist, cifar10, ...)")
    own.add_argument("--pool", type=_bounded(int, 2, 10**9), metavar="N",
                     help="cap the candidate pool at N records, stratified (default: the whole training split)")
    own.add_argument("--models", type=_bounded(int, 2, 4096), default=8, metavar="N",
                     help="membership runs, each on a random half of the pool (default: %(default)s)")
    own.add_argument("--canaries", type=_bounded(int, 0, 10**6), default=200, metavar="M",
                     help="mislabelled canaries of the one-run audit, each inserted with probability ½ "
                          "(default: %(default)s; 0: no canary run)")
    own.add_argument("--claim-epsilon", type=_bounded(float, 0, 1e4), required=True, metavar="ε",
                     help="the ε the training claims per record (add/remove, the released model)")
    own.add_argument("--delta", type=_bounded(float, 0, 1), required=True, metavar="δ", help="the claim's δ")
    own.add_argument("--accountant", metavar="TEXT", help="how the claim was computed, shown in the report")
    own.add_argument("--out", default="audit-training-out", metavar="DIR", help="output directory (default: %(default)s)")
    own.add_argument("--seed", type=_seed, default=0, help="seed of the coins, canaries and training seeds (default: 0)")
    own.add_argument("--device", default="cpu", help="torch device the attacks evaluate on (default: %(default)s)")
    own.add_argument("--quiet", action="store_true", help="no progress bar")

    config = commands.add_parser("config", help="print the resolved configuration as YAML")
    config.add_argument("config", nargs="?", help="YAML configuration file")
    config.add_argument("--preset", help="built-in preset")
    _add_set_option(config)
    config.add_argument("--reference", action="store_true",
                        help="instead: every field of a config with its type, default and allowed range")
    return parser
