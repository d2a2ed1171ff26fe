"""Audit one clipped-and-noised step of an additive mechanism with the optimal test.

Two neighbouring inputs differ by one record whose clipped gradient is the canary v (‖v‖ = C in
the clip norm); everything else is known to the auditor and cancels, so the outputs are

    y = v + Z  (canary in)    or    y = Z  (canary out),    Z_j i.i.d. from the mechanism (sensitivity C).

The Neyman–Pearson-optimal statistic is the log-likelihood ratio Σ_j log f(y_j − v_j) − log f(y_j).
Two canaries are tried: *concentrated* on one coordinate (the one-dimensional case the paper
accounts for) and *spread* evenly over all d coordinates (same ℓ2 norm — the case the paper's
1-D accounting misses for Laplace and Staircase noise). The threshold is chosen on one half of
the trials and the counts come from the other half; the ε lower bound is one-sided
Clopper–Pearson; with both canaries each bound is at 1 − (1 − ``confidence``)/2, so the larger
one reported holds at ``confidence``. A lower bound above the claimed ε is a violation: the claim
(or its implementation) is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import held_out_epsilon_lower_bound
from audit.core.seeding import torch_generator
from defenses.blocks.harmonizer import ACCOUNTINGS, epsilon
from defenses.blocks.ldp import two_point
from defenses.blocks.mechanisms import CLIP_NORMS, MECHANISMS, Mechanism, make_mechanism

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

CANARIES = ("both", "concentrated", "spread")
#: most noise draws one spread-canary audit may take, --trials × --dim (the default is 10⁸, about
#: 5 s on a laptop core): checked before sampling, so a typo is refused at once, not after minutes
MAX_TRIAL_COORDINATES = 10**9
#: most noise draws held in memory at once (32 MiB of float64), whatever the dimension
CHUNK_ELEMENTS = 1 << 22


@dataclass
class MechanismCanary:
    canary: str
    epsilon_lower_bound: float


def canary_vector(kind: str, clip: float, dim: int, clip_norm: str) -> np.ndarray:
    vector = np.zeros(dim)
    if kind == "concentrated":
        vector[0] = clip
    elif clip_norm == "l2":
        vector[:] = clip / math.sqrt(dim)
    else:
        vector[:] = clip / dim
    return vector


def likelihood_ratio_scores(mechanism: Mechanism, canary: np.ndarray, trials: int, clip: float, seed: int, label: str,
                            with_canary: bool, chunk: int = 4096) -> np.ndarray:
    """LLR scores of ``trials`` outputs; only coordinates where the canary is non-zero carry signal."""
    support = np.flatnonzero(canary)
    shift = canary[support]
    scores = np.empty(trials)
    generator = torch_generator(seed, "mechanism-audit", label, "in" if with_canary else "out")
    # fewer trials per chunk as the support grows: a chunk holds at most CHUNK_ELEMENTS draws
    chunk = max(1, min(chunk, CHUNK_ELEMENTS // max(1, len(support))))
    for start in range(0, trials, chunk):
        count = min(chunk, trials - start)
        noise = mechanism.sample(generator, (count, len(support)), scale=clip).numpy()
        output = noise + shift if with_canary else noise
        scores[start:start + count] = (mechanism.log_density(output - shift, clip) - mechanism.log_density(output, clip)).sum(1)
    # The Laplace and Staircase ratios have exact plateaus, but y = Z + v and y − v carry
    # class-dependent rounding in their last bits; a threshold search would exploit that
    # floating-point artefact (cf. Mironov 2012) instead of the mechanism. Rounding removes it.
    return np.round(scores, 9)


def audit_two_point(epsilon_claimed: float, trials: int, seed: int = 0, confidence: float = 0.95,
                    center: float = 0.0, radius: float = 1.0) -> dict:
    """LDP-FL's two-point mechanism on one weight (Sun et al. 2021, Eq. 2, Thm 1): the two ends of
    its range, w = c − r and w = c + r, are the hardest pair to hide; the optimal test says "c + r"
    when the report is c + rA. TPR = e^ε/(1 + e^ε) and FPR = 1/(1 + e^ε), so the bound approaches
    ε from below."""
    if not (epsilon_claimed > 0 and math.isfinite(epsilon_claimed)) or trials < 100:
        raise UserInputError("--epsilon must be a finite number > 0 and --trials >= 100")
    half = trials // 2
    high = two_point(torch.full((half,), center + radius), center, radius, epsilon_claimed,
                     torch_generator(seed, "two-point-audit", "high")).numpy()
    low = two_point(torch.full((half,), center - radius), center, radius, epsilon_claimed,
                    torch_generator(seed, "two-point-audit", "low")).numpy()
    cut = half // 2
    labels = np.r_[np.ones(cut), np.zeros(cut)]
    bound = held_out_epsilon_lower_bound(np.r_[high[:cut], low[:cut]], labels, np.r_[high[cut:2 * cut], low[cut:2 * cut]],
                                         labels, confidence, 0.0).value
    violated = bound > epsilon_claimed + 1e-9
    verdict = (f"VIOLATION: measured ε_LB = {bound:.4g} exceeds the claimed ε = {epsilon_claimed:.4g}" if violated else
               f"consistent: measured ε_LB = {bound:.4g} ≤ claimed ε = {epsilon_claimed:.4g}")
    return {"mechanism": "ldp-two-point", "accounting": "per-weight ε-LDP", "trials": trials, "delta": 0.0,
            "confidence": confidence, "seed": seed, "epsilon_claimed": epsilon_claimed, "epsilon_lower_bound": bound,
            "verdict": verdict, "violation": violated, "canaries": {"range-ends": bound}}


def audit_mechanism(kind: str, noise: float, clip: float, dim: int, trials: int, accounting: str = "paper_1d",
                    clip_norm: str = "l2", delta: float = 1e-5, conversion: str = "classic", canary: str = "both",
                    seed: int = 0, confidence: float = 0.95) -> dict:
    if kind not in MECHANISMS:
        raise UserInputError(f"--mechanism: '{kind}' is not allowed; allowed: {', '.join([*MECHANISMS, 'ldp-two-point'])}")
    for value, allowed, flag in ((accounting, ACCOUNTINGS, "--accounting"), (clip_norm, CLIP_NORMS, "--clip-norm"),
                                 (canary, CANARIES, "--canary")):
        if value not in allowed:
            raise UserInputError(f"{flag}: '{value}' is not allowed; allowed: {', '.join(allowed)}")
    if not (noise > 0 and clip > 0 and dim >= 1 and trials >= 100):
        raise UserInputError("--noise and --clip must be > 0, --dim >= 1 and --trials >= 100")
    if canary != "concentrated" and trials * dim > MAX_TRIAL_COORDINATES:  # the spread canary draws every coordinate
        raise UserInputError(f"--trials × --dim: {trials} × {dim} = {trials * dim:.3g} noise draws, more than the "
                             f"{MAX_TRIAL_COORDINATES:.0e} allowed; allowed: --trials × --dim up to "
                             f"{MAX_TRIAL_COORDINATES:.0e} (lower either, or --canary concentrated draws one coordinate)")
    mechanism = make_mechanism(kind, noise)
    claimed = epsilon(mechanism, 1.0, 1, delta, accounting, clip_norm, conversion)
    canaries = ["concentrated", "spread"] if canary == "both" else [canary]
    # the larger of k bounds is reported, so each is computed at 1 − (1 − confidence)/k (Bonferroni):
    # the reported bound then holds at ``confidence`` (two 95 % bounds would give about 90 %)
    each = 1.0 - (1.0 - confidence) / len(canaries)
    audits = []
    half = trials // 2
    for name in canaries:
        vector = canary_vector(name, clip, dim, clip_norm)
        scores_in = likelihood_ratio_scores(mechanism, vector, half, clip, seed, name, True)
        scores_out = likelihood_ratio_scores(mechanism, vector, half, clip, seed, name, False)
        cut = half // 2
        labels = np.r_[np.ones(cut), np.zeros(cut)]
        calibration = np.r_[scores_in[:cut], scores_out[:cut]]
        test = np.r_[scores_in[cut:2 * cut], scores_out[cut:2 * cut]]
        bound = held_out_epsilon_lower_bound(calibration, labels, test, labels, each, delta).value
        audits.append(MechanismCanary(name, bound))
    lower = max(a.epsilon_lower_bound for a in audits)
    violated = lower > claimed + 1e-9
    claim_text = "no finite claim" if not math.isfinite(claimed) else f"{claimed:.4g}"
    verdict = (f"VIOLATION: measured ε_LB = {lower:.4g} exceeds the claimed ε = {claim_text}" if violated else
               f"consistent: measured ε_LB = {lower:.4g} ≤ claimed ε = {claim_text}")
    return {
        "mechanism": repr(mechanism), "accounting": accounting, "clip": clip, "clip_norm": clip_norm, "dim": dim,
        "trials": trials, "delta": delta, "conversion": conversion, "confidence": confidence,
        "confidence_per_canary": each, "seed": seed,
        "epsilon_claimed": claimed if math.isfinite(claimed) else None,
        "epsilon_lower_bound": lower,
        "verdict": verdict,
        "violation": violated,
        "canaries": {a.canary: a.epsilon_lower_bound for a in audits},
    }
