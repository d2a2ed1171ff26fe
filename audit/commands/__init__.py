"""The commands of ``dpfl-audit``, grouped by what they do; ``audit.cli`` parses the command line
and calls them.

    run.py       run, train, reproduce       the commands that train: an audit's pipeline, a paper's study
    sweep.py     sweep                       an audit per point of a grid of config values, runs shared
    catalog.py   list, epsilon, config       what is registered, what a mechanism costs, what a config resolves to
    probes.py    audit-mechanism,            one mechanism, one defense's released noise or one gradient,
                 conformance, invert         each attacked on its own
    results.py   report, check               stored results turned into a report, or held to a policy
    own_training.py  audit-training          a user's own training function, audited against its claim
    scores.py    scores                      membership or canary scores another tool wrote, judged as an audit

A command takes the parsed ``argparse.Namespace`` and returns the process's exit code; bad input
raises ``UserInputError``, which the command line turns into one line and exit code 2.

These modules import only the standard library and ``audit.core.errors`` at module level:
everything heavy (torch, the registries, the pipeline) is imported inside the command that
needs it, so ``import audit.cli`` loads no torch and ``dpfl-audit --help`` stays fast
(tests/test_public_api.py checks it). The registries themselves load torch only when something
uses it (``audit.core.lazy_modules``): ``list``, ``config``, ``epsilon``, ``check`` and ``scores``
without ``--out`` load neither torch nor matplotlib (tests/audit/test_light_commands.py).
"""

#: the process's exit codes: success, a failed check (conformance, check), bad input
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
