"""Bring-your-own training: a user's ``train(features, labels, seed) -> nn.Module``
— their own code, e.g. record-level DP-SGD with Opacus — audited against the privacy claim it makes.

dpfl-audit drives the training function through these designs and writes the usual results document
(:mod:`audit.external`: results.json, results.csv, report.html, manifest.json, verdicts with power):

* **Membership runs** (Carlini et al. 2022, "Membership Inference Attacks From First Principles",
  §VI-A): ``models`` models, model r trained on the pool records with ``keep[r, i]`` an independent
  fair coin, so member and non-member datasets are add/remove neighbours; each model is the target
  once with the others as its references (leave-one-out), scored by LiRA, RMIA or any registered
  membership attack through the path :func:`audit.checkpoints.score_checkpoints` uses
  (:func:`audit.checkpoints.score_models`).
* **One-run canary audit** (Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training
  Run", Alg. 1 and Thm 3.1): one more training run on the whole pool plus m canary records, each
  inserted independently with probability ½. A canary is a held-out record with a wrong label
  (:func:`attacks.canaries.record_canaries.mislabelled_records`), which a model fits only by memorising it;
  its statistic is the trained model's logit-scaled confidence in the canary's label (Carlini et
  al. 2022, §IV-B). :func:`attacks.canaries.canary_audit.canary_result` turns (statistics, coins) into the
  one-run ε lower bound, its f-DP counterpart (Mahloujifar, Melis, Chaudhuri 2024) and the Gaussian
  fit, at the δ the claim allows per record (:func:`reports.soundness.measurement_delta`).

* **Dirac gradient canaries, white box** (:func:`gradient_canary_audit`; Nasr et al. 2023, "Tight
  Auditing of Differentially Private Machine Learning", §4): for DP-SGD with Opacus, a training
  function that hands its ``DPOptimizer`` to ``attach`` gets per-example gradient canaries
  inserted before Opacus clips (:mod:`attacks.canaries.dp_sgd_canaries`), each read in every step's noisy
  averaged gradient and scored by the participation-hidden mixture log-likelihood ratio; as many
  runs as the coins need (one canary per parameter coordinate per run), bounded by Steinke et
  al.'s count and its f-DP analysis, judged by :mod:`reports.soundness` with the design's power.

What the user's code does with its seed is its own affair: dpfl-audit passes each training call a
seed derived from the audit's seed (same seed ⇒ the same coins, canaries and training seeds), so a
training function that seeds its randomness from it makes the whole audit reproducible.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attacks.attack_result import AttackResult
from attacks.canaries.canary_audit import canary_result
from attacks.canaries.dp_sgd_canaries import AMPLITUDE, STATISTIC, GradientCanaryHook
from attacks.canaries.record_canaries import mislabelled_records
from attacks.membership_metrics import one_run_bounds
from attacks.signals import logit_scaled_confidence
from audit.checkpoints import membership_attacks, score_models
from audit.config import DatasetConfig
from audit.core.audit_power import AuditPower, gdp_mu, one_run_power
from audit.core.dataset_types import Dataset, Split
from audit.core.empirical_epsilon import OneRunAudit
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.schema import from_mapping
from audit.core.seeding import derive_seed, numpy_rng
from audit.external import System, audit_external
from audit.tasks import split_dataset
from audit.training import progress_bar
from defenses.federated.evaluation import logits_of
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

TrainFunction = Callable[["torch.Tensor", "torch.Tensor", int], "nn.Module"]

#: bounds that stop a typo (1e9 models) before any training
MAX_MODELS, MAX_CANARIES = 4096, 10**6
#: fewest canaries of a one-run audit (attacks.canaries.record_canaries' lower limit); 0 switches it off
MIN_CANARIES = 4
#: coins of a gradient-canary audit unless told otherwise (at 4,810 parameters: 3 runs)
GRADIENT_COINS = 10_000


def _count(value: Any, field: str, low: int, high: int, zero_allowed: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            low <= value <= high or (zero_allowed and value == 0)):
        allowed = f"0 or {low}..{high}" if zero_allowed else f"{low}..{high}"
        raise UserInputError(f"{field}: must be an integer in {allowed}, got {value!r}")
    return int(value)


def _records(x: Any, y: Any, field: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise UserInputError(f"{field}: features and labels must be torch tensors, got {type(x).__name__}, {type(y).__name__}")
    if y.dim() != 1 or y.dtype != torch.int64:
        raise UserInputError(f"{field}: labels must be a 1-D int64 tensor of class indices, got {y.dtype} of "
                             f"shape {tuple(y.shape)}")
    if x.dim() < 2 or len(x) != len(y) or len(y) == 0:
        raise UserInputError(f"{field}: features must be [records, ...] with one row per label; "
                             f"got {tuple(x.shape)} for {len(y)} labels")
    if int(y.min()) < 0:
        raise UserInputError(f"{field}: labels must be class indices ≥ 0, got {int(y.min())}")
    return x, y


def _user_seed(seed: int, *path: int | str) -> int:
    # the derivation is keyed by the whole audit seed; the 63 bits handed over fit every seeding
    # function a training script may call (torch.manual_seed, numpy, random take 64-bit seeds)
    return derive_seed(seed, "own-training", *path) >> 65


def _trained(train: TrainFunction, x: torch.Tensor, y: torch.Tensor, seed: int, what: str, **keywords: Any) -> nn.Module:
    """``train(x, y, seed)``, its failure or a result that is not a module reported on one line."""
    try:
        model = train(x, y, seed, **keywords)
    except Exception as exc:  # the user's code failed: say where, on one line (KeyboardInterrupt passes)
        text = " ".join(str(exc).split())[:300]
        raise UserInputError(f"train: raised {type(exc).__name__} on {what}: {text}") from exc
    if not isinstance(model, nn.Module):
        raise UserInputError(f"train: must return the trained torch.nn.Module, got {type(model).__name__} on {what}")
    return model


def _state(model: nn.Module, template: nn.Module | None, device: str, what: str) -> dict[str, torch.Tensor]:
    """The model's tensors (parameters and buffers, detached copies on ``device``), checked against
    the first model's: the attacks evaluate every model through one architecture."""
    state = {name: value.detach().to(device).clone() for name, value in model.state_dict().items()}
    if template is not None:
        expected = {name: tuple(v.shape) for name, v in template.state_dict().items()}
        found = {name: tuple(v.shape) for name, v in state.items()}
        if found != expected:
            differ = sorted(set(expected) ^ set(found)) or [n for n in expected if expected[n] != found[n]]
            raise UserInputError(f"train: {what} differs from the first model in tensor '{differ[0]}'; "
                                 "every call must return the same architecture")
    return state


def _num_classes(template: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, labels: torch.Tensor,
                 device: str) -> int:
    """Classes of the model's output, checked: one logit per class, every label among them."""
    with torch.no_grad():
        logits = logits_of(template, state, x[:2].to(device))
    if logits.dim() != 2 or logits.shape[1] < 2:
        raise UserInputError(f"train: the model must output one logit per class, shape [records, classes ≥ 2]; "
                             f"got {tuple(logits.shape)}")
    classes = int(logits.shape[1])
    if int(labels.max()) >= classes:
        raise UserInputError(f"labels: class {int(labels.max())} but the model outputs {classes} logits")
    return classes


def _accuracy(template: nn.Module, state: dict[str, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor] | None,
              device: str) -> float | None:
    if test is None:
        return None
    with torch.no_grad():
        predicted = logits_of(template, state, test[0].to(device)).argmax(1).cpu()
    return float((predicted == test[1]).double().mean())


def _default_name(train: Callable[..., Any]) -> str:
    function = getattr(train, "__qualname__", type(train).__name__)
    try:
        return f"{Path(inspect.getfile(train)).stem}:{function}"
    except TypeError:  # a built-in or a callable object without a source file
        return str(function)


def dataset_pool(name: str, pool: int | None = None, seed: int = 0, root: str | None = None) -> tuple[Dataset, Split, Split]:
    """(dataset, candidate pool, test split) of a registered dataset cut as an audit's config cuts it
    (:func:`audit.tasks.split_dataset`): the official test split or a stratified 20 % held out, the
    pool capped at ``pool`` records (stratified) when given."""
    spec = from_mapping(DatasetConfig, {"name": name, "root": root, "max_pool": pool}, "dataset")
    return split_dataset(spec, seed)


def canary_audit(train: TrainFunction, features: torch.Tensor, labels: torch.Tensor, template: nn.Module,
                 num_classes: int, canaries: int, delta: float, seed: int, device: str = "cpu",
                 source: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[AttackResult, dict[str, torch.Tensor]]:
    """Steinke, Nasr, Jagielski 2023 (Alg. 1): one training run on the pool plus each of m mislabelled
    canaries with probability ½; the ε figures of (statistics, coins) at ``delta``. Canaries copy
    records of ``source`` (held-out records; the pool when None). Returns the result and the run's
    model's tensors (``template``'s architecture: the caller reads its test accuracy)."""
    source_x, source_y = source if source is not None else (features, labels)
    canary_x, canary_y = mislabelled_records(source_x, source_y, num_classes, canaries,
                                             numpy_rng(seed, "own-training", "canaries", "records"))
    inserted = numpy_rng(seed, "own-training", "canaries", "inserted").random(canaries) < 0.5
    chosen = torch.as_tensor(np.flatnonzero(inserted))
    # the canaries join the whole pool: the audit's other records are in the run for certain, so
    # only the canaries' coins are random (Steinke et al.'s setting)
    model = _trained(train, torch.cat([features, canary_x[chosen].to(features.dtype)]), torch.cat([labels, canary_y[chosen]]),
                     _user_seed(seed, "canary-run"), "the canary run")
    state = _state(model, template, device, "the canary run's model")
    with torch.no_grad():
        logits = logits_of(template, state, canary_x.to(features.dtype).to(device)).cpu().numpy()
    statistics = logit_scaled_confidence(logits, canary_y.numpy())
    origin = "held-out records" if source is not None else "pool records (no test split given)"
    notes = f"{canaries} mislabelled copies of {origin} in one run, {int(inserted.sum())} inserted"
    result = canary_result("record-canaries", "record", statistics[None], inserted[None], delta, seed, notes)
    return result, state


def audit_training(train: TrainFunction, features: torch.Tensor, labels: torch.Tensor, claim: PrivacyClaim, *,
                   models: int = 8, canaries: int = 200, attacks: Sequence[str | dict[str, Any]] = ("lira", "rmia"),
                   test: tuple[torch.Tensor, torch.Tensor] | None = None, seed: int = 0, out: str | Path | None = None,
                   progress: bool = True, device: str = "cpu", name: str | None = None,
                   dataset: str = "external") -> Results:
    """Audit a training function against the record-level claim it makes (public API).

    ``train(features, labels, seed)`` trains a fresh model on the records it is given and returns it;
    ``features``/``labels`` are the pool of candidate records; ``claim`` what the training claims
    (:func:`audit.external.stated_claim`, unit ``record``). ``models`` membership runs (each record
    in by a fair coin; each model the target once, the others its references) are scored by
    ``attacks`` (registry names or ``{"name", "params", "label"}`` entries); ``canaries`` mislabelled
    canaries go into one more run for the one-run audit (0: none). With ``test=(x, y)`` the canaries
    copy test records and the utility is each membership model's test accuracy. Returns the results
    document, written under ``out`` when given. Bad input is a one-line :class:`UserInputError`."""
    if not callable(train):
        raise UserInputError("train: must be a function train(features, labels, seed) -> torch.nn.Module, got "
                             f"{type(train).__name__}")
    if not isinstance(claim, PrivacyClaim):
        raise UserInputError(f"claim: must be a PrivacyClaim (audit.external.stated_claim), got {type(claim).__name__}")
    if claim.is_private and claim.unit != "record":
        raise UserInputError(f"claim unit: '{claim.unit}' is not allowed; allowed: record (the runs include records at random)")
    features, labels = _records(features, labels, "features")
    models = _count(models, "models", 2, MAX_MODELS)
    canaries = _count(canaries, "canaries", MIN_CANARIES, MAX_CANARIES, zero_allowed=True)
    if test is not None:
        if not isinstance(test, (tuple, list)) or len(test) != 2:
            raise UserInputError("test: must be a pair (features, labels) of held-out records")
        test = _records(test[0], test[1], "test")
        if tuple(test[0].shape[1:]) != tuple(features.shape[1:]):
            raise UserInputError(f"test: features of shape {tuple(test[0].shape[1:])} per record, the pool's are "
                                 f"{tuple(features.shape[1:])}")
    attacks = list(attacks)
    membership_attacks(attacks, models)  # a bad attack entry fails before any training
    name = name or _default_name(train)
    delta = measurement_delta(claim, "record", float(claim.delta or 0.0))

    keep = numpy_rng(seed, "own-training", "keep").random((models, len(labels))) < 0.5  # keep[r, i]: a fair coin each
    bar = progress_bar(models + (1 if canaries else 0), f"audit-training {name}", not progress)
    template: nn.Module | None = None
    states: list[dict[str, torch.Tensor]] = []
    accuracy: list[float] = []
    num_classes = 0
    try:
        for r in range(models):
            rows = torch.as_tensor(np.flatnonzero(keep[r]))
            model = _trained(train, features[rows], labels[rows], _user_seed(seed, "membership", r), f"membership model {r}")
            states.append(_state(model, template, device, f"membership model {r}"))
            if template is None:
                template = model.to(device)
                num_classes = _num_classes(template, states[0], features, labels, device)
                if test is not None and int(test[1].max()) >= num_classes:
                    raise UserInputError(f"test: class {int(test[1].max())} but the model outputs {num_classes} logits")
            value = _accuracy(template, states[-1], test, device)
            if value is not None:
                accuracy.append(value)
            bar.update(1)
        assert template is not None  # models ≥ 2
        results: list[AttackResult] = []
        canary_accuracy = None
        if canaries:
            canary, canary_state = canary_audit(train, features, labels, template, num_classes, canaries, delta, seed,
                                                device, test)
            canary_accuracy = _accuracy(template, canary_state, test, device)
            results.append(canary)
            bar.update(1)
    finally:
        bar.close()
    results = score_models(template, states, keep, features, labels, attacks, seed, device,
                           deltas={"record": delta}, key=name) + results

    params: dict[str, Any] = {"membership_models": models, "canaries": canaries}
    if canary_accuracy is not None:
        params["canary_run_test_accuracy"] = round(canary_accuracy, 4)
    described = (f"{name}: the user's train(features, labels, seed) run {models} times, each on a random half of a pool of "
                 f"{len(labels)} records (membership runs)"
                 + (f", and once on the whole pool with {canaries} mislabelled canaries, each inserted with probability ½ "
                    "(one-run audit)" if canaries else ""))
    system = System(name=name, description=described, dataset=dataset, source="supplied by the user",
                    kind="image" if features.dim() >= 3 else "tabular", pool_size=len(labels),
                    test_size=len(test[1]) if test is not None else 0, model=type(template).__name__,
                    model_parameters=sum(p.numel() for p in template.parameters()), runs=models, unit="record",
                    params=params, server_view="the released model", test_accuracy=accuracy, seed=seed)
    config = {"train": name, "models": models, "canaries": canaries, "attacks": attacks, "seed": seed,
              "pool": len(labels), "test": system.test_size, "device": device}
    return audit_external(system, claim, results, out, config)


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
    if claim.is_private and claim.unit != "record":
        raise UserInputError(f"claim unit: '{claim.unit}' is not allowed; allowed: record (a canary is one per-example gradient)")
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)) or not (
            math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise UserInputError("noise_multiplier: must be a finite number > 0 (the σ the claim accounts), got "
                             f"{noise_multiplier!r}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
        raise UserInputError(f"sample_rate: must be a number in (0, 1] (the claim's Poisson rate q), got {sample_rate!r}")
    features, labels = _records(features, labels, "features")
    coins = _count(coins, "coins", MIN_CANARIES, MAX_CANARIES)
    if test is not None:
        if not isinstance(test, (tuple, list)) or len(test) != 2:
            raise UserInputError("test: must be a pair (features, labels) of held-out records")
        test = _records(test[0], test[1], "test")
    name = name or _default_name(train)
    delta = measurement_delta(claim, "record", float(claim.delta or 0.0))

    hooks: list[GradientCanaryHook] = []
    accuracy: list[float] = []
    template: nn.Module | None = None
    bar = progress_bar(1, f"gradient canaries {name}", not progress)
    try:
        while not hooks or len(hooks) < hooks[0].runs:
            run = len(hooks)
            hook = GradientCanaryHook(float(sample_rate), coins=coins, seed=seed, run=run, amplitude=amplitude)
            model = _trained(train, features, labels, _user_seed(seed, "gradient-canary-run", run),
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
            state = _state(model, template, "cpu", f"gradient canary run {run}'s model")
            if template is None:
                template = model
            value = _accuracy(template, state, test, "cpu")
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
    metrics = {figure: audit.as_estimate() for figure, audit in evidence.items()}
    family = attack_verdicts(claim, "record", metrics, dict.fromkeys(evidence, "lower_bound"), "add-remove", evidence)
    verdicts = family_verdicts(family)
    bound = claim_bound(claim, "record", "add-remove")
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
    result = replace(canary_result("dp-sgd-gradient-canaries", "record", scores, inserted, delta, seed, notes),
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
