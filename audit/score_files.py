"""Score files another tool wrote, read as dpfl-audit's own attack results.

A score file is a table — CSV, Parquet or NPZ (one array per column) — of one of two kinds,
told apart by its columns (``reports/schema/scores.schema.json``, ``docs/how-to/score-files.md``):

* **membership scores** — ``run, unit, score, member``: target model ``run`` gave candidate
  ``unit`` (a record or a whole client) the score ``score`` (higher = more likely a member), and
  ``member`` (0/1, true/false) says whether the unit was in that run's training data. Every run
  scores the same units: a complete run × unit grid, the design of Carlini et al. 2022
  ("Membership Inference Attacks From First Principles"), where every model is a target in turn.
  An optional ``unit_kind`` column (record or client) says what a unit is.
* **canary scores** — ``canary, score, inserted`` and optionally ``run``: the one-run audit of
  Steinke, Nasr, Jagielski 2023 ("Privacy auditing with one (1) training run"), each canary in
  its run by a fair coin; with ``run``, the canaries of several runs are pooled (each run must
  list the same canary ids, one grid as for membership scores).

Statistics are the ones the pipeline computes (:func:`attacks.membership_metrics.membership_metrics`,
:func:`attacks.canaries.canary_audit.canary_result`): AUC and TPR at low FPR with two-way bootstrap
intervals over runs and units, and one-run ε lower bounds (Steinke et al. 2023; the f-DP
analysis of Mahloujifar, Melis, Chaudhuri 2024) over coins that are independent *and fair*.

Which coins of a membership file are independent cannot be read off the file. One unit's scores
in different runs are correlated (its own vulnerability), and in the usual leave-one-out design
run r is scored with the other runs as references, so its scores use their membership: pooling
several runs' coins would let one run's guesses see another run's truth, which the one-run
theorem forbids. A single run's coins are safe exactly when that run was scored without its own
membership — the design's premise. We take the run with the smallest id (in natural order:
numbers within ids by value, model-2 before model-10): fixed before any score is looked at (choosing the run with
the best bound would be a selection the 95 % level does not pay for) and whatever the order of
the rows, and only if its member fraction is compatible with fair coins (two-sided exact
binomial test, p ≥ :data:`FAIR_COIN_P`): Steinke et al.'s count is dominated by a binomial only
for coins of probability ½. Otherwise there is no ε figure, and the notes say why.

Nothing here writes: every check runs while reading, so a bad file is one
:class:`~audit.core.errors.UserInputError` naming the file, the column and the row, before a
command writes anything.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from attacks.attack_result import AttackResult
from attacks.canaries.canary_audit import canary_result
from attacks.membership_metrics import ONE_RUN_FIGURES, gdp_note, membership_metrics
from audit.core.atomic import file_sha256
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import MEMBERSHIP_UNITS, AttackKind, EpsilonKind, Relation, Unit
from audit.external import System, external_results, stated_claim, write_external
from audit.score_tables import FORMATS, Table, read_table
from reports.document import Results
from reports.soundness import measurement_delta

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

#: the columns of each kind of score file (optional ones apart)
MEMBERSHIP_COLUMNS = ("run", "unit", "score", "member")
CANARY_COLUMNS = ("canary", "score", "inserted")
#: optional columns: the unit kind of either file, the run of a canary file
OPTIONAL_COLUMNS = {AttackKind.MEMBERSHIP: ("unit_kind",), AttackKind.CANARY: ("run", "unit_kind")}
#: what ``unit_kind`` (and ``--unit``) may say
UNIT_KINDS = tuple(unit.value for unit in MEMBERSHIP_UNITS)
#: a 0/1 cell written as text: 0, 1 (also 0.0, 1.00), true, false in any case (the schema's pattern)
TRUTH_TEXT = re.compile(r"\s*(?:(?P<number>[01])(?:\.0*)?|(?P<word>true|false))\s*", re.IGNORECASE)
#: a score written as text: a decimal number in ASCII digits (the schema's pattern; no "1_000", no
#: hex, and no "٣": Python's float() reads every script's digits, the schema only 0-9)
SCORE_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*", re.ASCII)
#: below this two-sided binomial p-value, the coins are not fair enough for a one-run bound
FAIR_COIN_P = 1e-3
#: the attack names under which a file's scores are reported
ATTACK_NAMES = {AttackKind.MEMBERSHIP: "membership-scores", AttackKind.CANARY: "canary-scores"}

Kind = Literal[AttackKind.MEMBERSHIP, AttackKind.CANARY]


@dataclass(frozen=True)
class ScoreFile:
    """A score file, checked and arranged as a grid: ``scores[r, u]`` of run ``runs[r]`` and unit
    (or canary) ``units[u]``, both sorted by id (:func:`id_order`) — so nothing computed from it
    depends on the order of the file's rows."""

    path: Path
    format: str  # "csv", "parquet" or "npz"
    kind: Kind
    runs: tuple[str, ...]
    units: tuple[str, ...]
    scores: np.ndarray  # float64 [runs, units]
    truth: np.ndarray  # bool [runs, units]: member / inserted
    unit_kind: str | None  # the file's ``unit_kind`` column (None: no such column)
    ignored: tuple[str, ...]  # columns not read
    sha256: str


# --------------------------------------------------------------------------- checking the columns


def _kind(table: Table) -> Kind:
    """The file's kind, from its columns; a missing column is an error naming it."""
    names = set(table.columns)
    membership, canary = set(MEMBERSHIP_COLUMNS) <= names, set(CANARY_COLUMNS) <= names
    expected = (f"a membership score file has columns {', '.join(MEMBERSHIP_COLUMNS)}; "
                f"a canary file {', '.join(CANARY_COLUMNS)} (and optionally run)")
    if membership and canary:
        raise table.error(f"columns of both kinds (member and inserted): {expected}")
    if membership or canary:
        return AttackKind.MEMBERSHIP if membership else AttackKind.CANARY
    # the kind the file seems meant to be: the one whose distinctive columns it has
    meant = AttackKind.CANARY if names & {"canary", "inserted"} and not names & {"unit", "member"} else AttackKind.MEMBERSHIP
    wanted = CANARY_COLUMNS if meant == AttackKind.CANARY else MEMBERSHIP_COLUMNS
    missing = next(c for c in wanted if c not in names)
    found = ", ".join(repr(n) for n in table.columns) or "none"
    raise table.error(f"missing column '{missing}' (columns found: {found}); {expected}")


def _shown(value: Any) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and math.isnan(value)) or \
        (isinstance(value, str) and value.strip() == "")


def _ids(table: Table, column: str) -> np.ndarray:
    """An id column as text (ints and strings alike), refusing empty cells."""
    values = table.columns[column]
    if values.dtype.kind == "S":
        values = np.char.decode(values, "utf-8", errors="replace")
    if values.dtype.kind in "fcUO":
        for row, value in enumerate(values):
            if _is_missing(value):
                raise table.error(f"column '{column}', row {row + 1}: empty; every row needs a {column} id")
    if values.dtype.kind == "f":  # 3.0 and 3 are one run: an integral float id is shown as an int
        return np.array([str(int(v)) if float(v).is_integer() else str(v) for v in values], dtype=object)
    return np.array([str(v.item() if isinstance(v, np.generic) else v) for v in values], dtype=object)


def _scores(table: Table) -> np.ndarray:
    values = table.columns["score"]
    if values.dtype.kind == "b":
        raise table.error("column 'score': holds true/false; scores must be numbers (higher = more likely a member)")
    if values.dtype.kind == "c":  # float() would drop the imaginary part (with only a warning)
        raise table.error("column 'score': holds complex numbers; allowed: real numbers")
    if values.dtype.kind in "iuf":
        numbers = values.astype(np.float64)
    else:
        numbers = np.empty(len(values))
        for row, value in enumerate(values):
            try:
                if isinstance(value, (bool, np.bool_)):
                    raise ValueError
                numbers[row] = float(value)
                # text must be a plain decimal number (what the schema allows); "nan", "inf" pass
                # here only to be refused below as not finite
                if isinstance(value, str) and math.isfinite(numbers[row]) and not SCORE_TEXT.fullmatch(value):
                    raise ValueError
            except (TypeError, ValueError):
                raise table.error(f"column 'score', row {row + 1}: {_shown(value)} is not a number; "
                                  "allowed: decimal numbers in ASCII digits (e.g. 0.25, -3, 1e-5)") from None
    bad = np.flatnonzero(~np.isfinite(numbers))
    if bad.size:
        row = int(bad[0])
        raise table.error(f"column 'score', row {row + 1}: {_shown(values[row])} is not a finite number; "
                          "every score must be finite")
    return numbers


def _truth(table: Table, column: str) -> np.ndarray:
    """A 0/1 column: 0, 1, true, false (any case), or any number equal to 0 or 1."""
    values = table.columns[column]
    allowed = "allowed: 0, 1, true, false"
    if values.dtype.kind == "b":
        return values.astype(bool)
    if values.dtype.kind in "iuf":
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            row = int(bad[0])
            raise table.error(f"column '{column}', row {row + 1}: {_shown(values[row])} is not allowed; {allowed}")
        return values.astype(bool)
    out = np.empty(len(values), dtype=bool)
    for row, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)):
            out[row] = bool(value)
            continue
        if isinstance(value, (int, float, np.integer, np.floating)) and value in (0, 1):
            out[row] = value == 1
            continue
        match = TRUTH_TEXT.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise table.error(f"column '{column}', row {row + 1}: {_shown(value)} is not allowed; {allowed}")
        out[row] = match["number"] == "1" or (match["word"] or "").lower() == "true"
    return out


def _unit_kind(table: Table) -> str | None:
    """The file's ``unit_kind``: one of :data:`UNIT_KINDS`, the same on every row."""
    if "unit_kind" not in table.columns:
        return None
    values = table.columns["unit_kind"]
    first = None
    for row, value in enumerate(values):
        word = str(value.item() if isinstance(value, np.generic) else value).strip()
        if word not in UNIT_KINDS:
            raise table.error(f"column 'unit_kind', row {row + 1}: {_shown(value)} is not allowed; "
                              f"allowed: {', '.join(UNIT_KINDS)}")
        if first is None:
            first = word
        elif word != first:
            raise table.error(f"column 'unit_kind', row {row + 1}: mixed units: '{word}' here, '{first}' in row 1; "
                              "a file scores one kind of unit")
    return first


def id_order(name: str) -> tuple:
    """Sort key of an id, "natural" order: runs of digits compare by value and the rest by its
    characters, so model-2 comes before model-10 and run 7 before run 10; the id itself breaks
    what is left (07 and 7)."""
    chunks = re.split(r"(\d+)", name.strip())
    return tuple((0, int(c), "") if c.isdigit() else (1, 0, c) for c in chunks if c), name


def _sorted_codes(ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(code of every row, the distinct ids sorted by :func:`id_order`): the grid's order depends on
    the ids only, never on the order of the rows."""
    names = sorted(pd.unique(ids), key=id_order)
    lookup = {name: code for code, name in enumerate(names)}
    return np.fromiter((lookup[i] for i in ids), dtype=np.int64, count=len(ids)), names


def _grid(table: Table, runs: np.ndarray, units: np.ndarray, unit_column: str
          ) -> tuple[tuple[str, ...], tuple[str, ...], np.ndarray]:
    """(runs, units, row index of every pair [runs, units]) — each pair exactly once."""
    run_codes, run_names = _sorted_codes(runs)
    unit_codes, unit_names = _sorted_codes(units)
    pairs = run_codes.astype(np.int64) * len(unit_names) + unit_codes
    repeated = np.flatnonzero(pd.Series(pairs).duplicated(keep="first").to_numpy())
    if repeated.size:
        row = int(repeated[0])
        first = int(np.flatnonzero(pairs == pairs[row])[0])
        pair = f"pair run '{runs[row]}', {unit_column}" if "run" in table.columns else unit_column
        raise table.error(f"row {row + 1}: duplicate {pair} '{units[row]}' (first in row {first + 1}); "
                          f"each run scores each {unit_column} once")
    flat = np.full(len(run_names) * len(unit_names), -1, dtype=np.int64)
    flat[pairs] = np.arange(len(pairs))
    where = flat.reshape(len(run_names), len(unit_names))
    missing = np.argwhere(where < 0)
    if missing.size:
        r, u = missing[0]
        raise table.error(f"run '{run_names[r]}' has no score for {unit_column} '{unit_names[u]}'; every run must score "
                          f"the same {unit_column}s (a complete run × {unit_column} grid)")
    return tuple(run_names), tuple(unit_names), where


def read_scores(path: str | os.PathLike) -> ScoreFile:
    """Read and check a score file; see the module docstring for the formats. Any problem is one
    :class:`UserInputError` naming the file, the column and the (1-based data) row."""
    path = Path(path)
    table = read_table(path)
    kind = _kind(table)
    if table.rows == 0:
        raise table.error("no rows of scores (only a header)")
    id_column = "unit" if kind == AttackKind.MEMBERSHIP else "canary"
    truth_column = "member" if kind == AttackKind.MEMBERSHIP else "inserted"
    units = _ids(table, id_column)
    runs = _ids(table, "run") if "run" in table.columns else np.full(table.rows, "0", dtype=object)
    scores, truth, unit_kind = _scores(table), _truth(table, truth_column), _unit_kind(table)
    run_names, unit_names, where = _grid(table, runs, units, id_column)
    if kind == AttackKind.MEMBERSHIP and len(unit_names) < 2:
        raise table.error(f"only one unit ('{unit_names[0]}'); the ROC compares members and non-members of different units")
    if truth.all() or not truth.any():
        raise table.error(f"column '{truth_column}': every row is {int(truth[0])}; "
                          f"the statistics need both {truth_column} = 1 and {truth_column} = 0")
    read = {*(MEMBERSHIP_COLUMNS if kind == AttackKind.MEMBERSHIP else CANARY_COLUMNS), *OPTIONAL_COLUMNS[kind]}
    return ScoreFile(path=path, format=FORMATS[path.suffix.lower()], kind=kind, runs=run_names, units=unit_names,
                     scores=scores[where], truth=truth[where], unit_kind=unit_kind,
                     ignored=tuple(c for c in table.columns if c not in read), sha256=file_sha256(path))


def resolve_unit(data: ScoreFile, unit: str | None) -> str:
    """The unit the scores are about: ``unit`` (``--unit``) if given, else the file's ``unit_kind``,
    else record; a file whose ``unit_kind`` disagrees with ``unit`` is an error."""
    if unit is not None and unit not in UNIT_KINDS:
        raise UserInputError(f"--unit: '{unit}' is not allowed; allowed: {', '.join(UNIT_KINDS)}")
    if unit is not None and data.unit_kind is not None and unit != data.unit_kind:
        raise UserInputError(f"{data.path}: column 'unit_kind': the file scores {data.unit_kind} units, but --unit is "
                             f"{unit}; pass --unit {data.unit_kind} (or leave --unit out)")
    return unit or data.unit_kind or Unit.RECORD.value


# --------------------------------------------------------------------------- scores → AttackResult


def fair_coin_p_value(coins: np.ndarray) -> float:
    """Two-sided exact binomial p-value of the coins' count of ones under Binomial(n, ½)."""
    coins = np.asarray(coins, dtype=bool)
    return float(stats.binomtest(int(coins.sum()), int(coins.size), 0.5).pvalue)


def _unfair(what: str, coins: np.ndarray, p: float) -> str:
    return (f"no one-run ε: {what} has {int(coins.sum())} of {coins.size} coins at 1, which fair coins give with "
            f"two-sided p = {p:.2g} < {FAIR_COIN_P:g}; Steinke et al.'s bound needs coins of probability ½")


def score_result(data: ScoreFile, unit: str, delta: float, seed: int = 0) -> AttackResult:
    """The :class:`AttackResult` of a score file, as the pipeline computes it for its own attacks
    (:meth:`attacks.base.MembershipAttack.result`, :func:`attacks.canaries.canary_audit.canary_result`);
    ``delta``: the δ of the ε figures (:func:`reports.soundness.measurement_delta`), ``seed``: the
    bootstrap's.

    Membership: the one-run ε bounds use only the coins of the run with the smallest id (see the
    module docstring),
    if they pass the fair-coin test. Canaries: every canary is its own coin (the audit of Steinke
    et al. 2023 pools runs: each canary sits in one run); the same test applies to all of them.
    """
    source = f"scores of {data.path.name} (sha256 {data.sha256[:12]})"
    if data.ignored:
        source += f"; columns not read: {', '.join(data.ignored)}"
    if data.kind == AttackKind.CANARY:
        return _canary_result(data, unit, delta, seed, source)
    first, coins_truth = data.runs[0], data.truth[0]
    p = fair_coin_p_value(coins_truth)
    coins = (data.scores[0], coins_truth) if p >= FAIR_COIN_P else None
    metrics, roc, evidence = membership_metrics(data.scores, data.truth, seed, delta=delta, coins=coins)
    if coins is None:
        note = _unfair(f"run '{first}' (the smallest run id)", coins_truth, p)
    else:
        note = (f"one-run ε over the {coins_truth.size} coins of run '{first}' alone, the smallest run id "
                f"(its scores must not use its own membership; other runs' coins are not independent of its "
                f"guesses){gdp_note(evidence)}")
    design = f"{len(data.runs)} run(s) × {len(data.units)} {unit}s"
    return AttackResult(ATTACK_NAMES[AttackKind.MEMBERSHIP], "", unit, data.scores, data.truth, metrics, roc,
                        f"{source}; {design}; {note}", dict.fromkeys(ONE_RUN_FIGURES, EpsilonKind.LOWER_BOUND),
                        kind=AttackKind.MEMBERSHIP, relation=Relation.ADD_REMOVE, evidence=evidence)


def _canary_result(data: ScoreFile, unit: str, delta: float, seed: int, source: str) -> AttackResult:
    inserted = data.truth.ravel()
    described = f"{inserted.size} canaries over {len(data.runs)} run(s), {int(inserted.sum())} inserted"
    result = canary_result(ATTACK_NAMES[AttackKind.CANARY], unit, data.scores, data.truth, delta, seed, f"{source}; {described}")
    p = fair_coin_p_value(inserted)
    if p >= FAIR_COIN_P:
        return result
    # the Gaussian fit assumes no coin law and stays; the one-run bounds go
    keep = [name for name in result.metrics if name not in ONE_RUN_FIGURES]
    return replace(result, metrics={name: result.metrics[name] for name in keep},
                   epsilon_kind={k: v for k, v in result.epsilon_kind.items() if k not in ONE_RUN_FIGURES},
                   evidence={}, notes=f"{result.notes}; {_unfair('the canaries', inserted, p)}")


def score_file_results(path: str | os.PathLike, claim_epsilon: float | None = None, delta: float = 1e-5,
                       unit: str | None = None, relation: str = Relation.ADD_REMOVE.value, seed: int = 0,
                       name: str | None = None) -> tuple[Results, ScoreFile]:
    """The results document of a score file judged against the claim (ε, δ) per ``unit`` under
    ``relation`` (no claim when ``claim_epsilon`` is None), and the file as read. Nothing is written."""
    data = read_scores(path)
    unit = resolve_unit(data, unit)
    claim = stated_claim(claim_epsilon, delta, unit, relation,
                         notes="" if claim_epsilon is not None else "no claim stated (--claim-epsilon)")
    # the ε figures at the δ the claim allows for this unit (group privacy may enlarge it)
    at_delta = measurement_delta(claim, unit, default=delta)
    result = score_result(data, unit, at_delta, seed)
    count = f"{len(data.runs)} run(s) × {len(data.units)} {unit}s" if data.kind == AttackKind.MEMBERSHIP else \
        f"{data.truth.size} canaries over {len(data.runs)} run(s)"
    system = System(name=name or data.path.stem, description=f"{data.kind} scores read from {data.path.name} ({count}), "
                                                             "computed by another tool",
                    source=str(data.path), pool_size=len(data.units), runs=len(data.runs), unit=unit, seed=seed,
                    server_view="not known (scores supplied)")
    config = {"command": "scores", "file": str(data.path), "format": data.format, "sha256": data.sha256,
              "kind": str(data.kind), "claim_epsilon": claim_epsilon, "delta": delta, "unit": unit,
              "relation": relation, "seed": seed, "measurement_delta": at_delta}
    return external_results(system, claim, [result], config), data


def audit_scores(path: str | os.PathLike, claim_epsilon: float | None = None, delta: float = 1e-5,
                 unit: str | None = None, relation: str = Relation.ADD_REMOVE.value, out: str | os.PathLike | None = None,
                 seed: int = 0, name: str | None = None) -> Results:
    """What ``dpfl-audit scores`` does (public API): the file's metrics, ε lower bounds and
    verdicts against the stated claim, written under ``out`` when given (after every check)."""
    results, _ = score_file_results(path, claim_epsilon, delta, unit, relation, seed, name)
    if out is not None:
        write_external(results, Path(out))
    return results
