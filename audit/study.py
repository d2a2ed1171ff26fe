"""What a paper's reproduction is made of: its arms (the defenses it compares), the results of
their runs, and its claims checked on those results, at every ε a claim speaks of, on differences
paired by seed (:func:`judge` states the rule; :func:`compare`, :func:`smaller` are its common uses).

A :class:`Study` per paper lives in :mod:`audit.reproductions`; :mod:`audit.reproduce` runs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.metrics import mean_estimate

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")


@dataclass(frozen=True)
class Arm:
    """One configuration the paper compares (a row of its table)."""

    key: str
    label: str
    defense: str
    params: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)


@dataclass
class RunResult:
    arm: str
    epsilon_target: float | None
    seed: int
    epsilon: float  # the claim after the last round (inf when not private)
    final_accuracy: float
    best_accuracy: float
    train_accuracy: float
    accuracy_by_round: dict[int, float]
    epsilon_by_round: dict[int, float]
    update_norm_first: float
    update_norm_last: float
    update_norm_mean: float
    clip_fraction: float
    sharpness: float | None
    seconds: float
    epsilon_alternatives: dict[str, float | None] = field(default_factory=dict)
    epsilon_server: float | None = None  # the same claim against the server (None: not covered)

    @property
    def best_round(self) -> int:
        """The evaluated round with the best test accuracy (the first one on ties)."""
        return max(sorted(self.accuracy_by_round), key=lambda t: self.accuracy_by_round[t]) if self.accuracy_by_round else 0


@dataclass
class ClaimCheck:
    claim: str
    holds: bool | None  # None: undecided (too few complete pairs, runs missing) or not evaluated
    detail: str
    evaluated: bool = True  # False: the reproduction does not test this claim at all


class StudyResults:
    """Access to the runs of a study by arm, target ε and metric."""

    def __init__(self, runs: list[RunResult]):
        self.runs = runs

    def values(self, arm: str, epsilon: float | None = None, metric: str = "final_accuracy") -> np.ndarray:
        chosen = [r for r in self.runs if r.arm == arm and (epsilon is None or r.epsilon_target == epsilon)]
        if not chosen:  # a non-private arm runs once and stands in every ε column
            chosen = [r for r in self.runs if r.arm == arm and r.epsilon_target is None]
        chosen.sort(key=lambda r: (r.epsilon_target or 0.0, r.seed))
        return np.array([getattr(r, metric) for r in chosen], dtype=np.float64)

    def at_epsilon(self, arm: str, epsilon: float) -> np.ndarray:
        """Accuracy at the first evaluated round whose ε reaches ``epsilon`` (the paper's "stop when
        the target ε is reached"), one value per seed."""
        out = []
        for run in sorted((r for r in self.runs if r.arm == arm), key=lambda r: r.seed):
            out.append(_accuracy_within(run, epsilon))
        return np.array(out)

    def by_seed(self, arm: str, epsilon: float | None = None, metric: str = "final_accuracy") -> dict[int, float]:
        """``metric`` of ``arm``'s run at target ``epsilon``, keyed by seed, for pairing runs of the same
        seed. A non-private arm's runs (target None) stand in every ε; ``epsilon`` None takes the arm's
        runs whatever their target. A seed with several runs is NaN (a missing value), so that a
        comparison never pools runs of different ε."""
        chosen = [r for r in self.runs if r.arm == arm and (epsilon is None or r.epsilon_target == epsilon)]
        if not chosen:
            chosen = [r for r in self.runs if r.arm == arm and r.epsilon_target is None]
        return _one_per_seed((r.seed, getattr(r, metric)) for r in chosen)

    def at_epsilon_by_seed(self, arm: str, epsilon: float) -> dict[int, float]:
        """:meth:`at_epsilon` keyed by seed (NaN where a seed has several runs or no round within ``epsilon``)."""
        return _one_per_seed((r.seed, _accuracy_within(r, epsilon)) for r in self.runs if r.arm == arm)


def _accuracy_within(run: RunResult, epsilon: float) -> float:
    rounds = [t for t, e in sorted(run.epsilon_by_round.items()) if e <= epsilon + 1e-12]
    usable = [t for t in rounds if t in run.accuracy_by_round]
    return run.accuracy_by_round[usable[-1]] if usable else math.nan


def _one_per_seed(pairs: Iterable[tuple[int, Any]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for seed, value in pairs:
        out[seed] = math.nan if seed in out or value is None else float(value)
    return out


# ---------------------------------------------------------------- judging a claim

MIN_PAIRS = 2  # complete pairs a place needs for a verdict: one pair has a sign but no spread
CONFIDENCE = 0.95  # of the paired Student-t intervals shown beside each place
TIE = 1e-12  # differences this close to a claim's bound are a tie (see Comparison.holds)
ACCURACY_METRICS = ("final_accuracy", "best_accuracy", "train_accuracy")


@dataclass(frozen=True)
class Comparison:
    """What a claim says of a place's mean: ``op`` is ≥, >, ≤, < (against ``bound``) or ± (|mean| ≤ ``bound``)."""

    op: str
    bound: float = 0.0

    def holds(self, value: float) -> bool:
        # within TIE of the bound is a tie: a mean of paired differences of accuracies (multiples of
        # 1/|test|) that cancel comes out as ±1e-17, and a tie must not turn on the rounding
        b, tie = self.bound, TIE
        return {"≥": value >= b - tie, ">": value > b + tie, "≤": value <= b + tie, "<": value < b - tie,
                "±": abs(value) <= b + tie}[self.op]

    def side(self, low: float, high: float) -> str:
        """Where the interval [low, high] lies: "for" the claim, "against" it, or "across" its bound."""
        if self.holds(low) and self.holds(high):
            return "for"
        if self.op == "±":
            return "against" if high < -self.bound or low > self.bound else "across"
        # a half-line: an interval with both ends outside it lies outside it
        return "against" if not self.holds(low) and not self.holds(high) else "across"


@dataclass(frozen=True)
class Step:
    """One place a claim is judged (an ε, a step between two ε, the best round): one value per
    complete pair of runs of the same seed — a paired difference, or a level such as an accuracy."""

    where: str
    values: np.ndarray
    missing: int = 0  # seeds with a run or a value missing on one side
    sides: tuple[float, float] | None = None  # the two sides' means over the complete pairs, to show


def complete_seeds(*sides: dict[int, float]) -> tuple[list[int], int]:
    """The seeds with a finite value on every side, and how many seeds lack one somewhere."""
    seeds = sorted(set().union(*sides))
    complete = [s for s in seeds if all(s in side and math.isfinite(side[s]) for side in sides)]
    return complete, len(seeds) - len(complete)


def paired_step(where: str, first: dict[int, float], second: dict[int, float]) -> Step:
    """``first − second`` seed by seed."""
    seeds, missing = complete_seeds(first, second)
    a = np.array([first[s] for s in seeds], dtype=np.float64)
    b = np.array([second[s] for s in seeds], dtype=np.float64)
    return Step(where, a - b, missing, (float(a.mean()), float(b.mean())) if seeds else None)


def level_step(where: str, values: dict[int, float]) -> Step:
    """One arm's values seed by seed (a claim about a level, not a comparison)."""
    seeds, missing = complete_seeds(values)
    return Step(where, np.array([values[s] for s in seeds], dtype=np.float64), missing)


def where_epsilon(epsilon: float | None) -> str:
    return "" if epsilon is None else f"ε={epsilon:g}"


def judge(claim: str, steps: list[Step], relation: Comparison, percent: bool = True, level: bool = False,
          sides_unit: str | None = None) -> ClaimCheck:
    """The verdict of ``claim``, judged at every place it speaks of (``steps``: each ε of "at every
    ε", each step of "grows with ε", the best round), never on a mean pooled over them — a pooled
    mean hides an ε where the order is reversed. At each place the values are paired by seed (the
    same seed on both sides: the same clients, data split and noise keys). The rule:

    * **does not hold** (False) where, at some place with at least :data:`MIN_PAIRS` complete
      pairs, the mean goes against ``relation`` (a tie counts for ≥ and ≤, against > and <);
    * **undecided** (None) where no place goes against it but some place has fewer than
      :data:`MIN_PAIRS` complete pairs (runs missing, diverged, or a single seed): one pair gives a
      sign but no idea of how far it moves from seed to seed;
    * **holds** (True) otherwise: the mean goes the claimed way at every place.

    The verdict is on the mean, as the papers' tables are. Beside every place the detail gives the
    two sides' means, the mean difference with its 95 % paired Student-t interval and how many pairs
    went the claimed way, and says where the interval includes the claim's bound: there the order
    is within seed-to-seed variation. With 2 seeds the interval is the mean ± 12.7 × half the two
    differences' spread, so it is wide, and the detail says so.

    ``percent``: the values are fractions shown ×100 (accuracy); ``level``: the values are levels
    (an accuracy in %) rather than differences (± points); ``sides_unit``: the unit of the two sides'
    means where they are not accuracies (" pt": differences themselves, shown with their sign).
    """
    def number(value: float, signed: bool = True) -> str:
        if percent:
            return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"
        return f"{value:+.4g}" if signed else f"{value:.4g}"

    unit = (" %" if level else " pt") if percent else ""
    side_unit = (" %" if percent else "") if sides_unit is None else sides_unit
    scaled = 100 * relation.bound if percent else relation.bound
    bound = f"{'±' if relation.op == '±' else ''}{scaled:g}{unit}"
    past = f"leaves {bound}" if relation.op == "±" else f"includes {bound}"
    texts, wrong, short, widths = [], [], [], set()
    for step in steps:
        n = len(step.values)
        label = f"{step.where}: " if step.where else ""
        if n == 0:
            texts.append(f"{label}no complete pair" +
                         (f" ({step.missing} seed(s) with a run or value missing)" if step.missing else ""))
            short.append(step)
            continue
        mean = float(np.mean(step.values))
        text = label
        if step.sides is not None:
            signed = side_unit == " pt"
            text += f"{number(step.sides[0], signed)} vs {number(step.sides[1], signed)}{side_unit}, "
        text += f"{number(mean, signed=not level)}{unit}"
        estimate = mean_estimate(step.values, CONFIDENCE)
        if n >= 2:
            widths.add(n)
            text += f" (95 % interval {number(estimate.low, not level)} to {number(estimate.high, not level)}{unit}"
            side = relation.side(estimate.low, estimate.high)
            if side == "across":
                text += f", {past}: within seed noise"
            elif side == "against":
                text += ", all of it against the claim"
            text += ";"
        else:
            text += " (one pair, no interval;"
        agreeing = int(sum(relation.holds(float(v)) for v in step.values))
        text += f" the claimed way in {agreeing} of {n} pair{'s' if n != 1 else ''}"
        text += f"; {step.missing} seed(s) missing)" if step.missing else ")"
        texts.append(text)
        if n < MIN_PAIRS:
            short.append(step)
        elif not relation.holds(mean):
            wrong.append(step)
    def at(chosen: list[Step]) -> str:
        named = [s.where for s in chosen if s.where]
        if not named:
            return ""
        return (" at " if all(w.startswith("ε=") for w in named) else ": ") + ", ".join(named)

    if wrong:
        holds: bool | None = False
        head = f"does not hold (the mean goes against the claim{at(wrong)})"
    elif short:
        holds = None
        head = f"undecided (fewer than {MIN_PAIRS} complete pairs{at(short)})"
    else:
        holds = True
        head = "holds" + (at(steps) if len(steps) > 1 else "")
    note = ""
    if widths:
        ts = ", ".join(f"t = {stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1):.3g} with {n} pairs" for n in sorted(widths))
        note = f"; 95 % paired Student-t intervals ({ts}{': wide' if min(widths) <= 3 else ''})"
    return ClaimCheck(claim, holds, f"{head}: " + "; ".join(texts) + note)


def compare(results: StudyResults, better: str, worse: str, epsilons: Sequence[float | None], metric: str = "final_accuracy",
            claim: str | None = None, at_epsilon: bool = False, margin: float = 0.0, strict: bool = False) -> ClaimCheck:
    """"``better`` ≥ ``worse`` + margin" (``strict``: >) at every ε of ``epsilons``, judged per ε on the
    paired differences (same seed) by the rule of :func:`judge`. ``at_epsilon``: accuracy read where
    each run's ε reaches the level (the "stop when ε is reached" of Shi et al. 2023, Table II)."""
    steps = []
    for epsilon in epsilons:
        if at_epsilon:
            assert epsilon is not None, "at_epsilon needs a level"
            a, b = results.at_epsilon_by_seed(better, epsilon), results.at_epsilon_by_seed(worse, epsilon)
        else:
            a, b = results.by_seed(better, epsilon, metric), results.by_seed(worse, epsilon, metric)
        steps.append(paired_step(where_epsilon(epsilon), a, b))
    relation = Comparison(">" if strict else "≥", margin)
    return judge(claim or f"{better} {relation.op} {worse}", steps, relation, percent=at_epsilon or metric in ACCURACY_METRICS)


def smaller(results: StudyResults, smaller_arm: str, larger_arm: str, epsilons: Sequence[float | None], metric: str,
            claim: str) -> ClaimCheck:
    """"``smaller_arm``'s metric is below ``larger_arm``'s" at every ε, on paired differences (strict: a tie is not below)."""
    steps = [paired_step(where_epsilon(e), results.by_seed(smaller_arm, e, metric), results.by_seed(larger_arm, e, metric))
             for e in epsilons]
    return judge(claim, steps, Comparison("<"), percent=metric in ACCURACY_METRICS)


@dataclass
class Study:
    name: str
    title: str
    paper: str
    config: dict[str, Any]  # an audit config mapping: dataset, partition, model, training, accounting, seed
    arms: list[Arm]
    epsilons: list[float | None]  # target ε per experiment; None: the arms' own noise
    delta: float
    seeds: int
    claims: Callable[[StudyResults], list[ClaimCheck]]
    paper_tables: str  # markdown
    notes: list[str] = field(default_factory=list)
    reductions: list[tuple[Arm, Arm]] = field(default_factory=list)  # must train to bit-identical models
    reduction_rounds: int = 3
    sharpness_radius: float | None = None
    #: (header, kind, value): kind "final" — final accuracy of the experiment at target ε = value;
    #: "best" — best-round accuracy; "at" — accuracy when the run's ε first reaches value
    table_columns: list[tuple[str, str, float | None]] = field(default_factory=list)
    #: alternative ε figures of the claims to show as columns (e.g. "sound" beside UDP-FL's paper_1d ε)
    alternative_epsilons: list[str] = field(default_factory=list)
    #: extra markdown after our table, from the results and {"dim", "client_rate", "clients"} of the proxy
    extra_tables: Callable[[StudyResults, dict], str] | None = None
    proxy: dict = field(default_factory=dict)  # filled in by reproduce(): the proxy's model size and sampling
