"""The ``dpfl-audit`` command line: the boundary where a command's errors become one line and an
exit code. The parser is :mod:`audit.cli_parser`; the commands themselves live in ``audit.commands``.

    dpfl-audit run [CONFIG] [--out DIR] [--preset NAME] [--seed N] [--device D]
                   [--track {mlflow,tensorboard} ...] [--track-uri URI]
    dpfl-audit train CONFIG [--out DIR] ...        train and store the runs only
    dpfl-audit sweep [CONFIG] --over PATH=V1,V2,... [--over ...]   an audit per grid point, runs shared
    dpfl-audit list [--json]                       datasets, models, defenses, attacks, presets
    dpfl-audit epsilon --noise σ | --target-epsilon ε  --rate q --steps T --delta δ [--json]
    dpfl-audit config [CONFIG] [--preset NAME] [--set PATH=VALUE ...]   print the resolved configuration
    dpfl-audit reproduce STUDY [--quick]           a paper's comparison on a CPU proxy, claims checked
    dpfl-audit audit-mechanism --mechanism M ...   the optimal test on one noised step: ε lower bound vs claim
    dpfl-audit conformance [DEFENSE ...|--all]     does each defense release the noise its claim accounts for?
    dpfl-audit invert --attack A ...               gradient inversion of one client's (noisy) gradient: SSIM, PSNR, MSE
    dpfl-audit report RESULTS_DIR [--out FILE] [--figures]   regenerate report.html (and figures/) from stored results
    dpfl-audit check RESULTS --policy P.yaml       CI gate: exit 1 when a policy rule fails
    dpfl-audit audit-training SCRIPT.py:FUNCTION --dataset D --claim-epsilon ε --delta δ
                                                   your own train(features, labels, seed) audited against its claim
    dpfl-audit scores FILE [--claim-epsilon ε]     statistics and verdicts for membership/canary scores any tool wrote

Bad input — an unknown field, a bad value, a missing dataset — prints one line
``dpfl-audit: error: ...`` on stderr and exits with code 2, before anything is written.

``-v``/``-vv`` show what the pipeline is doing (INFO/DEBUG), ``--log-file FILE`` keeps the log, and
every output directory gets its ``run.log`` (:mod:`audit.logs`).

Importing this module loads no torch (``dpfl-audit --help`` stays fast): the command modules
import their heavy dependencies inside the commands (see ``audit.commands``).
"""

from __future__ import annotations

import argparse
import sys

from audit.cli_parser import build_parser
from audit.commands import EXIT_FAILURE, EXIT_USAGE
from audit.commands.catalog import command_config, command_epsilon, command_list
from audit.commands.own_training import command_audit_training
from audit.commands.probes import command_audit_mechanism, command_conformance, command_invert
from audit.commands.results import command_check, command_report
from audit.commands.run import command_reproduce, command_run
from audit.commands.scores import command_scores
from audit.commands.sweep import command_sweep
from audit.core.errors import OutputError, UserInputError, os_error_text
from audit.core.extensions import NO_PLUGINS_ENV
from audit.core.visible_text import VisibleStream, terminal_text


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors (2, one line already printed), --help and --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if getattr(args, "no_plugins", False):
        import os

        os.environ[NO_PLUGINS_ENV] = "1"  # also reaches the process and Ray executors' workers
    from audit.core.output_folder import release_all
    stdout, sys.stdout = sys.stdout, VisibleStream(sys.stdout)  # labels and paths cannot drive the terminal
    try:
        from audit.logs import configure

        folder = _output_folder(args)  # checked before any work: bad paths and links out are refused
        with configure(getattr(args, "verbose", 0), _log_file(args), folder):
            return _dispatch(args)
    except (UserInputError, OutputError) as exc:  # bad input; a full disk or a read-only file system
        print(f"dpfl-audit: error: {terminal_text(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dpfl-audit: interrupted; rerun the same command to resume (finished runs are kept)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except OSError as exc:  # an OS error on a named file (e.g. a store's run written on a full disk)
        if exc.filename is None or exc.errno is None:
            return _internal_error(args, exc)
        print(terminal_text(f"dpfl-audit: error: '{exc.filename}': {os_error_text(exc)}"), file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        return _internal_error(args, exc)
    finally:
        sys.stdout = stdout
        release_all()  # the output folder's lock (a killed process's lock goes with it)


def _internal_error(args: argparse.Namespace, exc: Exception) -> int:
    """A bug or an unforeseen failure: one line, the traceback on request (``-v``)."""
    if getattr(args, "verbose", False):
        raise exc
    text = terminal_text(" ".join(str(exc).split())[:300])
    print(f"dpfl-audit: internal error: {type(exc).__name__}: {text} (rerun with -v for the traceback)",
          file=sys.stderr)
    return EXIT_FAILURE


#: the commands whose --out is a directory: it gets run.log (written once the command claims it)
FOLDER_COMMANDS = ("run", "train", "sweep", "reproduce", "invert", "audit-training", "scores")


def _output_folder(args: argparse.Namespace) -> str | None:
    """The command's output folder, checked before any work (:func:`audit.core.output_folder.check`:
    a folder we can write in, no link inside leading out of it); None when it writes none."""
    if args.command not in FOLDER_COMMANDS:
        return None
    if args.command == "reproduce" and args.out is None:  # its default names the study
        args.out = f"reproduce-{args.study}{'-quick' if args.quick else ''}"
    if args.out is None:  # scores without --out: prints only
        return None
    from audit.core.output_folder import check

    check(args.out, "--out")
    return args.out


def _log_file(args: argparse.Namespace) -> str | None:
    path = getattr(args, "log_file", None)
    if path is None:
        return None
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not path.strip() or not os.path.isdir(folder) or os.path.isdir(path):
        raise UserInputError(f"--log-file: '{path}' is not a file in an existing directory")
    return path


#: every command by its name: a function of the parsed arguments returning the exit code
COMMANDS = {
    "run": lambda args: command_run(args, attack=True),
    "train": lambda args: command_run(args, attack=False),
    "sweep": command_sweep,
    "list": command_list,
    "epsilon": command_epsilon,
    "config": command_config,
    "reproduce": command_reproduce,
    "audit-mechanism": command_audit_mechanism,
    "invert": command_invert,
    "conformance": command_conformance,
    "check": command_check,
    "report": command_report,
    "audit-training": command_audit_training,
    "scores": command_scores,
}


def _dispatch(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
