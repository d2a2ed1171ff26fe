"""Conformance audit: does a defense's code release the noise its claim accounts for?

For every observer a claim covers (:mod:`defenses.claims`), one round of the defense's own code
(:mod:`defenses.release_probe`) is run on worst-case neighbouring inputs, many times, and what
that observer sees is measured (``../shared/specs/auditing.md`` §2):

1. **Neighbours.** All contributions are zero except the target's (row 0), which is an input far
   beyond the clip — so every clip the code applies acts — either *concentrated* on one
   coordinate or *spread* evenly over all of them. Under ``zero-out`` and ``add-remove`` claims the
   neighbour has a zero target row (a participant's contribution switched off: for a clipped sum
   with fixed noise the same change as adding or removing it); under ``replace-one`` the negated
   input. Per-weight claims (one coordinate differs) use concentrated inputs only.
2. **Where the noise is least.** A first batch of trials of the all-zero round gives each
   coordinate's noise variance; a second, with the spread input, shows which coordinates the
   target can move. Concentrated inputs go on the least noisy coordinate overall and the least
   noisy one the target can move — for a defense that masks its noise, a coordinate few clients
   keep.
3. **Coupled trials.** Each trial runs both neighbours with the same seed (same masks, same
   noise), so their difference is the target's own effect s_t and the all-zero run is pure noise
   n_t. The effective noise multiplier is the noise along the target's effect per unit of it,
   σ_eff² = mean_t (⟨n_t, s_t⟩/‖s_t‖²)² over the trials where the target moved the view — for
   Gaussian noise a χ² variable, hence an exact two-sided interval. A masked defense shows up
   here: on a coordinate kept by few clients the noise per unit of effect is small.
4. **Optimal test.** With independent trials of the two neighbours (even trials of one, odd of the
   other), the view projected on the mean effect direction is thresholded on one half and counted
   on the other: a one-sided Clopper–Pearson lower bound on ε at the claim's δ (Jagielski, Ullman,
   Oprea 2020; Nasr et al. 2021), against the one-round ε the claim implies.
5. **Verdict.** *violates* when the noise multiplier's interval lies below the one the accountant
   assumes, or the ε lower bound exceeds the one-round claim; else *conforms* (with a remark when
   the interval lies above: the claim is conservative). Every interval and bound of one command
   run is one family: Bonferroni, each at level α/K for K tests, so a run of correct defenses
   reports a violation with probability ≤ α.

Non-private defenses are *not applicable*; a private defense without a probe (*no probe*), or whose
claim states nothing to check for an observer it covers (*unchecked*), makes the run *unchecked*
— the command exits 1 and the tests fail — so a new defense cannot skip the audit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats

from audit.core.datasets import load_dataset
from audit.core.metrics import held_out_epsilon_lower_bound
from audit.core.models import build_model
from audit.core.schema import to_mapping
from audit.core.seeding import derive_seed
from defenses.base import DEFENSES, AccountingSettings, Defense
from defenses.claims import AdversaryClaim
from defenses.release_probe import ReleaseProbe
from defenses.training_job import TrainingConfig, TrainingJob

CONFORMS, VIOLATES, NOT_APPLICABLE = "conforms", "violates", "not applicable"
#: a private defense the audit cannot check: no release probe, or a covered observer whose claim
#: states neither a per-round noise multiplier nor a one-round ε
NO_PROBE, UNCHECKED = "no probe", "unchecked"
#: how far beyond the clip the audit's inputs lie (every clip must act)
INPUT_SCALE = 1000.0
#: candidate inputs per observer, counted in the family size
CANDIDATES = 3
#: tests per candidate: the noise multiplier's interval and the ε lower bound
TESTS = 2
#: trials in which the target must move the view before its effect is measured
MIN_INFLUENTIAL = 10


@dataclass
class Setup:
    """The small real task every probe runs on: digits, an MLP, eight clients, every client every round."""

    job: TrainingJob
    training: TrainingConfig
    accounting: AccountingSettings
    delta: float


def probe_setup(seed: int = 0, delta: float = 1e-5, clients: int = 8) -> Setup:
    digits = load_dataset("digits")
    order = np.random.default_rng(derive_seed(seed, "conformance", "split")).permutation(len(digits.train))
    test, pool = order[:200], order[200:200 + 20 * clients]
    pool_x, pool_y = digits.train.features[pool], digits.train.labels[pool]
    training = TrainingConfig(rounds=1, client_rate=1.0, local_steps=1, batch_size=10, lr=0.1)
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
class CandidateResult:
    input: str
    influential: int
    multiplier: float | None
    interval: tuple[float, float] | None
    epsilon_lower_bound: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"input": self.input, "influential_trials": self.influential, "noise_multiplier": self.multiplier,
                "interval": list(self.interval) if self.interval else None, "epsilon_lower_bound": self.epsilon_lower_bound}


@dataclass
class AdversaryCheck:
    adversary: str
    claim: AdversaryClaim
    status: str = CONFORMS
    detail: str = ""
    candidates: list[CandidateResult] = field(default_factory=list)

    @property
    def worst_multiplier(self) -> CandidateResult | None:
        measured = [c for c in self.candidates if c.multiplier is not None]
        return min(measured, key=lambda c: c.multiplier) if measured else None

    @property
    def worst_epsilon(self) -> CandidateResult | None:
        measured = [c for c in self.candidates if c.epsilon_lower_bound is not None]
        return max(measured, key=lambda c: c.epsilon_lower_bound) if measured else None

    def as_dict(self) -> dict[str, Any]:
        worst, strongest = self.worst_multiplier, self.worst_epsilon
        claimed = self.claim.noise_multiplier
        within = (None if claimed is None or worst is None or worst.interval is None
                  else bool(worst.interval[0] <= claimed <= worst.interval[1]))
        return {"adversary": self.adversary, "status": self.status, "relation": self.claim.relation,
                "observes": self.claim.observes, "claimed_noise_multiplier": claimed,
                "measured_noise_multiplier": worst.multiplier if worst else None,
                "interval": list(worst.interval) if worst and worst.interval else None,
                "within_interval": within, "worst_input": worst.input if worst else None,
                "claimed_round_epsilon": self.claim.round_epsilon,
                "epsilon_lower_bound": strongest.epsilon_lower_bound if strongest else None,
                "epsilon_input": strongest.input if strongest else None,
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

    def as_dict(self) -> dict[str, Any]:
        return {"defense": self.defense, "private": self.private, "status": self.status, "params": self.params,
                "note": self.note, "adversaries": [c.as_dict() for c in self.checks], "not_covered": self.not_covered}


# --------------------------------------------------------------------------- statistics


def multiplier_interval(ratios: np.ndarray, level: float) -> tuple[float, tuple[float, float]]:
    """σ̂ = √mean(r²) and its two-sided interval at ``level`` for r_t iid N(0, σ²): n·σ̂²/σ² ~ χ²_n."""
    n = len(ratios)
    mean_square = float(np.mean(ratios ** 2))
    alpha = 1.0 - level
    low = math.sqrt(n * mean_square / stats.chi2.ppf(1 - alpha / 2, n))
    high = math.sqrt(n * mean_square / stats.chi2.ppf(alpha / 2, n))
    return math.sqrt(mean_square), (low, high)


def measure(zero: np.ndarray, moved: np.ndarray, level: float, delta: float) -> tuple[int, float | None,
                                                                                   tuple[float, float] | None, float | None]:
    """(influential trials, σ_eff, its interval, ε lower bound) of coupled trials: ``zero[t]`` is the view
    of the all-zero neighbour and ``moved[t]`` of the other, both with trial t's seed."""
    effect = moved - zero
    norms = np.linalg.norm(effect, axis=1)
    scale = float(norms.max()) if len(norms) else 0.0
    influential = norms > max(1e-12, 1e-9 * scale)
    count = int(influential.sum())
    if count < MIN_INFLUENTIAL:
        return count, None, None, None
    noise = zero - zero.mean(0)
    ratios = np.einsum("tk,tk->t", noise[influential], effect[influential]) / norms[influential] ** 2
    multiplier, interval = multiplier_interval(ratios, level)
    trials = len(zero)
    half = trials // 2
    direction = effect[:half].mean(0)
    if not np.linalg.norm(direction) > 0:
        return count, multiplier, interval, None
    direction = direction / np.linalg.norm(direction)
    center = zero.mean(0)

    def scores(rows: range) -> tuple[np.ndarray, np.ndarray]:
        # independent draws: the zero neighbour on even trials, the other on odd ones
        negatives = [(zero[t] - center) @ direction for t in rows if t % 2 == 0]
        positives = [(moved[t] - center) @ direction for t in rows if t % 2 == 1]
        return np.r_[positives, negatives], np.r_[np.ones(len(positives)), np.zeros(len(negatives))]

    calibration, calibration_labels = scores(range(half))
    test, test_labels = scores(range(half, trials))
    # exact plateaus (two-point outputs) carry rounding noise in their last bits; a threshold search
    # would exploit that artefact rather than the mechanism
    bound = held_out_epsilon_lower_bound(np.round(calibration, 9), calibration_labels, np.round(test, 9), test_labels,
                                         level, delta).value
    return count, multiplier, interval, bound


# --------------------------------------------------------------------------- the audit


def _run(probe: ReleaseProbe, inputs: torch.Tensor, seed: int, views: list[str]) -> dict[str, np.ndarray]:
    observed = probe.views(inputs, seed)
    return {v: observed[v].numpy() for v in views}


def _candidates(probe: ReleaseProbe, views: list[str], seed: int, trials: int) -> list[Candidate]:
    """Spread input and concentrated inputs where the noise is least (overall, and where the target acts)."""
    zeros = torch.zeros(probe.contributors, probe.dim, dtype=torch.float64)
    magnitude = INPUT_SCALE * max(1.0, probe.bound)
    spread = torch.full((probe.dim,), magnitude / math.sqrt(probe.dim), dtype=torch.float64)
    probes = max(50, trials // 8)
    variance = {v: [] for v in views}
    samples = [_run(probe, zeros, derive_seed(seed, "variance", t), views) for t in range(probes)]
    for v in views:
        variance[v] = np.var(np.stack([s[v] for s in samples]), axis=0)
    moved = {v: np.zeros_like(variance[v], dtype=bool) for v in views}
    with_spread = zeros.clone()
    with_spread[0] = spread
    for t in range(16):
        key = derive_seed(seed, "influence", t)
        base, shifted = _run(probe, zeros, key, views), _run(probe, with_spread, key, views)
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
    return out[:CANDIDATES]


def audit_probe(probe: ReleaseProbe, claims: list[AdversaryClaim], trials: int, seed: int, level: float,
                delta: float, progress: Callable[[int, int], None] | None = None) -> list[AdversaryCheck]:
    """Check each covered observer of one defense's probe (the family's level already applied)."""
    views = [c.adversary for c in claims]
    checks = {c.adversary: AdversaryCheck(c.adversary, c) for c in claims}
    candidates = _candidates(probe, views, seed, trials)
    zeros = torch.zeros(probe.contributors, probe.dim, dtype=torch.float64)
    for k, candidate in enumerate(candidates):
        relation = {c.adversary: c.relation for c in claims}
        moved_inputs = zeros.clone()
        moved_inputs[0] = candidate.vector
        # the neighbour: the target switched off, or (replace-one) its negation
        negated = zeros.clone()
        negated[0] = -candidate.vector
        zero_rows: dict[str, list[np.ndarray]] = {v: [] for v in views}
        moved_rows: dict[str, list[np.ndarray]] = {v: [] for v in views}
        replace_views = [v for v in views if relation[v] == "replace-one"]
        for t in range(trials):
            key = derive_seed(seed, "trial", k, t)
            moved = _run(probe, moved_inputs, key, views)
            zero = _run(probe, zeros, key, views) if len(replace_views) < len(views) else {}
            negative = _run(probe, negated, key, views) if replace_views else {}
            for v in views:
                zero_rows[v].append(negative[v] if v in replace_views else zero[v])
                moved_rows[v].append(moved[v])
            if progress is not None:
                progress(k * trials + t + 1, len(candidates) * trials)
        for v in views:
            count, multiplier, interval, bound = measure(np.stack(zero_rows[v]), np.stack(moved_rows[v]), level, delta)
            checks[v].candidates.append(CandidateResult(candidate.name, count, multiplier, interval, bound))
    for check in checks.values():
        _verdict(check)
    return list(checks.values())


def _verdict(check: AdversaryCheck) -> None:
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
    if claimed is not None and worst is not None and worst.interval is not None:
        low, high = worst.interval
        figure = f"σ_eff = {worst.multiplier:.4g} [{low:.4g}, {high:.4g}] ({worst.input})"
        if high < claimed:
            reasons.append(f"{figure} is below the accounted σ = {claimed:.4g}")
        elif low > claimed:
            remarks.append(f"{figure} lies above the accounted σ = {claimed:.4g}: the claim is conservative")
        else:
            remarks.append(f"{figure} covers the accounted σ = {claimed:.4g}")
    elif worst is not None:
        remarks.append(f"σ_eff = {worst.multiplier:.4g} ({worst.input}; not a Gaussian claim)")
    if round_epsilon is not None and strongest is not None:
        text = f"ε_LB = {strongest.epsilon_lower_bound:.3g} ({strongest.input})"
        if strongest.epsilon_lower_bound > round_epsilon * (1 + 1e-9):
            reasons.append(f"{text} exceeds the one-round ε = {round_epsilon:.3g}")
        else:
            remarks.append(f"{text} ≤ one-round ε = {round_epsilon:.3g}")
    check.status = VIOLATES if reasons else CONFORMS
    check.detail = "; ".join(reasons + remarks)


def audit_defense(defense: Defense, setup: Setup, trials: int, seed: int, level: float,
                  params: dict[str, Any] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> DefenseConformance:
    """The conformance of one defense instance (registered or not) on ``setup``'s task."""
    name = defense.name or type(defense).__name__
    shown = params if params is not None else to_mapping(asdict(defense.params))
    if not defense.private:
        return DefenseConformance(name, False, NOT_APPLICABLE, shown, note="non-private: no claim to check")
    probe = defense.release_probe(setup.job)
    if probe is None:
        return DefenseConformance(name, True, NO_PROBE, shown,
                                  note="a private defense without a release probe cannot be audited (Defense.release_probe)")
    claim = probe.defense.privacy_claim(setup.training, len(setup.job.clients), 1, setup.delta, setup.accounting)
    covered = [a for a in claim.adversaries if a.covered]
    result = DefenseConformance(name, True, CONFORMS, shown,
                                not_covered={a.adversary: a.notes for a in claim.adversaries if not a.covered},
                                note=f"{probe.contributors} contributions of {probe.dim} coordinates ({probe.contribution}); "
                                     f"clip {probe.bound:g}")
    if not covered:
        result.status = NOT_APPLICABLE
        result.note += "; the claim covers no observer (no finite guarantee): nothing to check"
        return result
    result.checks = audit_probe(probe, covered, trials, derive_seed(seed, "conformance", name), level, setup.delta, progress)
    statuses = {c.status for c in result.checks}
    result.status = VIOLATES if VIOLATES in statuses else UNCHECKED if UNCHECKED in statuses else CONFORMS
    return result


def family_size(defenses: list[Defense], setup: Setup) -> int:
    """Tests in one run: covered observers × candidate inputs × tests, over every private defense (an upper bound)."""
    observers = 0
    for defense in defenses:
        if defense.private:
            observers += 3
    return max(1, observers * CANDIDATES * TESTS)


def conformance(defenses: list[Defense], trials: int = 2000, seed: int = 0, alpha: float = 0.05, delta: float = 1e-5,
                params: list[dict[str, Any] | None] | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Audit ``defenses`` as one family; the document ``dpfl-audit conformance --json`` prints."""
    setup = probe_setup(seed, delta)
    family = family_size(defenses, setup)
    level = 1.0 - alpha / family
    results = []
    for i, defense in enumerate(defenses):
        report = None if progress is None else (lambda done, total, name=defense.name: progress(name, done, total))
        results.append(audit_defense(defense, setup, trials, seed, level, params[i] if params else None, report))
    statuses = [r.status for r in results]
    return {
        "trials": trials, "seed": seed, "alpha": alpha, "family_size": family, "level": level, "delta": delta,
        "task": "digits, MLP 64-16-10, 8 clients of 20 records, every client in the round",
        "status": VIOLATES if VIOLATES in statuses else UNCHECKED if {NO_PROBE, UNCHECKED} & set(statuses) else CONFORMS,
        "defenses": [r.as_dict() for r in results],
    }


def registered(names: list[str]) -> list[type[Defense]]:
    import defenses.catalog  # noqa: F401  (registers every defense)

    return [DEFENSES.get(n, "defense") for n in names]
