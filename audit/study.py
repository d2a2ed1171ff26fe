"""What a paper's reproduction is made of: its arms (the defenses it compares), the results of
their runs, and its claims checked on those results (:func:`compare`, :func:`smaller`).

A :class:`Study` per paper lives in :mod:`audit.reproductions`; :mod:`audit.reproduce` runs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    holds: bool | None  # None: could not be evaluated
    detail: str


class Results:
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
            rounds = [t for t, e in sorted(run.epsilon_by_round.items()) if e <= epsilon + 1e-12]
            usable = [t for t in rounds if t in run.accuracy_by_round]
            out.append(run.accuracy_by_round[usable[-1]] if usable else math.nan)
        return np.array(out)


def compare(results: Results, better: str, worse: str, epsilons: list[float | None], metric: str = "final_accuracy",
            claim: str | None = None, at_epsilon: bool = False, margin: float = 0.0, strict: bool = False) -> ClaimCheck:
    """"``better`` ≥ ``worse`` + margin" (``strict``: >), over every ε and seed, as paired differences.

    The verdict is on the mean paired difference; the detail says in how many paired runs the
    claim held and warns when the sign changes across seeds (the effect is within seed noise).
    """
    differences, wins, total = [], 0, 0
    for epsilon in epsilons:
        a = results.at_epsilon(better, epsilon) if at_epsilon else results.values(better, epsilon, metric)
        b = results.at_epsilon(worse, epsilon) if at_epsilon else results.values(worse, epsilon, metric)
        if len(a) != len(b) or not len(a):
            return ClaimCheck(claim or f"{better} ≥ {worse}", None, "runs missing")
        differences.extend((a - b).tolist())
        wins += int(np.sum(a - b >= margin))
        total += len(a)
    mean = float(np.mean(differences))
    holds = mean > margin if strict else mean >= margin
    scale = 100 if metric in ("final_accuracy", "best_accuracy", "train_accuracy") or at_epsilon else 1
    unit = " pt" if scale == 100 else ""
    mixed = min(differences) < margin <= max(differences)
    detail = (f"{'holds' if holds else 'does not hold'}: mean difference {scale * mean:+.2f}{unit} "
              f"(held in {wins} of {total} paired runs; range {scale * min(differences):+.2f} to {scale * max(differences):+.2f}{unit}"
              f"{'; the sign changes across runs, so the difference is within seed-to-seed variation' if mixed else ''})")
    return ClaimCheck(claim or f"{better} ≥ {worse}", holds, detail)


def smaller(results: Results, smaller_arm: str, larger_arm: str, epsilons: list[float | None], metric: str,
            claim: str) -> ClaimCheck:
    """"``smaller_arm``'s metric is below ``larger_arm``'s", paired over ε and seeds."""
    a = np.concatenate([results.values(smaller_arm, e, metric) for e in epsilons])
    b = np.concatenate([results.values(larger_arm, e, metric) for e in epsilons])
    if len(a) != len(b) or not len(a) or np.isnan(a).any() or np.isnan(b).any():
        return ClaimCheck(claim, None, "runs or values missing")
    holds = bool(np.mean(a) < np.mean(b))
    return ClaimCheck(claim, holds, f"{'holds' if holds else 'does not hold'}: {np.mean(a):.4g} vs {np.mean(b):.4g} "
                                    f"(smaller in {int(np.sum(a < b))} of {len(a)} paired runs)")


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
    claims: Callable[[Results], list[ClaimCheck]]
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
    extra_tables: Callable[[Results, dict], str] | None = None
    proxy: dict = field(default_factory=dict)  # filled in by reproduce(): the proxy's model size and sampling
