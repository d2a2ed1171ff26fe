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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from attacks.mechanism_audits.conformance_checks import (
    CONFORMS,
    NO_PROBE,
    NOT_APPLICABLE,
    UNCHECKED,
    VIOLATES,
    AdversaryCheck,
    Survey,
    audit_probe,
    sigma_test_count,
    survey,
)
from attacks.mechanism_audits.conformance_statistics import epsilon_ceiling
from audit.core.datasets import load_dataset
from audit.core.errors import UserInputError
from audit.core.models import build_model
from audit.core.schema import to_mapping
from audit.core.seeding import derive_seed
from defenses.base import DEFENSES, AccountingSettings, Defense
from defenses.blocks.flat import ParamLayout
from defenses.federated.release_probe import ReleaseProbe, describe_participation
from defenses.federated.training_job import ReleaseAnomaly, TrainingConfig, TrainingJob
from defenses.privacy.claims import AdversaryClaim

#: the audit's task: clients, Poisson rate and rounds of the short run every probe runs
CLIENTS, CLIENT_RATE, ROUNDS = 12, 0.5, 3


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
        return sum(sigma_test_count(self.probe, c, len(self.found.candidates)) for c in self.claims)

    def epsilon_tests(self) -> list[tuple[int, float]]:
        """(candidates, one-round ε) of every observer with an ε to test."""
        if self.found is None:
            return []
        return [(len(self.found.candidates), c.round_epsilon) for c in self.claims if c.round_epsilon is not None]


@contextmanager
def _defense_code(name: str, stage: str) -> Iterator[None]:
    """Run a defense's own code for the audit: an exception it raises — a bug in a user's plugin, or a
    refusal — becomes one line naming the defense, what the audit was doing and the exception's
    message (exit 2), never an internal error. A :class:`ReleaseAnomaly` is a finding, and passes."""
    try:
        yield
    except (ReleaseAnomaly, KeyboardInterrupt):
        raise
    except UserInputError as exc:
        raise UserInputError(f"conformance: defense '{name}' ({stage}): {exc}") from exc
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise UserInputError(f"conformance: defense '{name}' raised {type(exc).__name__} in {stage}: {text}") from exc


def _anomalous(result: DefenseConformance, claims: list[AdversaryClaim], anomaly: ReleaseAnomaly) -> DefenseConformance:
    """The verdict on a release that cannot be the claimed mechanism: every covered observer violates."""
    result.status = VIOLATES
    result.checks = [AdversaryCheck(c.adversary, c, VIOLATES, f"{anomaly}") for c in claims]
    result.note = f"{result.note}; {anomaly}" if result.note else f"{anomaly}"
    return result


def plan_defense(defense: Defense, setup: Setup, trials: int, seed: int,
                 params: dict[str, Any] | None = None) -> DefensePlan:
    """Build the defense's probe on ``setup``'s task, read its claim and survey where the noise is least."""
    name = defense.name or type(defense).__name__
    shown = params if params is not None else to_mapping(asdict(defense.params))
    if not defense.private:
        return DefensePlan(DefenseConformance(name, False, NOT_APPLICABLE, shown, note="non-private: no claim to check"))
    with _defense_code(name, "its release probe (a short run of its rounds)"):
        return _probed(defense, name, shown, setup, trials, seed)


def _probed(defense: Defense, name: str, shown: dict[str, Any], setup: Setup, trials: int, seed: int) -> DefensePlan:
    try:
        probe = defense.audit_hooks().release_probe(setup.job)
    except ReleaseAnomaly as anomaly:  # in the probe's own run: the claim as it stands before any run's data
        claim = defense.bind(ParamLayout.of(setup.job.model_factory())).privacy_claim(
            setup.training, len(setup.job.clients), 1, setup.delta, setup.accounting)
        covered = [a for a in claim.adversaries if a.covered]
        return DefensePlan(_anomalous(DefenseConformance(name, True, VIOLATES, shown), covered, anomaly))
    if probe is None:
        return DefensePlan(DefenseConformance(name, True, NO_PROBE, shown,
                                       note="a private defense without a release probe cannot be audited "
                                            "(AuditHooks.release_probe)"))
    training = probe.training or setup.training
    claim = probe.defense.privacy_claim(training, len(setup.job.clients), 1, setup.delta, setup.accounting, probe.state)
    covered = [a for a in claim.adversaries if a.covered]
    result = DefenseConformance(name, True, CONFORMS, shown,
                                not_covered={a.adversary: a.notes for a in claim.adversaries if not a.covered},
                                note=f"{probe.contributors} contributions of {probe.dim} coordinates ({probe.contribution}); "
                                     f"clip {probe.bound:g}", probed=probe.participation)
    if not covered:
        result.status = NOT_APPLICABLE
        result.note += "; the claim covers no observer (no finite guarantee): nothing to check"
        return DefensePlan(result)
    try:
        found = survey(probe, [c.adversary for c in covered], derive_seed(seed, "conformance", name), trials)
    except ReleaseAnomaly as anomaly:
        return DefensePlan(_anomalous(result, covered, anomaly))
    return DefensePlan(result, probe, covered, found)


def run_plan(plan: DefensePlan, trials: int, seed: int, level: float, delta: float, epsilon_cutoff: float | None,
             progress: Callable[[int, int], None] | None = None) -> DefenseConformance:
    result = plan.result
    if plan.probe is None:
        return result
    try:
        with _defense_code(result.defense, "the audit's trials of its privatisation"):
            result.checks = audit_probe(plan.probe, plan.claims, trials, derive_seed(seed, "conformance", result.defense),
                                        level, delta, progress, plan.found, epsilon_cutoff)
    except ReleaseAnomaly as anomaly:
        return _anomalous(result, plan.claims, anomaly)
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


__all__ = ["CLIENT_RATE", "CLIENTS", "CONFORMS", "NO_PROBE", "NOT_APPLICABLE", "ROUNDS", "UNCHECKED", "VIOLATES",
           "DefenseConformance", "Setup", "audit_defense", "audit_probe", "conformance", "probe_setup", "registered"]
