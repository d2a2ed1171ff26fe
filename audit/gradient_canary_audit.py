"""The white-box gradient-canary audit of a user's DP-SGD training (Nasr et al. 2023, "Tight
Auditing of Differentially Private Machine Learning", §4): Dirac gradient canaries for a training
function that hands its Opacus ``DPOptimizer`` to ``attach``.

The training function gets per-example gradient canaries inserted before Opacus clips
(:mod:`attacks.canaries.dp_sgd_canaries`), each read in every step's noisy averaged gradient and
scored by the participation-hidden mixture log-likelihood ratio; as many runs as the coins need
(one canary per parameter coordinate per run), bounded by Steinke et al.'s count and its f-DP
analysis, judged by :mod:`reports.soundness` with the design's power.

The training calls, their seeds and checks are :mod:`audit.own_training`'s.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attacks.canaries.canary_audit import canary_result
from attacks.canaries.dp_sgd_canaries import AMPLITUDE, STATISTIC, GradientCanaryHook
from attacks.membership_metrics import one_run_bounds
from audit.core.audit_power import AuditPower, gdp_mu, one_run_power, power_caveat
from audit.core.empirical_epsilon import OneRunAudit
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import EpsilonKind, Relation, Unit
from audit.external import System, audit_external
from audit.logs import progress_bar
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon
from defenses.privacy.claims import PrivacyClaim
from reports.document import Results, Verdict
from reports.soundness import (
    FAMILY_ALPHA,
    attack_verdicts,
    claim_bound,
    experiment_sentence,
    experiment_verdict,
    family_verdicts,
    measurement_delta,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

from audit.own_training import (
    MAX_CANARIES,
    MIN_CANARIES,
    checked_count,
    checked_records,
    function_name,
    held_out_accuracy,
    model_state,
    trained_model,
    user_seed,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

#: coins of a gradient-canary audit unless told otherwise (at 4,810 parameters: 3 runs)
GRADIENT_COINS = 10_000


@dataclass(frozen=True)
class GradientCanaryAudit:
    """What :func:`gradient_canary_audit` found: the coins and their scores, the two one-run ε
    lower bounds with their verdicts, the f-DP test's power and tight bound, and why the bound
    and the tight bound differ."""

    scores: np.ndarray  # float64 [coins], the mixture log-likelihood ratio of each canary (STATISTIC)
    inserted: np.ndarray  # bool [coins]
    runs: int
    per_run: int  # canaries per run (≤ the model's parameter coordinates)
    parameters: int
    steps: int  # optimiser steps of each run
    sample_rate: float
    noise_multiplier: float  # σ the claim accounts (the readings' standardisation)
    evidence: dict[str, OneRunAudit]  # "epsilon_one_run" (Steinke et al.), "epsilon_one_run_fdp"
    verdicts: list[Verdict]  # one per figure, decided together (Holm over the family)
    power: AuditPower | None  # the f-DP test's power and tight bound at the claim (None: no bound to test)
    held_out_spread: float  # standard deviation of the held-out canaries' readings z_t (1: noise alone)
    explanation: str  # why ε_LB and the tight bound differ
    results: Results  # the results document (written under ``out`` when given)

    @property
    def status(self) -> str:
        return experiment_verdict(self.verdicts)

    @property
    def sentence(self) -> str:
        return experiment_sentence(self.verdicts, ["dp-sgd-gradient-canaries"] * len(self.verdicts))

    @property
    def epsilon_lower_bound(self) -> float:
        """The larger of the two figures (both are in the verdicts' family)."""
        return max(audit.epsilon for audit in self.evidence.values())


def _accepts_attach(train: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(train).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: let the call decide
        return True
    return any(p.name == "attach" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _explanation(epsilon_lb: float, power: AuditPower | None, claim: PrivacyClaim, noise_multiplier: float,
                 sample_rate: float, steps: int, delta: float, spread: float) -> str:
    """Why the measured bound and the design's tight bound differ, with the numbers behind it."""
    if power is None:
        return "no tight bound: the claim sets no (ε, δ) to audit against"
    tight = power.tight_bound
    if epsilon_lb >= tight:
        return (f"ε_LB = {epsilon_lb:.3g} reaches the tight bound {tight:.3g}: the canaries leak at least as much as a "
                "mechanism exactly as private as the claim would")
    claimed = float(claim.epsilon)
    mu_claim = gdp_mu(claimed, delta) if delta > 0 else math.inf
    # Bu, Dong, Long, Su 2020 ("Deep Learning with Gaussian Differential Privacy", Thm 5): T steps of the
    # Poisson-subsampled Gaussian approach μ-GDP with μ = q·√(T·(e^{1/σ²} − 1))
    mu_clt = sample_rate * math.sqrt(steps * math.expm1(1.0 / noise_multiplier**2))
    try:
        exact = compute_epsilon(GaussianSchedule(noise_multiplier, sample_rate, steps), delta, "pld").epsilon
        pld = f"the exact composition of the same (σ, q, T) (PLD, dp-accounting) gives ε = {exact:.3g}, not {claimed:.3g}"
    except UserInputError:
        pld = "the PLD accountant cannot compose this σ"
    return (f"ε_LB = {epsilon_lb:.3g} < tight bound {tight:.3g}. The tight bound is the median ε_LB of a "
            f"μ = {mu_claim:.3g}-GDP mechanism exactly as private as the claim; DP-SGD is less leaky than that: the RDP "
            f"claim is loose ({pld}), the subsampled Gaussian with hidden participation is close to "
            f"μ ≈ {mu_clt:.3g}-GDP (CLT of Bu et al. 2020), and the real records' gradients add to the canaries' "
            f"coordinates (held-out readings spread {spread:.2f}, 1 for the noise alone), which only costs power")


def gradient_canary_audit(train: Callable[..., nn.Module], features: torch.Tensor, labels: torch.Tensor,
                          claim: PrivacyClaim, *, noise_multiplier: float, sample_rate: float,
                          coins: int = GRADIENT_COINS, amplitude: float = AMPLITUDE, seed: int = 0,
                          test: tuple[torch.Tensor, torch.Tensor] | None = None, out: str | Path | None = None,
                          progress: bool = True, name: str | None = None, dataset: str = "external") -> GradientCanaryAudit:
    """Audit record-level DP-SGD (Opacus) white box with Dirac gradient canaries (public API).

    Nasr et al. 2023 ("Tight Auditing of Differentially Private Machine Learning", §4: Dirac
    gradient canaries, every step's gradient observed) counted as a one-run audit (Steinke, Nasr,
    Jagielski 2023, Thm 3.1; f-DP analysis of the same counts, Mahloujifar, Melis, Chaudhuri 2024).
    ``train(features, labels, seed, attach=...)`` trains with Opacus on the pool and calls
    ``attach(optimizer)`` once on the ``DPOptimizer`` that ``PrivacyEngine.make_private`` returns;
    the hook (:class:`attacks.canaries.dp_sgd_canaries.GradientCanaryHook`) inserts per-example gradients
    s·U·e_j (U = ``amplitude``·C) before Opacus's clipping (DP-SGD, Abadi et al. 2016, Alg. 1),
    each canary in by a fair coin and then in each step with probability ``sample_rate`` (the q of
    the claim's Poisson sampling), and reads the noisy averaged gradient at every step.
    ``noise_multiplier`` is the σ the *claim* accounts: the readings are standardised by it, so
    an optimiser that adds less noise than claimed shows as readings that stand out.

    At least ``coins`` canaries, at most one per parameter coordinate per run, over as few runs as
    that takes (:func:`attacks.canaries.dp_sgd_canaries.canaries_per_run`); each run gets its own training
    seed. The bounds are computed at the δ the claim allows per record and judged against the claim
    by :func:`reports.soundness.attack_verdicts` and :func:`reports.soundness.family_verdicts`; the
    f-DP test's power (:func:`audit.core.audit_power.one_run_power`) says what the design could show.
    The results document is written under ``out`` when given. Bad input: a one-line
    :class:`UserInputError` naming the field."""
    if not callable(train) or not _accepts_attach(train):
        raise UserInputError("train: must be a function train(features, labels, seed, attach=None) that calls "
                             "attach(optimizer) on its Opacus DPOptimizer")
    if not isinstance(claim, PrivacyClaim):
        raise UserInputError(f"claim: must be a PrivacyClaim (audit.external.stated_claim), got {type(claim).__name__}")
    if claim.is_private and claim.unit != Unit.RECORD:
        raise UserInputError(f"claim unit: '{claim.unit}' is not allowed; allowed: record (a canary is one per-example gradient)")
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)) or not (
            math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise UserInputError("noise_multiplier: must be a finite number > 0 (the σ the claim accounts), got "
                             f"{noise_multiplier!r}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
        raise UserInputError(f"sample_rate: must be a number in (0, 1] (the claim's Poisson rate q), got {sample_rate!r}")
    features, labels = checked_records(features, labels, "features")
    coins = checked_count(coins, "coins", MIN_CANARIES, MAX_CANARIES)
    if test is not None:
        if not isinstance(test, (tuple, list)) or len(test) != 2:
            raise UserInputError("test: must be a pair (features, labels) of held-out records")
        test = checked_records(test[0], test[1], "test")
    name = name or function_name(train)
    delta = measurement_delta(claim, Unit.RECORD, float(claim.delta or 0.0))

    hooks: list[GradientCanaryHook] = []
    accuracy: list[float] = []
    template: nn.Module | None = None
    bar = progress_bar(1, f"gradient canaries {name}", not progress)
    try:
        while not hooks or len(hooks) < hooks[0].runs:
            run = len(hooks)
            hook = GradientCanaryHook(float(sample_rate), coins=coins, seed=seed, run=run, amplitude=amplitude)
            model = trained_model(train, features, labels, user_seed(seed, "gradient-canary-run", run),
                                  f"gradient canary run {run}", attach=hook.attach)
            if not hook.attached or hook.steps == 0:
                raise UserInputError("train: must call attach(optimizer) on its Opacus DPOptimizer before training "
                                     f"and take at least one step; run {run} "
                                     + ("took no optimiser step" if hook.attached else "never called attach"))
            if hooks and (hook.parameters, hook.steps) != (hooks[0].parameters, hooks[0].steps):
                raise UserInputError(f"train: gradient canary run {run} has {hook.parameters} parameters and {hook.steps} "
                                     f"steps, run 0 had {hooks[0].parameters} and {hooks[0].steps}; every run must be alike")
            hooks.append(hook)
            bar.total = hook.runs
            bar.update(1)
            state = model_state(model, template, "cpu", f"gradient canary run {run}'s model")
            if template is None:
                template = model
            value = held_out_accuracy(template, state, test, "cpu")
            if value is not None:
                accuracy.append(value)
    finally:
        bar.close()
    assert template is not None
    scores = np.stack([h.scores(float(noise_multiplier)) for h in hooks])  # [runs, canaries per run]
    inserted = np.stack([h.plan.inserted for h in hooks if h.plan is not None])
    held_out = np.concatenate([h.standardised(float(noise_multiplier))[~h.plan.inserted].ravel()
                               for h in hooks if h.plan is not None])
    spread = float(held_out.std()) if held_out.size > 1 else math.nan

    # the two one-run figures of these coins, judged as one family (Holm) as the document judges them
    evidence = one_run_bounds(scores.ravel(), inserted.ravel(), delta)
    caveat = power_caveat(sample_rate, composed=" at every step")
    if caveat:  # the verdicts' power model (μ-GDP at 2ε, optimal attack) does not describe subsampled steps
        evidence = {k: replace(v, unmodelled_power=caveat) for k, v in evidence.items()}
    metrics = {figure: audit.as_estimate() for figure, audit in evidence.items()}
    family = attack_verdicts(claim, Unit.RECORD, metrics, dict.fromkeys(evidence, EpsilonKind.LOWER_BOUND), Relation.ADD_REMOVE,
                             evidence)
    verdicts = family_verdicts(family)
    bound = claim_bound(claim, Unit.RECORD, Relation.ADD_REMOVE)
    # the f-DP test's power at the level its verdict was given (the family's share of α for that test),
    # so the figure printed is the one the verdict was decided with (one_run_power is cached)
    decided = dict(zip(evidence, verdicts))["epsilon_one_run_fdp"]
    level = decided.power.level if decided.power is not None else FAMILY_ALPHA / len(family)
    power = one_run_power(scores.size, bound[0], bound[1], level, method="fdp") if bound is not None else None
    steps = hooks[0].steps
    explanation = _explanation(max(a.epsilon for a in evidence.values()), power, claim, float(noise_multiplier),
                               float(sample_rate), steps, delta, spread)

    runs, per_run = len(hooks), scores.shape[1]
    notes = (f"{scores.size} Dirac gradient canaries (U = {amplitude:g}·C) over {runs} run(s), {per_run} per run on distinct "
             f"coordinates of {hooks[0].parameters}, {int(inserted.sum())} inserted; read in all {steps} steps' noisy "
             f"averaged gradients (white box), standardised by the claim's σ = {noise_multiplier:g}")
    result = replace(canary_result("dp-sgd-gradient-canaries", Unit.RECORD, scores, inserted, delta, seed, notes),
                     statistic=STATISTIC, observation="every step's noisy averaged gradient (white box)")
    params: dict[str, Any] = {"gradient_canaries": int(scores.size), "runs": runs, "amplitude": amplitude,
                              "sample_rate": float(sample_rate), "noise_multiplier": float(noise_multiplier), "steps": steps}
    described = (f"{name}: the user's DP-SGD train(features, labels, seed, attach) run {runs} time(s) on a pool of "
                 f"{len(labels)} records, each run with {per_run} Dirac gradient canaries inserted into Opacus's "
                 "per-example gradients before clipping, each by a fair coin (one-run audit, white box)")
    system = System(name=name, description=described, dataset=dataset, source="supplied by the user",
                    kind="image" if features.dim() >= 3 else "tabular", pool_size=len(labels),
                    test_size=len(test[1]) if test is not None else 0, model=type(template).__name__,
                    model_parameters=hooks[0].parameters, runs=runs, unit="record", params=params,
                    server_view="every step's noisy averaged gradient (white box)", test_accuracy=accuracy, seed=seed)
    config = {"train": name, "gradient_canaries": coins, "amplitude": amplitude, "sample_rate": float(sample_rate),
              "noise_multiplier": float(noise_multiplier), "seed": seed, "pool": len(labels), "test": system.test_size}
    results = audit_external(system, claim, [result], out, config)
    return GradientCanaryAudit(scores.ravel(), inserted.ravel(), runs, per_run, hooks[0].parameters, steps,
                               float(sample_rate), float(noise_multiplier), evidence, verdicts, power, spread,
                               explanation, results)
