"""What the conformance audit's checks find (:mod:`attacks.mechanism_audits.conformance_checks`):
the candidate inputs and what each showed, the tests that rejected, and one observer's check as
the report prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attacks.mechanism_audits.conformance_statistics import ScopeResult
from audit.core.vocabulary import ConformanceStatus
from defenses.privacy.claims import AdversaryClaim

if TYPE_CHECKING:
    import torch

CONFORMS = ConformanceStatus.CONFORMS


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
    test: str  # "interval", "shortfall", "shape", "fresh" or "participation"
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
    #: p of the fresh-noise test (None: not run) and the participation test's figures (None: not run)
    fresh_p: float | None = None
    participation: dict[str, float] | None = None
    #: the coin test of a per-weight claim (None: not run): every coordinate of a trial's row a coin
    coins: CandidateResult | None = None

    @property
    def worst_multiplier(self) -> CandidateResult | None:
        measured = [c for c in self.candidates if c.multiplier is not None]
        return min(measured, key=lambda c: math.inf if c.multiplier is None else c.multiplier) if measured else None

    @property
    def worst_epsilon(self) -> CandidateResult | None:
        measured = [c for c in (*self.candidates, *([self.coins] if self.coins else [])) if c.epsilon_lower_bound is not None]
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
                "fresh_noise_p_value": self.fresh_p, "participation": self.participation,
                "detail": self.detail, "candidates": [c.as_dict() for c in self.candidates],
                "coin_test": self.coins.as_dict() if self.coins else None}
