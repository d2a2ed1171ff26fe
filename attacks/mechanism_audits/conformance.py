"""Conformance audit: does a defense's code release the noise its claim accounts for?

For every observer a claim covers (:mod:`defenses.privacy.claims`), every round of a short run of the
defense's own code (:mod:`defenses.federated.release_probe`) is driven with worst-case neighbouring inputs,
many times, and what that observer sees is measured:

1. **The task.** Digits, a small MLP, :data:`CLIENTS` clients sampled as the defense samples them
   — Poisson at rate :data:`CLIENT_RATE` (fixed-size sampling at that rate where a defense needs a
   fixed round size) — for :data:`ROUNDS` rounds, each trial's participants drawn by the engine's
   sampler from the trial's seed and conditioned on the target taking part, the target a random
   client (so every participant position, first and last included). Trial t probes round
   t mod :data:`ROUNDS` with the engine's context for that round (its global model, learning rate,
   round index: round-dependent noise is exercised as in training).
2. **Neighbours.** All contributions are zero except the target's, which is an input far beyond
   the clip — so every clip the code applies acts — either *concentrated* on one coordinate or
   *spread* evenly over all of them. Under ``zero-out`` and ``add-remove`` claims the neighbour
   has a zero target row (a participant's contribution switched off: for a clipped sum with fixed
   noise the same change as adding or removing it); under ``replace-one`` the negated input.
   Per-weight claims (one coordinate differs) use concentrated inputs only.
3. **Where the noise is least.** A first batch of trials of the all-zero round, spread over the
   rounds, gives each coordinate's noise variance and each round's mean view; a second, with the
   spread input, shows which coordinates the target can move. Concentrated inputs go on the least
   noisy coordinate overall and the least noisy one the target can move — for a defense that
   masks its noise, a coordinate few clients keep.
4. **Coupled trials.** Each trial runs the all-zero round and both neighbours with the same seed
   (same participants, masks and noise), so the neighbours' difference is the target's own effect
   s_t and the all-zero view less its round's mean (from the independent first batch) is pure
   noise n_t. The noise along the effect per unit of it, r_t = ⟨n_t, s_t⟩/‖s_t‖², is N(0, σ_t²)
   for Gaussian noise, with σ_t the trial's effective noise multiplier (the mean taken from other
   trials only adds variance: a conservative error). The claim holds if σ_t ≥ σ for every trial
   (σ the accountant's multiplier for this observer). One trial serves every candidate input: its
   all-zero round is run once, and the candidates' tests share their noise (Bonferroni holds under
   any dependence).
5. **Two tests of σ_t ≥ σ**, per candidate input, on the trials of each round and on all rounds
   pooled (trials where the target moved the view):

   * the χ² interval of σ_eff = √mean(r_t²) (n·σ̂²/σ² ~ χ²_n): *violates* when it lies below σ —
     a noise short of the claim in a whole round, or everywhere;
   * a one-sided Kolmogorov–Smirnov test (Smirnov 1939, the D⁺ statistic) of |r_t|/σ against the
     half-normal law — *violates* when
     a share of the trials carries far less noise per unit of effect than σ (one participant
     position left unclipped), which moves the mean of r_t² little.

   When participation is random the multiplier may vary from trial to trial: the upload of one
   of |P_t| clients carries σ/√|P_t|, which the claim for the server or a local observer bounds by
   its least value σ/√|P|_max (Poisson: the population). The r_t are then a scale mixture, not one
   Gaussian, and σ_eff's interval is not a confidence interval for one σ; both tests stay valid:
   if every σ_t ≥ σ, Σ r_t²/σ² is stochastically larger than a χ²_n variable and each |r_t|/σ
   larger than a half-normal one, so each test rejects with probability at most its level.
   Against the released aggregate (σ on the clipped sum) honest code gives σ_t = σ exactly,
   whatever |P_t|.
6. **Optimal test.** With independent trials of the two neighbours (even trials of one, odd of
   the other), the view projected on the mean effect direction is thresholded on one half and
   counted on the other: a one-sided Clopper–Pearson lower bound on ε at the claim's δ
   (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021), against the one-round ε the claim implies.
   Its ceiling — the bound when every count of the held-out half is perfect — depends only on the
   trial count and the level (:func:`epsilon_ceiling`); where it does not exceed the one-round ε
   the test cannot fire, so it is not run and not counted in the family.
7. **Verdict.** *violates* when any σ test rejects or the ε lower bound exceeds the one-round
   claim; else *conforms* (with a remark when the pooled interval lies above σ: the claim is
   conservative). Every test of one command run is one family: Bonferroni, each at level α/K for
   the K tests actually run (:func:`family`), so a run of correct defenses reports a violation
   with probability ≤ α.

Non-private defenses are *not applicable*; a private defense without a probe (*no probe*), or whose
claim states nothing to check for an observer it covers (*unchecked*), makes the run *unchecked*
— the command exits 1 and the tests fail — so a new defense cannot skip the audit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from audit.core.datasets import load_dataset
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import epsilon_lower_bound, held_out_epsilon_lower_bound
from audit.core.models import build_model
from audit.core.schema import to_mapping
from audit.core.seeding import derive_seed
from audit.core.vocabulary import ConformanceStatus, Relation
from defenses.base import DEFENSES, AccountingSettings, Defense
from defenses.federated.release_probe import ReleaseProbe, Trial, describe_participation
from defenses.federated.training_job import TrainingConfig, TrainingJob
from defenses.privacy.claims import AdversaryClaim

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
#: the σ tests of one scope (a round, or all rounds pooled): the χ² interval and the KS shortfall test
SIGMA_TESTS = 2
#: trials in which the target must move the view before its effect is measured
MIN_INFLUENTIAL = 10
#: the audit's task: clients, Poisson rate and rounds of the short run every probe runs
CLIENTS, CLIENT_RATE, ROUNDS = 12, 0.5, 3
POOLED = "rounds pooled"


@dataclass
class Setup:
    """The small real task every probe runs on: digits, an MLP, ``clients`` clients of 20 records."""

    job: TrainingJob
    training: TrainingConfig
    accounting: AccountingSettings
    delta: float


def probe_setup(seed: int = 0, delta: float = 1e-5, clients: int = 8, client_rate: float = 1.0,
                rounds: int = 1) -> Setup:
    """The task; the defaults (eight clients, every one in its single round) are the one-step task
    other checks use, :func:`conformance` samples :data:`CLIENTS` at :data:`CLIENT_RATE` over
    :data:`ROUNDS` rounds."""
    digits = load_dataset("digits")
    order = np.random.default_rng(derive_seed(seed, "conformance", "split")).permutation(len(digits.train))
    test, pool = order[:200], order[200:200 + 20 * clients]
    pool_x, pool_y = digits.train.features[pool], digits.train.labels[pool]
    training = TrainingConfig(rounds=rounds, client_rate=client_rate, local_steps=1, batch_size=10, lr=0.1)
    shape, classes = tuple(digits.input_shape), digits.num_classes
    job = TrainingJob(lambda: build_model("mlp", shape, classes, {"hidden": [16]}), pool_x, pool_y,
                      [np.arange(20 * i, 20 * (i + 1)) for i in range(clients)],
                      digits.train.features[test], digits.train.labels[test], training, seed=seed, delta=delta)
    return Setup(job, training, AccountingSettings(), delta)


@dataclass
class Candidate:
    name: str
    vector: torch.Tensor


@dataclass
class ScopeResult:
    """The σ tests on the trials of one round (``scope`` "round r"), or of all rounds pooled."""

    scope: str
    influential: int
    multiplier: float | None = None
    interval: tuple[float, float] | None = None
    shortfall: float | None = None  # the one-sided KS statistic D⁺ of |r_t|/σ against the half-normal
    shortfall_p: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "influential_trials": self.influential, "noise_multiplier": self.multiplier,
                "interval": list(self.interval) if self.interval else None, "ks_statistic": self.shortfall,
                "ks_p_value": self.shortfall_p}


@dataclass
class Measurement:
    """What :func:`measure` finds in one candidate's trials for one view: the σ tests of each scope
    (all rounds pooled first) and the ε lower bound (None where not run or nothing moved)."""

    influential: int
    scopes: list[ScopeResult]
    epsilon_lower_bound: float | None

    @property
    def pooled(self) -> ScopeResult:
        return self.scopes[0]


@dataclass
class CandidateResult:
    input: str
    influential: int
    multiplier: float | None
    interval: tuple[float, float] | None
    epsilon_lower_bound: float | None
    scopes: list[ScopeResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"input": self.input, "influential_trials": self.influential, "noise_multiplier": self.multiplier,
                "interval": list(self.interval) if self.interval else None, "epsilon_lower_bound": self.epsilon_lower_bound,
                "scopes": [s.as_dict() for s in self.scopes]}


@dataclass
class Failure:
    """One σ test that rejected: which input and scope, and in words."""

    input: str
    scope: str
    test: str  # "interval" or "shortfall"
    text: str
    strength: float  # for ordering: how far past its level (larger is stronger)

    def as_dict(self) -> dict[str, Any]:
        return {"input": self.input, "scope": self.scope, "test": self.test, "detail": self.text}


@dataclass
class AdversaryCheck:
    adversary: str
    claim: AdversaryClaim
    status: str = CONFORMS
    detail: str = ""
    candidates: list[CandidateResult] = field(default_factory=list)
    #: the ε test: whether it was run, and the largest ε_LB the trial count could ever give
    epsilon_test: bool = False
    epsilon_ceiling: float | None = None
    sigma_tests: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def worst_multiplier(self) -> CandidateResult | None:
        measured = [c for c in self.candidates if c.multiplier is not None]
        return min(measured, key=lambda c: math.inf if c.multiplier is None else c.multiplier) if measured else None

    @property
    def worst_epsilon(self) -> CandidateResult | None:
        measured = [c for c in self.candidates if c.epsilon_lower_bound is not None]
        return max(measured, key=lambda c: -math.inf if c.epsilon_lower_bound is None else c.epsilon_lower_bound) \
            if measured else None

    def as_dict(self) -> dict[str, Any]:
        worst, strongest = self.worst_multiplier, self.worst_epsilon
        claimed = self.claim.noise_multiplier
        within = (None if claimed is None or worst is None or worst.interval is None
                  else bool(worst.interval[0] <= claimed <= worst.interval[1]))
        epsilon_test: dict[str, Any] = {"run": self.epsilon_test, "ceiling": self.epsilon_ceiling}
        if not self.epsilon_test and self.claim.round_epsilon is not None and self.epsilon_ceiling is not None:
            epsilon_test["why_not"] = (f"the trials can show at most ε_LB = {self.epsilon_ceiling:.3g} (every count "
                                       f"perfect) ≤ the one-round ε = {self.claim.round_epsilon:.3g}")
        return {"adversary": self.adversary, "status": self.status, "relation": self.claim.relation,
                "observes": self.claim.observes, "claimed_noise_multiplier": claimed,
                "measured_noise_multiplier": worst.multiplier if worst else None,
                "interval": list(worst.interval) if worst and worst.interval else None,
                "within_interval": within, "worst_input": worst.input if worst else None,
                "claimed_round_epsilon": self.claim.round_epsilon,
                "epsilon_lower_bound": strongest.epsilon_lower_bound if strongest else None,
                "epsilon_input": strongest.input if strongest else None, "epsilon_test": epsilon_test,
                "sigma_tests": self.sigma_tests, "failed_tests": [f.as_dict() for f in self.failures],
                "detail": self.detail, "candidates": [c.as_dict() for c in self.candidates]}


@dataclass
class DefenseConformance:
    defense: str
    private: bool
    status: str
    params: dict[str, Any] = field(default_factory=dict)
    checks: list[AdversaryCheck] = field(default_factory=list)
    not_covered: dict[str, str] = field(default_factory=dict)
    note: str = ""
    probed: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"defense": self.defense, "private": self.private, "status": self.status, "params": self.params,
                "note": self.note, "probed": self.probed, "adversaries": [c.as_dict() for c in self.checks],
                "not_covered": self.not_covered}


# --------------------------------------------------------------------------- statistics


def multiplier_interval(ratios: np.ndarray, level: float) -> tuple[float, tuple[float, float]]:
    """σ̂ = √mean(r²) and its two-sided interval at ``level`` for r_t iid N(0, σ²): n·σ̂²/σ² ~ χ²_n."""
    n = len(ratios)
    mean_square = float(np.mean(ratios ** 2))
    alpha = 1.0 - level
    low = math.sqrt(n * mean_square / stats.chi2.ppf(1 - alpha / 2, n))
    high = math.sqrt(n * mean_square / stats.chi2.ppf(alpha / 2, n))
    return math.sqrt(mean_square), (low, high)


def shortfall_test(ratios: np.ndarray, claimed: float) -> tuple[float, float]:
    """(D⁺, p) of the one-sided Kolmogorov–Smirnov test of |r_t|/σ against the half-normal CDF G.

    The null is that every r_t ~ N(0, σ_t²) with σ_t ≥ σ, independently: each |r_t|/σ is then
    stochastically at least half-normal, so its CDF F_t ≤ G and the empirical CDF lies below that
    of n half-normal draws (couple |r_t|/σ = F_t⁻¹(U_t) ≥ G⁻¹(U_t)); the p-value of the iid case
    is valid. It is small when the empirical CDF exceeds G somewhere: too many small ratios, as
    when a share of the trials carries far less noise per unit of effect than σ.
    """
    result = stats.kstest(np.abs(ratios) / claimed, stats.halfnorm.cdf, alternative="greater")
    return float(result.statistic), float(result.pvalue)


def _halves(trials: int) -> tuple[int, int]:
    """Positives (odd trials) and negatives (even trials) of the held-out half the ε test counts."""
    held_out = range(trials // 2, trials)
    positives = sum(1 for t in held_out if t % 2 == 1)
    return positives, len(held_out) - positives


def epsilon_ceiling(trials: int, level: float, delta: float) -> float:
    """The largest ε lower bound :func:`measure`'s optimal test can report with ``trials`` trials at
    ``level``: every held-out count perfect (all positives above the threshold, no negative)."""
    positives, negatives = _halves(trials)
    return epsilon_lower_bound(positives, 0, 0, negatives, confidence=level, delta=delta)


def _scope(name: str, ratios: np.ndarray, level: float, claimed: float | None) -> ScopeResult:
    if len(ratios) < MIN_INFLUENTIAL:
        return ScopeResult(name, len(ratios))
    multiplier, interval = multiplier_interval(ratios, level)
    result = ScopeResult(name, len(ratios), multiplier, interval)
    if claimed is not None and claimed > 0:
        result.shortfall, result.shortfall_p = shortfall_test(ratios, claimed)
    return result


def sigma_scopes(dots: np.ndarray, norms: np.ndarray, rounds: np.ndarray, level: float,
                 claimed: float | None) -> tuple[int, list[ScopeResult]]:
    """(influential trials, σ tests per scope) from each trial's ⟨n_t, s_t⟩ (``dots``) and ‖s_t‖
    (``norms``): r_t = ⟨n_t, s_t⟩/‖s_t‖² over the trials where the target moved the view. Scopes: all
    rounds pooled, then each round (when there are several)."""
    scale = float(norms.max()) if len(norms) else 0.0
    influential = norms > max(1e-12, 1e-9 * scale)
    ratios = np.zeros(len(norms))
    ratios[influential] = dots[influential] / norms[influential] ** 2
    distinct = sorted(set(rounds.tolist()))
    several = len(distinct) > 1
    scopes = [_scope(POOLED if several or not distinct else f"round {distinct[0] + 1}", ratios[influential], level, claimed)]
    if several:
        scopes += [_scope(f"round {r + 1}", ratios[influential & (rounds == r)], level, claimed) for r in distinct]
    return int(influential.sum()), scopes


def epsilon_bound(neighbour: np.ndarray, moved: np.ndarray, level: float, delta: float) -> float | None:
    """The optimal test's ε lower bound: independent draws (the neighbour's view on even trials, the
    target's on odd ones) projected on the first half's mean effect, the threshold chosen on the first
    half and counted on the second (None when the target moved nothing)."""
    trials = len(neighbour)
    half = trials // 2
    direction = (moved[:half] - neighbour[:half]).mean(0)
    if not np.linalg.norm(direction) > 0:
        return None
    direction = direction / np.linalg.norm(direction)
    center = neighbour.mean(0)

    def scores(rows: range) -> tuple[np.ndarray, np.ndarray]:
        negatives = [(neighbour[t] - center) @ direction for t in rows if t % 2 == 0]
        positives = [(moved[t] - center) @ direction for t in rows if t % 2 == 1]
        return np.r_[positives, negatives], np.r_[np.ones(len(positives)), np.zeros(len(negatives))]

    calibration, calibration_labels = scores(range(half))
    test, test_labels = scores(range(half, trials))
    # exact plateaus (two-point outputs) carry rounding noise in their last bits; a threshold search
    # would exploit that artefact rather than the mechanism
    return held_out_epsilon_lower_bound(np.round(calibration, 9), calibration_labels, np.round(test, 9), test_labels,
                                        level, delta).value


def measure(neighbour: np.ndarray, moved: np.ndarray, level: float, delta: float, *, noise: np.ndarray | None = None,
            rounds: np.ndarray | None = None, claimed: float | None = None, epsilon_test: bool = True) -> Measurement:
    """The σ tests and the ε lower bound of coupled trials: ``moved[t]`` is the view with the target's
    input, ``neighbour[t]`` that of its neighbour and ``noise[t]`` the noise of trial t's view (the
    all-zero view less its mean; default ``neighbour`` itself, exact for a mean-zero neighbour), all
    with trial t's seed; ``rounds[t]`` is trial t's round."""
    effect = moved - neighbour
    noise = neighbour if noise is None else noise
    rounds = np.zeros(len(moved), dtype=int) if rounds is None else np.asarray(rounds)
    count, scopes = sigma_scopes(np.einsum("tk,tk->t", noise, effect), np.linalg.norm(effect, axis=1), rounds, level,
                                 claimed)
    bound = epsilon_bound(neighbour, moved, level, delta) if epsilon_test and count >= MIN_INFLUENTIAL else None
    return Measurement(count, scopes, bound)


# --------------------------------------------------------------------------- the audit


def _scopes(probe: ReleaseProbe) -> int:
    """σ-test scopes per candidate: each round, and all rounds pooled when there are several."""
    return probe.rounds + (1 if probe.rounds > 1 else 0)


@dataclass
class Survey:
    """The first batches of trials: the candidate inputs, and each view's mean per round (zero inputs)."""

    candidates: list[Candidate]
    centre: dict[str, np.ndarray]  # view → [rounds, k]


def _run(probe: ReleaseProbe, target: torch.Tensor | None, trial: Trial, views: list[str]) -> dict[str, np.ndarray]:
    inputs = torch.zeros(probe.rows(trial), probe.dim, dtype=torch.float64)
    if target is not None:
        inputs[trial.target] = target
    observed = probe.observe(inputs, trial)
    return {v: observed[v].numpy() for v in views}


def survey(probe: ReleaseProbe, views: list[str], seed: int, trials: int) -> Survey:
    """Spread input and concentrated inputs where the noise is least (overall, and where the target
    acts), from all-zero trials spread over the rounds (which also give each round's mean view)."""
    magnitude = INPUT_SCALE * max(1.0, probe.bound)
    spread = torch.full((probe.dim,), magnitude / math.sqrt(probe.dim), dtype=torch.float64)
    per_round = max(30, trials // (4 * probe.rounds))
    samples: list[list[dict[str, np.ndarray]]] = [[] for _ in range(probe.rounds)]
    for t in range(per_round * probe.rounds):
        trial = probe.trial(derive_seed(seed, "variance", t), t % probe.rounds)
        samples[trial.round].append(_run(probe, None, trial, views))
    centre = {v: np.stack([np.mean([s[v] for s in rows], axis=0) for rows in samples]) for v in views}
    # a coordinate quiet in any one round is a candidate: noise may be short in one round only
    variance = {v: np.min(np.stack([np.var(np.stack([s[v] for s in rows]), axis=0) for rows in samples]), axis=0)
                for v in views}
    moved = {v: np.zeros_like(variance[v], dtype=bool) for v in views}
    for t in range(16):
        trial = probe.trial(derive_seed(seed, "influence", t), t % probe.rounds)
        base, shifted = _run(probe, None, trial, views), _run(probe, spread, trial, views)
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
    return Survey(out[:CANDIDATES], centre)


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
        check.sigma_tests = (len(candidates) * SIGMA_TESTS * _scopes(probe)) if check.claim.noise_multiplier is not None else 0
    replace_views = [v for v in views if checks[v].claim.relation == Relation.REPLACE_ONE]
    rounds = np.array([t % probe.rounds for t in range(trials)])
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
        zero = _run(probe, None, trial, views)
        noise = {v: zero[v] - found.centre[v][rounds[t]] for v in views}
        for k, candidate in enumerate(candidates):
            moved = _run(probe, candidate.vector, trial, views)
            # the neighbour: the target switched off, or (replace-one) its negation
            negative = _run(probe, -candidate.vector, trial, views) if replace_views else {}
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
    for check in checks.values():
        _verdict(check, level)
    return list(checks.values())


def _failures(check: AdversaryCheck, level: float) -> list[Failure]:
    claimed = check.claim.noise_multiplier
    out: list[Failure] = []
    if claimed is None:
        return out
    for candidate in check.candidates:
        for scope in candidate.scopes:
            where = f"{scope.scope}, {candidate.input}"
            if scope.interval is not None and scope.interval[1] < claimed:
                low, high = scope.interval
                out.append(Failure(candidate.input, scope.scope, "interval",
                                   f"σ_eff = {scope.multiplier:.4g} [{low:.4g}, {high:.4g}] ({where}) is below the "
                                   f"accounted σ = {claimed:.4g}", claimed / high))
            if scope.shortfall_p is not None and scope.shortfall_p < 1.0 - level:
                out.append(Failure(candidate.input, scope.scope, "shortfall",
                                   f"too many trials carry less noise per unit of effect than σ = {claimed:.4g} "
                                   f"(one-sided KS against the half-normal: D⁺ = {scope.shortfall:.3f}, "
                                   f"p = {scope.shortfall_p:.2g}; {where})",
                                   -math.log10(max(scope.shortfall_p, 1e-300)) + math.log10(1.0 - level)))
    return sorted(out, key=lambda f: -f.strength)


def _verdict(check: AdversaryCheck, level: float) -> None:
    claimed, round_epsilon = check.claim.noise_multiplier, check.claim.round_epsilon
    if claimed is None and round_epsilon is None:
        check.status = UNCHECKED
        check.detail = "the claim states no per-round noise multiplier or one-round ε to check against"
        return
    reasons, remarks = [], []
    worst, strongest = check.worst_multiplier, check.worst_epsilon
    if worst is None and strongest is None:
        check.detail = "the target's contribution never reached this view (no effect to measure)"
        return
    check.failures = _failures(check, level)
    if check.failures:
        shown = [next(f for f in check.failures if f.test == test) for test in ("interval", "shortfall")
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
        if not check.epsilon_test:
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


# --------------------------------------------------------------------------- one command run


@dataclass
class DefensePlan:
    """One defense before its trials: the result so far, its probe, the observers to check, its survey."""

    result: DefenseConformance
    probe: ReleaseProbe | None = None
    claims: list[AdversaryClaim] = field(default_factory=list)
    found: Survey | None = None

    def sigma_tests(self) -> int:
        if self.probe is None or self.found is None:
            return 0
        return sum(len(self.found.candidates) * SIGMA_TESTS * _scopes(self.probe)
                   for c in self.claims if c.noise_multiplier is not None)

    def epsilon_tests(self) -> list[tuple[int, float]]:
        """(candidates, one-round ε) of every observer with an ε to test."""
        if self.found is None:
            return []
        return [(len(self.found.candidates), c.round_epsilon) for c in self.claims if c.round_epsilon is not None]


def plan_defense(defense: Defense, setup: Setup, trials: int, seed: int,
                 params: dict[str, Any] | None = None) -> DefensePlan:
    """Build the defense's probe on ``setup``'s task, read its claim and survey where the noise is least."""
    name = defense.name or type(defense).__name__
    shown = params if params is not None else to_mapping(asdict(defense.params))
    if not defense.private:
        return DefensePlan(DefenseConformance(name, False, NOT_APPLICABLE, shown, note="non-private: no claim to check"))
    probe = defense.release_probe(setup.job)
    if probe is None:
        return DefensePlan(DefenseConformance(name, True, NO_PROBE, shown,
                                       note="a private defense without a release probe cannot be audited "
                                            "(Defense.release_probe)"))
    training = probe.training or setup.training
    claim = probe.defense.privacy_claim(training, len(setup.job.clients), 1, setup.delta, setup.accounting)
    covered = [a for a in claim.adversaries if a.covered]
    result = DefenseConformance(name, True, CONFORMS, shown,
                                not_covered={a.adversary: a.notes for a in claim.adversaries if not a.covered},
                                note=f"{probe.contributors} contributions of {probe.dim} coordinates ({probe.contribution}); "
                                     f"clip {probe.bound:g}", probed=probe.participation)
    if not covered:
        result.status = NOT_APPLICABLE
        result.note += "; the claim covers no observer (no finite guarantee): nothing to check"
        return DefensePlan(result)
    found = survey(probe, [c.adversary for c in covered], derive_seed(seed, "conformance", name), trials)
    return DefensePlan(result, probe, covered, found)


def run_plan(plan: DefensePlan, trials: int, seed: int, level: float, delta: float, epsilon_cutoff: float | None,
             progress: Callable[[int, int], None] | None = None) -> DefenseConformance:
    result = plan.result
    if plan.probe is None:
        return result
    result.checks = audit_probe(plan.probe, plan.claims, trials, derive_seed(seed, "conformance", result.defense), level,
                                delta, progress, plan.found, epsilon_cutoff)
    statuses = {c.status for c in result.checks}
    result.status = VIOLATES if VIOLATES in statuses else UNCHECKED if UNCHECKED in statuses else CONFORMS
    return result


def audit_defense(defense: Defense, setup: Setup, trials: int, seed: int, level: float,
                  params: dict[str, Any] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> DefenseConformance:
    """The conformance of one defense instance (registered or not) on ``setup``'s task, at ``level``
    (ε tests run wherever their ceiling at that level exceeds the one-round ε)."""
    return run_plan(plan_defense(defense, setup, trials, seed, params), trials, seed, level, setup.delta, None, progress)


@dataclass
class Family:
    """The tests of one run: K = σ tests + ε tests, each at ``level`` = 1 − α/K; the ε tests run for
    one-round ε up to ``epsilon_cutoff`` (None: none runs), below ``epsilon_ceiling``."""

    sigma_tests: int
    epsilon_tests: int
    level: float
    epsilon_cutoff: float | None
    epsilon_ceiling: float

    @property
    def size(self) -> int:
        return max(1, self.sigma_tests + self.epsilon_tests)


def family(plans: list[DefensePlan], trials: int, alpha: float, delta: float) -> Family:
    """The tests one run actually runs, and their level.

    σ tests: per covered Gaussian observer, candidate and scope, the χ² interval and the KS test.
    ε tests: one per observer with a one-round ε and candidate, but only where the optimal test can
    fire: its ceiling (:func:`epsilon_ceiling`, at the family's own level) must exceed that ε. The
    ceiling falls as K grows, so the largest one-round ε are dropped until every ε kept lies below
    the ceiling at the level the kept tests give; the cutoff is the largest ε kept. Which tests run
    depends on the claims, the candidates and the trial count only, never on the trials' outcomes
    (the candidates come from separate trials), so the family is fixed before its data are seen.
    """
    sigma = sum(p.sigma_tests() for p in plans)
    kept = sorted((e for p in plans for e in p.epsilon_tests()), key=lambda entry: entry[1])
    while True:
        epsilon = sum(n for n, _ in kept)
        level = 1.0 - alpha / max(1, sigma + epsilon)
        ceiling = epsilon_ceiling(trials, level, delta)
        if not kept or kept[-1][1] < ceiling:
            return Family(sigma, epsilon, level, kept[-1][1] if kept else None, ceiling)
        largest = kept[-1][1]
        kept = [(n, e) for n, e in kept if e < largest]


def conformance(defenses: list[Defense], trials: int = 2000, seed: int = 0, alpha: float = 0.05, delta: float = 1e-5,
                params: list[dict[str, Any] | None] | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Audit ``defenses`` as one family; the document ``dpfl-audit conformance --json`` prints."""
    setup = probe_setup(seed, delta, CLIENTS, CLIENT_RATE, ROUNDS)
    plans = [plan_defense(defense, setup, trials, seed, params[i] if params else None) for i, defense in enumerate(defenses)]
    tests = family(plans, trials, alpha, delta)
    results = []
    for plan in plans:
        report = None if progress is None else (lambda done, total, name=plan.result.defense: progress(name, done, total))
        results.append(run_plan(plan, trials, seed, tests.level, delta, tests.epsilon_cutoff, report))
    statuses = [r.status for r in results]
    return {
        "trials": trials, "seed": seed, "alpha": alpha, "family_size": tests.size, "level": tests.level, "delta": delta,
        "sigma_tests": tests.sigma_tests, "epsilon_tests": tests.epsilon_tests, "epsilon_ceiling": tests.epsilon_ceiling,
        "rounds": ROUNDS, "clients": CLIENTS, "client_rate": CLIENT_RATE,
        "task": f"digits, MLP 64-16-10, {CLIENTS} clients of 20 records",
        "participation": describe_participation(setup.training, CLIENTS),
        "status": VIOLATES if VIOLATES in statuses else UNCHECKED if {NO_PROBE, UNCHECKED} & set(statuses) else CONFORMS,
        "defenses": [r.as_dict() for r in results],
    }


def registered(names: list[str]) -> list[type[Defense]]:
    import defenses.catalog  # noqa: F401  (registers every defense)

    return [DEFENSES.get(n, "defense") for n in names]
