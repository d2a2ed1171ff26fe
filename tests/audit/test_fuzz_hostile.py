"""Property-based fuzzing of every input a user hands the command line.

:mod:`tests.audit.test_fuzz_input` breaks one config field at a time with a value its schema
forbids and asks for a refusal. This module goes further and does not decide in advance whether an
input is good: it throws hostile *text and bytes* — YAML with huge, non-finite, mistyped, tagged,
aliased or non-UTF-8 values in random fields, ``--set`` and ``--over`` strings, score files (CSV
and NPZ bytes, NPZ headers declaring gigabytes within the row limit), policies and results.json
documents, hostile numbers on the commands that take them, entries of every kind (FIFOs, sockets,
folders, files, hard and symbolic links) at the names a command writes in ``--out``, forged
stage-cache entries, and labels of control characters that reach the terminal, the log, the page,
the CSV and the JUnit XML — at :func:`audit.cli.main`, and checks what must hold
whatever the input:

* the exit code is 0 or 2 (``check`` may also say 1: a rule failed), never an internal error;
* at most one line on stderr (a warning printed by a library counts as a line), no traceback;
* nothing is written outside the ``--out`` folder (the whole working folder is snapshotted);
* nothing is written inside ``--out`` when the exit code is 2.

Only one tiny audit is trained, once, for the forged cache entries (each example reruns it on a
copy): configs go through ``dpfl-audit config`` (resolved and validated, no training), ``sweep``
runs under a budget of 1e-12 hours (any valid grid is refused by the planner), and data files go
through ``scores``, ``check`` and ``report``.

The number of examples is about 650 here (about 70 s on 2 cores), the same inputs every run. Set
``DPFL_FUZZ_EXAMPLES`` to run more, drawn afresh from ``--hypothesis-seed``:
``benchmarks/fuzz_hostile.py`` does, under several seeds, and records the counts.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main
from audit.config import AuditConfig
from audit.core.schema import field_reference
from tests.helpers import ENTRY_KINDS, place_entry

#: examples per test below, out of the ~600 of a default run; DPFL_FUZZ_EXAMPLES=N scales them to N in all
SHARES = {"config": 150, "set": 90, "over": 40, "numbers": 70, "scores": 90, "policy": 90, "results": 70,
          "entries": 30, "labels": 20, "cache": 8}
TOTAL = int(os.environ.get("DPFL_FUZZ_EXAMPLES", "0")) or sum(SHARES.values())


def examples(kind: str) -> int:
    return max(1, round(SHARES[kind] * TOTAL / sum(SHARES.values())))


def fuzz_settings(kind: str):
    # the suite's run is the same every time (derandomized); a longer run (DPFL_FUZZ_EXAMPLES, the
    # benchmark) draws fresh inputs from --hypothesis-seed
    return settings(max_examples=examples(kind), deadline=None, database=None,
                    derandomize="DPFL_FUZZ_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


BASE = {
    "dataset": {"name": "digits", "max_pool": 160, "max_test": 100},
    "partition": {"clients": 4},
    "training": {"rounds": 2, "local_steps": 1, "batch_size": 10, "lr": 0.1},
    "membership": {"runs": 4},
    "defenses": [{"name": "fedavg"}],
    "attacks": [{"name": "loss-threshold"}],
    "diagnostics": {"enabled": False},
}
#: dotted paths of the config's leaf fields (lists of entries through their first entry)
PATHS = [row["field"].replace("[]", ".0") for row in field_reference(AuditConfig) if not row["field"].endswith("[]")]

# --------------------------------------------------------------------------- hostile values, as text

#: YAML scalars and snippets, written as they would appear in a file (a 5,000-digit integer is past
#: Python's 4,300-digit conversion limit)
HOSTILE_YAML = [
    "-1", "0", "1e308", "-1e308", "1e-320", ".nan", ".inf", "-.inf", "NaN", "1" + "0" * 30, "9" * 5000,
    "-" + "9" * 300, "18446744073709551616", "0x7fffffffffffffff", "0o777", "1_000", "2001-12-14",
    "true", "no", "~", "''", "' '", "'\\t'", '"\\ud800"', '"\\x00"', '"\\u202e"', "é", "'" + "x" * 5000 + "'",
    "[]", "{}", "[1, [2, [3]]]", "{a: 1}", "!!binary aGVsbG8=", "!!python/object/apply:os.system ['true']",
    "!!float 1e400", "!!str 1", "!!set {a}", "&a 1", "*a", "'../../etc/passwd'", "'/dev/zero'", "'CON'",
    "'${HOME}'", "'$(touch pwned)'", "'a/b'", "'..'", "'-'", "'--out'", "[" * 200 + "]" * 200,
]
#: JSON values, as text
HOSTILE_JSON = [
    "1" + "0" * 5000, "-1" + "0" * 5000, "1" + "0" * 30, "18446744073709551616", "18446744073709551615", "NaN",
    "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-1", "0", "1e308", "-1e308", "0.5", "null", "true",
    '"x"', '""', '"\\ud800"', '"\\u0000"', '"' + "a" * 20000 + '"', "[]", "{}", "[" * 5000 + "]" * 5000, '{"a": 1}',
]
#: numbers on the command line
HOSTILE_NUMBERS = ["nan", "-nan", "inf", "-inf", "1e309", "1e-320", "5e-324", "1e-300", "1e300", "-1", "-0", "0",
                   "0.5", "1", "2", "100", "1e7", "1e30", "9" * 5000, "1" + "0" * 30, "0x10", "1_0", "", " ", "abc",
                   "١٢", "1e", "--1"]


@st.composite
def yaml_config_text(draw) -> str:
    """A tiny valid config with hostile values (as YAML text) put into random fields, or a whole
    document that is no config at all."""
    how = draw(st.sampled_from(["fields"] * 6 + ["document"]))
    if how == "document":
        return draw(st.sampled_from([
            "", "~", "[1, 2]", "just text", "a: &x [*x]", "a: &a [1]\nb: *a\n", "{a: 1, a: 2}", "\t: :", "%YAML 9.9\n---\n",
            "seed: 1\nseed: 2\n", "!!python/name:os.system", "--- 1\n--- 2\n", "[" * 5000,
        ])) + draw(st.text(max_size=20))
    document = copy.deepcopy(BASE)
    values = {}
    for i in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS + ["zz_unknown", "dataset.zz", "defenses.5.name", "attacks.0.params.x"]))
        marker = f"@@{i}@@"
        node = document
        parts = path.split(".")
        for part in parts[:-1]:
            if part.isdigit():
                index = int(part)
                if not isinstance(node, list):
                    break
                while len(node) <= index:
                    node.append({"name": "fedavg"})
                node = node[index]
            else:
                node = node.setdefault(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[parts[-1]] = marker
            values[marker] = draw(st.sampled_from(HOSTILE_YAML) | st.text(max_size=30).map(json.dumps))
    text = yaml.safe_dump(document, allow_unicode=True, default_flow_style=False, width=10**9)
    for marker, value in values.items():
        text = text.replace(f"'{marker}'", value, 1)
    return text


# --------------------------------------------------------------------------- the harness


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and modification time (links not followed)."""
    found = {}
    for directory, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            found[os.path.relpath(path, folder)] = (info.st_size, info.st_mtime_ns)
    return found


def run_hostile(root: Path, args: list[str], out: Path | None = None, exit_one_allowed: bool = False,
                shown: list[str] | None = None) -> list[str]:
    """Run ``dpfl-audit ARGS`` in ``root`` and return what broke the contract (empty: nothing).

    ``out``: the command's output folder (or the folder of its output files); writes there are
    allowed, unless the command refused the input. Everything else under ``root`` — the inputs,
    the working folder — must be left as it was. ``shown``: gets what the command printed (stdout,
    then stderr)."""
    before = _snapshot(root)
    out_before = _snapshot(out) if out is not None and out.exists() else {}
    err, printed = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)  # default output folders (invert-out, dpfl-audit-out, ...) would land here
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message="More than 20 figures")  # many commands in one process
            try:
                code = main(args)
            except SystemExit as exc:  # main returns its code; a SystemExit escaping it is a bug too
                code = f"SystemExit({exc.code})"
    finally:
        os.chdir(cwd)
    text = err.getvalue()
    if shown is not None:
        shown += [printed.getvalue(), text]
    # a warning would be printed on stderr outside pytest: one more line
    lines = text.splitlines() + [f"warning: {w.category.__name__}: {w.message}" for w in caught]
    problems = []
    allowed = (0, 1, 2) if exit_one_allowed else (0, 2)
    if code not in allowed or "internal error" in text:
        problems.append(f"internal error (exit {code}): {text.strip()[:300]}")
    if "Traceback" in text:
        problems.append("traceback on stderr")
    if len(lines) > 1:
        problems.append(f"{len(lines)} lines on stderr: {lines[:3]}")
    after = _snapshot(root)

    def inside(path: str) -> bool:  # lexically: a link written outside --out that points inside is still outside
        return out is not None and (root / path).is_relative_to(out)

    outside = sorted({p for p in set(before) ^ set(after) if not inside(p)}
                     | {p for p in set(before) & set(after) if before[p] != after[p] and not inside(p)})
    if outside:
        problems.append(f"written outside --out: {outside[:5]}")
    if code == 2 and out is not None and (_snapshot(out) if out.exists() else {}) != out_before:
        problems.append("written inside --out on exit 2")
    return problems


@pytest.fixture
def workspace(tmp_path) -> Path:
    """Where each example gets its own working folder (see :func:`fresh`)."""
    return tmp_path


@contextlib.contextmanager
def fresh(workspace: Path):
    """A new, empty working folder for one example, removed afterwards: hypothesis runs every
    example of a test with the same function-scoped fixtures, so a fixture cannot give each its own."""
    folder = Path(tempfile.mkdtemp(dir=workspace))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- configs, --set and --over


SET_STRINGS = st.tuples(st.sampled_from(PATHS + ["", "a..b", "defenses.99.name", "defenses.-1.name", "seed.x", "__class__",
                                                  "dataset.name.x", "attacks.0.params.canaries", "x" * 300]),
                        st.sampled_from(["=", "=", "", "=="]),
                        st.sampled_from(HOSTILE_YAML) | st.text(max_size=20)).map("".join)


@given(text=yaml_config_text(), sets=st.lists(SET_STRINGS, max_size=2))
@fuzz_settings("config")
def test_hostile_config_files(text, sets, workspace):
    with fresh(workspace) as root:
        config = root / "fuzz.yaml"
        config.write_text(text, encoding="utf-8", errors="surrogatepass")
        problems = run_hostile(root, ["config", str(config), *[item for s in sets for item in ("--set", s)]])
        assert not problems, (text[:300], sets, problems)


@given(sets=st.lists(SET_STRINGS, min_size=1, max_size=3))
@fuzz_settings("set")
def test_hostile_set_strings(sets, workspace):
    with fresh(workspace) as root:
        problems = run_hostile(root, ["config", *[item for s in sets for item in ("--set", s)]])
        assert not problems, (sets, problems)


OVER_VALUES = st.lists(st.sampled_from(HOSTILE_YAML[:40] + ["1", "2", "0.1", "fedavg", "", " "]) | st.text(max_size=8),
                       min_size=0, max_size=4).map(",".join)


@given(path=st.sampled_from(PATHS + ["", "nope", "defenses.0", "defenses.9.epsilons"]), values=OVER_VALUES,
       extra=st.booleans())
@fuzz_settings("over")
def test_hostile_over_strings(path, values, extra, workspace):
    """A sweep under a budget of 1e-12 hours: a valid grid is refused by the planner (exit 2), so
    nothing ever trains; a bad --over must be refused the same way, with nothing written."""
    with fresh(workspace) as root:
        config = root / "tiny.yaml"
        config.write_text(yaml.safe_dump(BASE), encoding="utf-8")
        overs = [f"{path}={values}"] + (["training.lr=0.1,0.2"] if extra else [])
        args = ["sweep", str(config), *[item for o in overs for item in ("--over", o)], "--max-hours", "1e-12",
                "--out", str(root / "out"), "--quiet"]
        problems = run_hostile(root, args, root / "out")
        assert not problems, (overs, problems)


# --------------------------------------------------------------------------- numbers on the command line

NUMBER_COMMANDS = [
    (["epsilon", "--noise", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     ["--noise", "--rate", "--steps", "--delta", "--population"]),
    # the PLD accountant refuses grids past its limits, but one near them takes seconds: σ only here
    # (a calibration evaluates several σ; tests/defenses/privacy/test_accounting.py covers it)
    (["epsilon", "--noise", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5", "--accountant", "pld"],
     ["--noise", "--rate", "--steps", "--delta"]),
    (["epsilon", "--target-epsilon", "1", "--rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     ["--target-epsilon", "--rate", "--steps", "--delta"]),
    (["epsilon", "--noise", "1", "--rate", "0.5", "--steps", "10", "--delta", "1e-5", "--sampling", "fixed",
      "--population", "10"],
     ["--noise", "--rate", "--population"]),
    (["audit-mechanism", "--mechanism", "staircase", "--noise", "1", "--trials", "200", "--dim", "10"],
     ["--noise", "--clip", "--delta", "--seed"]),
    (["audit-mechanism", "--mechanism", "laplace", "--noise", "1", "--trials", "200", "--dim", "10", "--clip-norm", "l1",
      "--accounting", "sound"], ["--noise", "--clip", "--delta"]),
    (["audit-mechanism", "--mechanism", "gaussian", "--noise", "1", "--trials", "200", "--dim", "10",
      "--conversion", "improved"], ["--noise", "--clip", "--delta"]),
    (["audit-mechanism", "--mechanism", "ldp-two-point", "--epsilon", "1", "--trials", "200"], ["--epsilon", "--seed"]),
]


@given(case=st.sampled_from(NUMBER_COMMANDS), choices=st.lists(st.tuples(st.integers(0, 10), st.sampled_from(HOSTILE_NUMBERS)),
                                                                min_size=1, max_size=3))
@fuzz_settings("numbers")
def test_hostile_numbers(case, choices, workspace):
    with fresh(workspace) as root:
        base, options = case
        args = list(base)
        for index, value in choices:
            option = options[index % len(options)]
            if option in args:
                args[args.index(option) + 1] = value
            else:
                args += [option, value]
        problems = run_hostile(root, args)
        assert not problems, (args, problems)


# --------------------------------------------------------------------------- score files


@st.composite
def score_file(draw) -> tuple[str, bytes]:
    """A membership or canary score file, CSV or NPZ, valid in shape and then damaged at random."""
    canary = draw(st.booleans())
    runs, units = draw(st.integers(1, 3)), draw(st.integers(2, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if canary:
        header = ["canary", "score", "inserted"]
        rows = [[f"c{u}", f"{rng.normal():.6g}", str(int(rng.random() < 0.5))] for u in range(units * 4)]
    else:
        header = ["run", "unit", "score", "member"]
        rows = [[str(r), f"u{u}", f"{rng.normal():.6g}", str(int(rng.random() < 0.5))] for r in range(runs) for u in range(units)]
    for _ in range(draw(st.integers(0, 3))):
        if not rows:
            break
        what = draw(st.sampled_from(["cell", "cell", "cell", "drop-row", "duplicate-row", "extra-cell", "header"]))
        i = draw(st.integers(0, len(rows) - 1))
        if what == "cell":
            rows[i][draw(st.integers(0, len(header) - 1))] = draw(st.sampled_from(HOSTILE_NUMBERS +
                                                                                  ['"', "a,b", "\u00e9", "\x00"]))
        elif what == "drop-row":
            rows.pop(i)
        elif what == "duplicate-row":
            rows.append(list(rows[i]))
        elif what == "extra-cell":
            rows[i].append("1")
        else:
            header[draw(st.integers(0, len(header) - 1))] = draw(st.sampled_from(["", "score", "x", "unit_kind", "run"]))
    fmt = draw(st.sampled_from(["csv", "csv", "npz", "bytes", "bomb"]))
    if fmt == "bomb":  # headers that declare, within the row limit, more bytes than a score file may decode to
        from numpy.lib import format as npy

        members = {}
        for name in header:
            dtype = np.dtype(draw(st.sampled_from(["<f8", "<i8", "<U1024", "<U64", "|S1024", "<f4"])))
            head = io.BytesIO()
            npy.write_array_header_1_0(head, {"descr": npy.dtype_to_descr(dtype), "fortran_order": False,
                                              "shape": (draw(st.integers(1, 10_000_000)),)})
            members[f"{name or 'empty'}.npy"] = head.getvalue()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for member, data in members.items():
                archive.writestr(member, data)
        return "scores.npz", buffer.getvalue()
    if fmt == "npz":
        buffer = io.BytesIO()
        columns = {}
        for j, name in enumerate(header):
            values = [row[j] if j < len(row) else "" for row in rows]
            kind = draw(st.sampled_from(["float", "str", "object", "short", "2d"]))
            try:
                array = np.array([float(v) for v in values]) if kind in ("float", "short", "2d") else np.array(values)
            except ValueError:
                array = np.array(values)
            if kind == "object":
                array = array.astype(object)
            elif kind == "short":
                array = array[: len(array) // 2]
            elif kind == "2d" and array.size % 2 == 0 and array.size:
                array = array.reshape(2, -1)
            columns[name or "empty"] = array
        np.savez(buffer, **columns)  # pickles object arrays: the reader must refuse those (never unpickle)
        return "scores.npz", buffer.getvalue()
    text = "\n".join(",".join(row) for row in [header, *rows]) + "\n"
    if fmt == "bytes":
        encoding = draw(st.sampled_from(["latin-1", "utf-16", "utf-8-sig"]))
        return "scores.csv", text.encode(encoding, errors="replace") + draw(st.binary(max_size=8))
    return "scores.csv", text.encode("utf-8", errors="surrogatepass")


@given(file=score_file(), write=st.booleans())
@fuzz_settings("scores")
def test_hostile_score_files(file, write, workspace):
    with fresh(workspace) as root:
        name, data = file
        path = root / name
        path.write_bytes(data)
        # with --out an accepted file writes results, report and figures (a second or two): only now and then
        args = ["scores", str(path), "--claim-epsilon", "1"] + (["--out", str(root / "out")] if write else ["--json"])
        problems = run_hostile(root, args, root / "out" if write else None)
        assert not problems, (name, data[:300], problems)


# --------------------------------------------------------------------------- results.json and policies


@pytest.fixture(scope="module")
def results_folder(tmp_path_factory) -> Path:
    """A results folder as the code writes it, from a score file (no training): results.json and manifest.json."""
    base = tmp_path_factory.mktemp("results")
    rng = np.random.default_rng(0)
    lines = ["run,unit,score,member"] + [f"{r},u{u},{rng.normal() + m:.6f},{m}" for r in range(3) for u in range(20)
                                        for m in [int(rng.random() < 0.5)]]
    (base / "scores.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["scores", str(base / "scores.csv"), "--claim-epsilon", "1", "--out", str(base / "out")]) == 0
    return base / "out"


def _leaves(document, prefix=()):
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _leaves(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document[:2]):
            yield from _leaves(value, (*prefix, i))
    yield prefix


def _with_raw(document, path, raw: str) -> str:
    """``document`` as JSON text with the value at ``path`` replaced by the JSON text ``raw``."""
    document = copy.deepcopy(document)
    if not path:
        return raw
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "@@RAW@@"
    return json.dumps(document, ensure_ascii=False).replace('"@@RAW@@"', raw, 1)


@given(data=st.data())
@fuzz_settings("results")
def test_hostile_results_documents(data, results_folder, workspace):
    with fresh(workspace) as root:
        document = json.loads((results_folder / "results.json").read_text(encoding="utf-8"))
        leaves = list(_leaves(document))
        raw = data.draw(st.sampled_from(HOSTILE_JSON))
        path = data.draw(st.sampled_from(leaves))
        folder = root / "results"
        folder.mkdir()
        (folder / "results.json").write_text(_with_raw(document, path, raw), encoding="utf-8", errors="surrogatepass")
        (folder / "manifest.json").write_bytes((results_folder / "manifest.json").read_bytes())
        policy = root / "policy.yaml"
        policy.write_text("rules:\n  - kind: no-violation\n  - {kind: max, metric: auc, value: 1.0}\n  - kind: no-regression\n",
                          encoding="utf-8")
        out = root / "out"
        out.mkdir()
        problems = run_hostile(root, ["check", str(folder), "--policy", str(policy), "--baseline", str(folder),
                                      "--junit", str(out / "junit.xml")], out, exit_one_allowed=True)
        problems += run_hostile(root, ["report", str(folder), "--out", str(out / "report.html")], out)
        assert not problems, (path, raw[:60], problems)


POLICY_RULES = [
    "{{kind: max, metric: auc, value: {v}}}", "{{kind: min, metric: {v}, value: 0.5}}", "{{kind: no-regression, tolerance: {v}}}",
    "{{kind: no-regression, metrics: {v}}}", "{{kind: {v}}}", "{{kind: max, metric: auc, value: 1, use: {v}}}",
    "{{kind: no-violation, warnings: {v}}}", "{{kind: no-violation, require_power: {v}}}",
    "{{kind: max, metric: auc, value: 1, name: {v}}}", "{{kind: max, metric: auc, value: 1, experiment: {v}}}",
    "{{kind: min, metric: test_accuracy, attack: {v}, value: 0}}", "{{kind: no-regression, worse: {v}, require: true}}",
]


@st.composite
def policy_text(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["", "~", "rules: []", "rules: {}", "version: 2\nrules: [{kind: no-violation}]",
                                     "rules:\n - kind: no-violation\nrules: []", "- 1", "rules: &a [*a]"]))
    rules = [draw(st.sampled_from(POLICY_RULES)).format(v=draw(st.sampled_from(HOSTILE_YAML) |
                                                               st.text(max_size=10).map(json.dumps)))
             for _ in range(draw(st.integers(1, 3)))]
    return "rules:\n" + "".join(f"  - {r}\n" for r in rules)


@given(text=policy_text())
@fuzz_settings("policy")
def test_hostile_policies(text, results_folder, workspace):
    with fresh(workspace) as root:
        policy = root / "policy.yaml"
        policy.write_text(text, encoding="utf-8", errors="surrogatepass")
        out = root / "out"
        out.mkdir()
        problems = run_hostile(root, ["check", str(results_folder), "--policy", str(policy), "--baseline", str(results_folder),
                                      "--junit", str(out / "junit.xml")], out, exit_one_allowed=True)
        assert not problems, (text[:300], problems)


# --------------------------------------------------------------------------- what --out holds, what a label holds

#: names the commands write in --out (and deeper ones), and one the user left there
OUTPUT_NAMES = [".dpfl-audit.lock", "run.log", "results.json", "results.csv", "report.html", "manifest.json", "figures",
                "figures/roc-x.png", "cache", "cache/attacks/a/b.json", "runs", "runs/r/model.safetensors", "notes.txt"]


def _score_file(root: Path) -> Path:
    scores = root / "s.csv"
    scores.write_text("canary,score,inserted\n" + "".join(f"{i},{(i % 2) + 0.01 * (i % 7)},{i % 2}\n" for i in range(60)),
                      encoding="utf-8")
    return scores


@given(entries=st.lists(st.tuples(st.sampled_from(OUTPUT_NAMES), st.sampled_from(ENTRY_KINDS)), min_size=1, max_size=3,
                        unique_by=lambda entry: entry[0].split("/")[0]))
@fuzz_settings("entries")
def test_hostile_output_entries(entries, workspace):
    """Entries of every kind at the names a command writes: exit 0 or 2 with at most one line, never
    a hang (a FIFO), nothing written through a link or a hard link (the victim keeps its bytes)."""
    with fresh(workspace) as root:
        victim = root / "victim.txt"
        victim.write_text("the victim\n", encoding="utf-8")
        out = root / "out"
        out.mkdir()
        for name, kind in entries:
            place_entry(out, name, kind, victim)
        problems = run_hostile(root, ["scores", str(_score_file(root)), "--out", str(out)], out)
        assert victim.read_text(encoding="utf-8") == "the victim\n"
        assert not problems, (entries, problems)


#: text that acts where it is shown: escape sequences, a carriage return, C1 and bidirectional controls,
#: formula leads, XML-illegal characters
HOSTILE_TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=("Cc", "Cf", "Zs", "Ll", "Sm", "Po")),
                       max_size=40) | st.sampled_from(["\x1b[2Kx", "\x1b]0;t\x07", "\r=1+1", "@SUM(A1)", "-2+3",
                                                        "\u202eabc", "\x9b31m", "a\x00b", "\ufffe", "\t=1"])
#: what must not reach a terminal, a log or a page raw
ACTING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@given(name=HOSTILE_TEXT)
@fuzz_settings("labels")
def test_hostile_labels_reach_every_output_spelled_out(name, workspace):
    """A system name and a rule name of hostile text: stdout, stderr, run.log and report.html hold
    no acting character, results.csv keeps its columns and has no live formula, JUnit parses."""
    import csv
    import xml.etree.ElementTree as ET

    with fresh(workspace) as root:
        out = root / "out"
        shown: list[str] = []
        problems = run_hostile(root, ["scores", str(_score_file(root)), f"--name={name}", "--out", str(out)], out,
                               shown=shown)
        assert not problems, (name, problems)
        if not (out / "results.json").exists():  # refused (a NUL, an empty name): one line, checked above
            return
        policy = root / "policy.yaml"
        policy.write_text("rules:\n  - {kind: no-violation, name: " + json.dumps(f"r{name}") + "}\n", encoding="utf-8")
        problems = run_hostile(root, ["check", str(out), "--policy", str(policy), "--junit", str(out / "junit.xml")],
                               out, exit_one_allowed=True, shown=shown)
        assert not problems, (name, problems)
        texts = shown + [(out / n).read_text(encoding="utf-8") for n in ("run.log", "report.html")]
        assert not any(ACTING.search(text) for text in texts), name
        with (out / "results.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        assert all(len(row) == len(rows[0]) for row in rows)
        assert not any(cell.startswith(("=", "+", "-", "@")) and not _number(cell) for row in rows[1:] for cell in row)
        if (out / "junit.xml").exists():
            ET.parse(out / "junit.xml")


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> tuple[Path, Path]:
    """(config, output folder) of one tiny finished audit, trained once for this module."""
    base = tmp_path_factory.mktemp("audited")
    config = base / "tiny.yaml"
    config.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    assert main(["run", str(config), "--out", str(base / "out"), "--quiet"]) == 0
    return config, base / "out"


@given(data=st.data())
@fuzz_settings("cache")
def test_forged_cache_entries_are_never_reported(data, audited, workspace):
    """Someone with write access to --out edits one value of a stage-cache entry, and perhaps
    recomputes the SHA-256 an editor could: the rerun reports exactly what the audit computed."""
    config, original = audited
    with fresh(workspace) as root:
        out = root / "out"
        shutil.copytree(original, out)
        entries = sorted(p.relative_to(out) for p in (out / "cache").rglob("*.json"))
        entry = out / data.draw(st.sampled_from(entries))
        document = json.loads(entry.read_text(encoding="utf-8"))
        path = data.draw(st.sampled_from([p for p in _leaves(document) if p]))
        raw = data.draw(st.sampled_from(HOSTILE_JSON + ["0.5", "1.0", "0", '"forged"']))
        text = _with_raw(document, path, raw)
        if data.draw(st.booleans()):  # the digest an editor can recompute, where the seal was
            try:
                forged = json.loads(text)
                body = {k: forged.get(k) for k in ("key", "outputs", "reads", "value")}
                forged["seal"] = hashlib.sha256(json.dumps(body, ensure_ascii=False).encode()).hexdigest()
                text = json.dumps(forged, ensure_ascii=False)
            except (ValueError, RecursionError, AttributeError):
                pass
        entry.write_text(text, encoding="utf-8", errors="surrogatepass")
        problems = run_hostile(root, ["run", str(config), "--out", str(out), "--quiet"], out)
        assert not problems, (entry.name, path, raw[:60], problems)
        assert (out / "results.json").read_bytes() == (original / "results.json").read_bytes(), (entry.name, path)


def _number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def test_the_harness_sees_a_write_outside_out_and_an_internal_error(tmp_path, monkeypatch):
    """The checks above can fail: a command that writes next to its input, or raises, is caught."""
    import audit.cli

    def misbehave(args):
        (tmp_path / "stray.txt").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setitem(audit.cli.COMMANDS, "list", misbehave)
    problems = run_hostile(tmp_path, ["list"])
    assert any("internal error" in p for p in problems) and any("outside --out" in p for p in problems)
    assert TOTAL >= 500 or "DPFL_FUZZ_EXAMPLES" in os.environ
