"""The per-observer checks of the conformance audit (:mod:`attacks.mechanism_audits.conformance`,
steps 2, 3, 5 and 7): the survey of a defense's release probe for where the noise is least, the
coupled trials of every candidate input against each observer a claim covers, and each
observer's verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from attacks.mechanism_audits.conformance_results import AdversaryCheck, Candidate, CandidateResult, Failure
from attacks.mechanism_audits.conformance_statistics import (
    MIN_INFLUENTIAL,
    epsilon_bound,
    epsilon_ceiling,
    sigma_scopes,
)
from audit.core.empirical_epsilon import one_run_audit
from audit.core.lazy_modules import lazy_module
from audit.core.noise_shape import fresh_noise_p
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import ConformanceStatus, Relation
from defenses.federated.release_probe import ReleaseProbe, Trial
from defenses.federated.training_job import ReleaseAnomaly
from defenses.privacy.claims import AdversaryClaim

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

CONFORMS, VIOLATES, NOT_APPLICABLE = ConformanceStatus.CONFORMS, ConformanceStatus.VIOLATES, ConformanceStatus.NOT_APPLICABLE
#: a private defense the audit cannot check: no release probe, or a covered observer whose claim
#: states neither a per-round noise multiplier nor a one-round ε
NO_PROBE, UNCHECKED = ConformanceStatus.NO_PROBE, ConformanceStatus.UNCHECKED
#: how far beyond the clip the audit's inputs lie (every clip must act)
INPUT_SCALE = 1000.0
#: candidate inputs per observer at most
CANDIDATES = 3
#: the σ tests of one scope (a round, or all rounds pooled): the χ² interval, the KS shortfall test
#: and the shape test (tails lighter than Gaussian)
SIGMA_TESTS = 3
#: pairs of trials, one seed and the same participants in two rounds, of the fresh-noise test
FRESH_PAIRS = 60
#: coins the per-weight coin test aims at (each coordinate of a trial's target row is one)
COINS = 100_000


def scope_count(probe: ReleaseProbe) -> int:
    """σ-test scopes per candidate: each round, and all rounds pooled when there are several."""
    return probe.rounds + (1 if probe.rounds > 1 else 0)


def fresh_test_runs(probe: ReleaseProbe, claim: AdversaryClaim) -> bool:
    """Whether the fresh-noise test runs for this observer: Gaussian noise and several rounds."""
    return claim.noise_multiplier is not None and probe.rounds > 1


def participation_test_runs(probe: ReleaseProbe, claim: AdversaryClaim) -> bool:
    """Whether the participation test runs: the claim accounts a sampling rate below 1 and the
    probe's trials draw participants."""
    return claim.participation_rate is not None and claim.participation_rate < 1 and probe.draw is not None


def coin_test_runs(probe: ReleaseProbe, claim: AdversaryClaim) -> bool:
    """Whether the coin test runs: neighbours differ in one coordinate (a per-weight claim),
    replace-one, with a one-round ε to test."""
    return probe.one_coordinate and claim.relation == Relation.REPLACE_ONE and claim.round_epsilon is not None


def sigma_test_count(probe: ReleaseProbe, claim: AdversaryClaim, candidates: int) -> int:
    """The tests one observer's check runs besides the per-candidate ε tests (all in the family):
    per candidate and scope the :data:`SIGMA_TESTS`, the fresh-noise test, the participation test
    and the coin test."""
    gaussian = candidates * SIGMA_TESTS * scope_count(probe) if claim.noise_multiplier is not None else 0
    return (gaussian + int(fresh_test_runs(probe, claim)) + int(participation_test_runs(probe, claim))
            + int(coin_test_runs(probe, claim)))


@dataclass
class Survey:
    """The first batches of trials: the candidate inputs, each view's mean per round (zero inputs)
    and its length (every later trial must give the same)."""

    candidates: list[Candidate]
    centre: dict[str, np.ndarray]  # view → [rounds, k]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _run(probe: ReleaseProbe, target: torch.Tensor | None, trial: Trial, views: list[str],
         shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """What each view shows in ``trial`` with ``target`` as the target's row (None: all zero), checked:
    finite, and of the shape the first trial gave (``shapes``, filled on first use) — else the
    release is not the claimed mechanism (:class:`ReleaseAnomaly`)."""
    inputs = torch.zeros(probe.rows(trial), probe.dim, dtype=torch.float64)
    if target is not None:
        inputs[trial.target] = target
    observed = probe.observe(inputs, trial)
    out = {}
    for v in views:
        value = np.asarray(observed[v].numpy(), dtype=np.float64)
        if value.shape != shapes.setdefault(v, value.shape):
            raise ReleaseAnomaly(f"the {v} view has shape {value.shape} in one trial and {shapes[v]} in another")
        finite = np.isfinite(value)
        if not finite.all():
            nan = int(np.isnan(value).sum())
            raise ReleaseAnomaly(f"the {v} view holds non-finite values for finite inputs ({nan} NaN, "
                                 f"{int((~finite).sum()) - nan} infinite of {value.size}): no noise of the accounted law "
                                 "gives them")
        out[v] = value
    return out


def survey(probe: ReleaseProbe, views: list[str], seed: int, trials: int) -> Survey:
    """Spread input and concentrated inputs where the noise is least (overall, and where the target
    acts), from all-zero trials spread over the rounds (which also give each round's mean view)."""
    shapes: dict[str, tuple[int, ...]] = {}
    magnitude = INPUT_SCALE * max(1.0, probe.bound)
    spread = torch.full((probe.dim,), magnitude / math.sqrt(probe.dim), dtype=torch.float64)
    per_round = max(30, trials // (4 * probe.rounds))
    samples: list[list[dict[str, np.ndarray]]] = [[] for _ in range(probe.rounds)]
    for t in range(per_round * probe.rounds):
        trial = probe.trial(derive_seed(seed, "variance", t), t % probe.rounds)
        samples[trial.round].append(_run(probe, None, trial, views, shapes))
    centre = {v: np.stack([np.mean([s[v] for s in rows], axis=0) for rows in samples]) for v in views}
    # a coordinate quiet in any one round is a candidate: noise may be short in one round only
    variance = {v: np.min(np.stack([np.var(np.stack([s[v] for s in rows]), axis=0) for rows in samples]), axis=0)
                for v in views}
    moved = {v: np.zeros_like(variance[v], dtype=bool) for v in views}
    for t in range(16):
        trial = probe.trial(derive_seed(seed, "influence", t), t % probe.rounds)
        base, shifted = _run(probe, None, trial, views, shapes), _run(probe, spread, trial, views, shapes)
        for v in views:
            moved[v] |= np.abs(shifted[v] - base[v]) > 0
    out = [] if probe.one_coordinate else [Candidate("spread over all coordinates", spread)]
    chosen: list[int] = []
    for v in views:
        if len(variance[v]) != probe.dim:  # the view is not coordinate-aligned with the input (e.g. a sketch)
            continue
        chosen.append(int(np.argmin(variance[v])))
        if moved[v].any():
            chosen.append(int(np.flatnonzero(moved[v])[np.argmin(variance[v][moved[v]])]))
    if not chosen:
        chosen.append(0)
    for j in dict.fromkeys(chosen):
        vector = torch.zeros(probe.dim, dtype=torch.float64)
        vector[j] = magnitude
        out.append(Candidate(f"concentrated on coordinate {j}", vector))
    return Survey(out[:CANDIDATES], centre, shapes)


def audit_probe(probe: ReleaseProbe, claims: list[AdversaryClaim], trials: int, seed: int, level: float,
                delta: float, progress: Callable[[int, int], None] | None = None, found: Survey | None = None,
                epsilon_cutoff: float | None = None) -> list[AdversaryCheck]:
    """Check each covered observer of one defense's probe (the family's level already applied).

    ``epsilon_cutoff``: run the ε test of a claim whose one-round ε is at most this (the family
    decides, :func:`family`); None: wherever its ceiling at ``level`` exceeds that ε.
    """
    views = [c.adversary for c in claims]
    checks = {c.adversary: AdversaryCheck(c.adversary, c) for c in claims}
    found = found or survey(probe, views, seed, trials)
    candidates = found.candidates
    ceiling = epsilon_ceiling(trials, level, delta)
    for check in checks.values():
        epsilon = check.claim.round_epsilon
        check.epsilon_ceiling = ceiling
        check.epsilon_test = epsilon is not None and (ceiling > epsilon if epsilon_cutoff is None else epsilon <= epsilon_cutoff)
        check.sigma_tests = sigma_test_count(probe, check.claim, len(candidates))
    replace_views = [v for v in views if checks[v].claim.relation == Relation.REPLACE_ONE]
    rounds = np.array([t % probe.rounds for t in range(trials)])
    others = 0  # participants besides the target, over the trials (the participation test)
    # per candidate and view: ⟨n_t, s_t⟩ and ‖s_t‖ of each trial (the σ tests), and the views themselves
    # only where the ε test needs them
    dots = {(k, v): np.zeros(trials) for k in range(len(candidates)) for v in views}
    norms = {(k, v): np.zeros(trials) for k in range(len(candidates)) for v in views}
    kept: dict[tuple[int, str], tuple[list[np.ndarray], list[np.ndarray]]] = {
        (k, v): ([], []) for k in range(len(candidates)) for v in views if checks[v].epsilon_test}
    for t in range(trials):
        # one trial serves every candidate: its all-zero round is run once (the candidates' tests share
        # their noise, which Bonferroni allows)
        trial = probe.trial(derive_seed(seed, "trial", t), int(rounds[t]))
        zero = _run(probe, None, trial, views, found.shapes)
        others += probe.rows(trial) - 1
        noise = {v: zero[v] - found.centre[v][rounds[t]] for v in views}
        for k, candidate in enumerate(candidates):
            moved = _run(probe, candidate.vector, trial, views, found.shapes)
            # the neighbour: the target switched off, or (replace-one) its negation
            negative = _run(probe, -candidate.vector, trial, views, found.shapes) if replace_views else {}
            for v in views:
                neighbour = negative[v] if v in replace_views else zero[v]
                effect = moved[v] - neighbour
                dots[k, v][t], norms[k, v][t] = float(noise[v] @ effect), float(np.linalg.norm(effect))
                if (k, v) in kept:
                    kept[k, v][0].append(neighbour)
                    kept[k, v][1].append(moved[v])
        if progress is not None:
            progress(t + 1, trials)
    for k, candidate in enumerate(candidates):
        for v in views:
            count, scopes = sigma_scopes(dots[k, v], norms[k, v], rounds, level, checks[v].claim.noise_multiplier)
            bound = (epsilon_bound(np.stack(kept[k, v][0]), np.stack(kept[k, v][1]), level, delta)
                     if (k, v) in kept and count >= MIN_INFLUENTIAL else None)
            pooled = scopes[0]
            checks[v].candidates.append(CandidateResult(candidate.name, count, pooled.multiplier, pooled.interval, bound,
                                                        scopes))
    coined = [v for v in views if coin_test_runs(probe, checks[v].claim)]
    for v, result in (_coins(probe, found, coined, seed, level, trials, checks) if coined else {}).items():
        checks[v].coins = result
    for check in checks.values():
        if participation_test_runs(probe, check.claim):
            _participation(check, others, trials * (probe.contributors - 1), level)
    fresh = [v for v in views if fresh_test_runs(probe, checks[v].claim)]
    if fresh:
        _fresh_noise(probe, found, [checks[v] for v in fresh], seed, level)
    for check in checks.values():
        _verdict(check, level)
    return list(checks.values())


def _coins(probe: ReleaseProbe, found: Survey, views: list[str], seed: int, level: float, trials: int,
           checks: dict[str, AdversaryCheck]) -> dict[str, CandidateResult]:
    """The coin test of a per-weight claim: every coordinate of the target's row is a coin (Steinke,
    Nasr and Jagielski 2023, "Privacy Auditing with One (1) Training Run"). The claim makes the
    release ε-DP for each weight, so a target row with an independent random sign on every
    coordinate, far beyond the range (every clip acts), carries ``dim`` coins a trial — about
    :data:`COINS` over the trials, each trial on its own seed. A coin's score is its view less the
    round's mean view with zero inputs (the survey's separate trials); the one-run count bound
    tests the claim's ε on all coins at once, valid whatever the dependence between coordinates:
    under the claim each coin's influence on the whole release is bounded by ε."""
    magnitude = INPUT_SCALE * max(1.0, probe.bound)
    runs = min(trials, max(1, math.ceil(COINS / probe.dim)))
    scores: dict[str, list[np.ndarray]] = {v: [] for v in views}
    signs: list[np.ndarray] = []
    for t in range(runs):
        trial = probe.trial(derive_seed(seed, "coin", t), t % probe.rounds)
        drawn = numpy_rng(seed, "coin-signs", t).choice([-1.0, 1.0], size=probe.dim)
        seen = _run(probe, torch.as_tensor(drawn * magnitude), trial, views, found.shapes)
        signs.append(drawn)
        for v in views:
            if len(seen[v]) == probe.dim:  # a view not aligned with the input's coordinates has no coins
                scores[v].append(seen[v] - found.centre[v][trial.round])
    inserted = np.concatenate(signs) > 0
    out = {}
    for v in views:
        if scores[v]:
            audit = one_run_audit(np.concatenate(scores[v]), inserted, checks[v].claim.delta, 1.0 - level)
            out[v] = CandidateResult(f"every coordinate a coin, {audit.canaries} coins over {runs} trials: "
                                     f"{audit.correct} of {audit.guesses} guesses right", audit.canaries, None, None,
                                     audit.epsilon)
    return out


def _participation(check: AdversaryCheck, others: int, slots: int, level: float) -> None:
    """Participation against the accounted rate q: in the trials, each client other than the target
    took part ``others`` times of ``slots``; if every client takes part with probability ≤ q
    independently, that count is stochastically at most Binomial(slots, q). More is a sampling
    the claim's amplification (or its bound on the rounds a client joins) does not describe."""
    rate = check.claim.participation_rate
    assert rate is not None
    p = float(stats.binom.sf(others - 1, slots, rate))
    check.participation = {"accounted_rate": rate, "observed_rate": others / slots if slots else 0.0, "p_value": p}
    if p < 1.0 - level:
        check.failures.append(Failure("participation", "every round", "participation",
                                      f"clients took part at rate {others / slots:.3g} ({others} of {slots} draws) where the "
                                      f"claim accounts q = {rate:.3g} (one-sided binomial test, p = {p:.2g})",
                                      -math.log10(max(p, 1e-300)) + math.log10(1.0 - level)))


def _fresh_noise(probe: ReleaseProbe, found: Survey, checks: list[AdversaryCheck], seed: int, level: float) -> None:
    """Noise drawn afresh each round (:func:`audit.core.noise_shape.fresh_noise_p`): pairs of trials
    with one seed and the same participants in consecutive rounds, all contributions zero."""
    views = [c.adversary for c in checks]
    firsts: dict[str, list[np.ndarray]] = {v: [] for v in views}
    seconds: dict[str, list[np.ndarray]] = {v: [] for v in views}
    for i in range(FRESH_PAIRS):
        a = i % probe.rounds
        b = (a + 1) % probe.rounds
        one = probe.trial(derive_seed(seed, "fresh", i), a)
        other = Trial(one.seed, b, one.target, one.participants)
        first, second = _run(probe, None, one, views, found.shapes), _run(probe, None, other, views, found.shapes)
        for v in views:
            firsts[v].append(first[v] - found.centre[v][a])
            seconds[v].append(second[v] - found.centre[v][b])
    for check in checks:
        v = check.adversary
        p = fresh_noise_p(np.stack(firsts[v]).reshape(FRESH_PAIRS, -1), np.stack(seconds[v]).reshape(FRESH_PAIRS, -1))
        check.fresh_p = p
        if p is not None and p < 1.0 - level:
            check.failures.append(Failure("zero inputs", "consecutive rounds", "fresh",
                                          f"the noise of one round repeats in the next (one-sided t-test of the noise "
                                          f"correlation between rounds, same seed and participants: p = {p:.2g}): "
                                          "differences of consecutive releases carry no noise",
                                          -math.log10(max(p, 1e-300)) + math.log10(1.0 - level)))


def _failures(check: AdversaryCheck, level: float) -> list[Failure]:
    claimed = check.claim.noise_multiplier
    out: list[Failure] = list(check.failures)  # the fresh-noise and participation tests
    if claimed is None:
        return sorted(out, key=lambda f: -f.strength)
    for candidate in check.candidates:
        for scope in candidate.scopes:
            where = f"{scope.scope}, {candidate.input}"
            if scope.interval is not None and scope.interval[1] < claimed:
                low, high = scope.interval
                # no noise at all along the effect (σ_eff = 0) is the strongest failure there is
                out.append(Failure(candidate.input, scope.scope, "interval",
                                   f"σ_eff = {scope.multiplier:.4g} [{low:.4g}, {high:.4g}] ({where}) is below the "
                                   f"accounted σ = {claimed:.4g}", claimed / high if high > 0 else math.inf))
            if scope.shortfall_p is not None and scope.shortfall_p < 1.0 - level:
                out.append(Failure(candidate.input, scope.scope, "shortfall",
                                   f"too many trials carry less noise per unit of effect than σ = {claimed:.4g} "
                                   f"(one-sided KS against the half-normal: D⁺ = {scope.shortfall:.3f}, "
                                   f"p = {scope.shortfall_p:.2g}; {where})",
                                   -math.log10(max(scope.shortfall_p, 1e-300)) + math.log10(1.0 - level)))
            if scope.shape_p is not None and scope.shape_p < 1.0 - level:
                out.append(Failure(candidate.input, scope.scope, "shape",
                                   f"the noise has lighter tails than the accounted Gaussian (D'Agostino's kurtosis "
                                   f"test, p = {scope.shape_p:.2g}; {where}): bounded noise has an unbounded privacy loss",
                                   -math.log10(max(scope.shape_p, 1e-300)) + math.log10(1.0 - level)))
    return sorted(out, key=lambda f: -f.strength)


def _verdict(check: AdversaryCheck, level: float) -> None:
    claimed, round_epsilon = check.claim.noise_multiplier, check.claim.round_epsilon
    if claimed is None and round_epsilon is None:
        check.status = UNCHECKED
        check.detail = "the claim states no per-round noise multiplier or one-round ε to check against"
        return
    reasons, remarks = [], []
    worst, strongest = check.worst_multiplier, check.worst_epsilon
    check.failures = _failures(check, level)
    if worst is None and strongest is None and not check.failures:
        check.detail = "the target's contribution never reached this view (no effect to measure)"
        return
    if check.failures:
        shown = [next(f for f in check.failures if f.test == test)
                 for test in ("interval", "shortfall", "shape", "fresh", "participation")
                 if any(f.test == test for f in check.failures)]
        reasons += [f.text for f in shown]
        if len(check.failures) > len(shown):
            reasons.append(f"{len(check.failures)} of {check.sigma_tests} σ tests reject")
    if claimed is not None and worst is not None and worst.interval is not None and not check.failures:
        low, high = worst.interval
        rounds = [s.multiplier for s in worst.scopes[1:] if s.multiplier is not None]
        each = f"; each round ≥ {min(rounds):.4g}" if rounds else ""
        figure = f"σ_eff = {worst.multiplier:.4g} [{low:.4g}, {high:.4g}] ({worst.input}; {worst.scopes[0].scope}{each})"
        if low > claimed:
            remarks.append(f"{figure} lies above the accounted σ = {claimed:.4g}: the claim is conservative")
        elif high >= claimed:
            remarks.append(f"{figure} covers the accounted σ = {claimed:.4g}")
    elif worst is not None and claimed is None:
        remarks.append(f"σ_eff = {worst.multiplier:.4g} ({worst.input}; not a Gaussian claim)")
    if round_epsilon is not None:
        if not check.epsilon_test and check.coins is None:
            remarks.append(f"ε test not run: these trials can show at most ε_LB = {check.epsilon_ceiling:.3g} "
                           f"≤ one-round ε = {round_epsilon:.3g}")
        elif strongest is not None and strongest.epsilon_lower_bound is not None:
            text = f"ε_LB = {strongest.epsilon_lower_bound:.3g} ({strongest.input})"
            if strongest.epsilon_lower_bound > round_epsilon * (1 + 1e-9):
                reasons.append(f"{text} exceeds the one-round ε = {round_epsilon:.3g}")
            else:
                remarks.append(f"{text} ≤ one-round ε = {round_epsilon:.3g}")
    check.status = VIOLATES if reasons else CONFORMS
    check.detail = "; ".join(reasons + remarks)
