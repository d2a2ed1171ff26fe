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

The white-box gradient-canary audit of DP-SGD is :mod:`audit.gradient_canary_audit`.

What the user's code does with its seed is its own affair: dpfl-audit passes each training call a
seed derived from the audit's seed (same seed ⇒ the same coins, canaries and training seeds), so a
training function that seeds its randomness from it makes the whole audit reproducible.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attacks.attack_result import AttackResult
from attacks.canaries.canary_audit import canary_result
from attacks.canaries.record_canaries import mislabelled_records
from attacks.signals import logit_scaled_confidence
from audit.checkpoints import membership_attacks, score_models
from audit.config import DatasetConfig
from audit.core.dataset_types import Dataset, Split
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.schema import from_mapping
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import Unit
from audit.external import System, audit_external
from audit.logs import progress_bar
from audit.tasks import split_dataset
from defenses.federated.evaluation import logits_of
from defenses.privacy.claims import PrivacyClaim
from reports.document import Results
from reports.soundness import (
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


def checked_count(value: Any, field: str, low: int, high: int, zero_allowed: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            low <= value <= high or (zero_allowed and value == 0)):
        allowed = f"0 or {low}..{high}" if zero_allowed else f"{low}..{high}"
        raise UserInputError(f"{field}: must be an integer in {allowed}, got {value!r}")
    return int(value)


def checked_records(x: Any, y: Any, field: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def user_seed(seed: int, *path: int | str) -> int:
    # the derivation is keyed by the whole audit seed; the 63 bits handed over fit every seeding
    # function a training script may call (torch.manual_seed, numpy, random take 64-bit seeds)
    return derive_seed(seed, "own-training", *path) >> 65


def trained_model(train: TrainFunction, x: torch.Tensor, y: torch.Tensor, seed: int, what: str, **keywords: Any) -> nn.Module:
    """``train(x, y, seed)``, its failure or a result that is not a module reported on one line."""
    try:
        model = train(x, y, seed, **keywords)
    except Exception as exc:  # the user's code failed: say where, on one line (KeyboardInterrupt passes)
        text = " ".join(str(exc).split())[:300]
        raise UserInputError(f"train: raised {type(exc).__name__} on {what}: {text}") from exc
    if not isinstance(model, nn.Module):
        raise UserInputError(f"train: must return the trained torch.nn.Module, got {type(model).__name__} on {what}")
    return model


def model_state(model: nn.Module, template: nn.Module | None, device: str, what: str) -> dict[str, torch.Tensor]:
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


def held_out_accuracy(template: nn.Module, state: dict[str, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor] | None,
                      device: str) -> float | None:
    if test is None:
        return None
    with torch.no_grad():
        predicted = logits_of(template, state, test[0].to(device)).argmax(1).cpu()
    return float((predicted == test[1]).double().mean())


def function_name(train: Callable[..., Any]) -> str:
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
    model = trained_model(train, torch.cat([features, canary_x[chosen].to(features.dtype)]),
                          torch.cat([labels, canary_y[chosen]]), user_seed(seed, "canary-run"), "the canary run")
    state = model_state(model, template, device, "the canary run's model")
    with torch.no_grad():
        logits = logits_of(template, state, canary_x.to(features.dtype).to(device)).cpu().numpy()
    statistics = logit_scaled_confidence(logits, canary_y.numpy())
    origin = "held-out records" if source is not None else "pool records (no test split given)"
    notes = f"{canaries} mislabelled copies of {origin} in one run, {int(inserted.sum())} inserted"
    result = canary_result("record-canaries", Unit.RECORD, statistics[None], inserted[None], delta, seed, notes)
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
    if claim.is_private and claim.unit != Unit.RECORD:
        raise UserInputError(f"claim unit: '{claim.unit}' is not allowed; allowed: record (the runs include records at random)")
    features, labels = checked_records(features, labels, "features")
    models = checked_count(models, "models", 2, MAX_MODELS)
    canaries = checked_count(canaries, "canaries", MIN_CANARIES, MAX_CANARIES, zero_allowed=True)
    if test is not None:
        if not isinstance(test, (tuple, list)) or len(test) != 2:
            raise UserInputError("test: must be a pair (features, labels) of held-out records")
        test = checked_records(test[0], test[1], "test")
        if tuple(test[0].shape[1:]) != tuple(features.shape[1:]):
            raise UserInputError(f"test: features of shape {tuple(test[0].shape[1:])} per record, the pool's are "
                                 f"{tuple(features.shape[1:])}")
    attacks = list(attacks)
    membership_attacks(attacks, models)  # a bad attack entry fails before any training
    name = name or function_name(train)
    delta = measurement_delta(claim, Unit.RECORD, float(claim.delta or 0.0))

    keep = numpy_rng(seed, "own-training", "keep").random((models, len(labels))) < 0.5  # keep[r, i]: a fair coin each
    bar = progress_bar(models + (1 if canaries else 0), f"audit-training {name}", not progress)
    template: nn.Module | None = None
    states: list[dict[str, torch.Tensor]] = []
    accuracy: list[float] = []
    num_classes = 0
    try:
        for r in range(models):
            rows = torch.as_tensor(np.flatnonzero(keep[r]))
            model = trained_model(train, features[rows], labels[rows], user_seed(seed, "membership", r),
                                  f"membership model {r}")
            states.append(model_state(model, template, device, f"membership model {r}"))
            if template is None:
                template = model.to(device)
                num_classes = _num_classes(template, states[0], features, labels, device)
                if test is not None and int(test[1].max()) >= num_classes:
                    raise UserInputError(f"test: class {int(test[1].max())} but the model outputs {num_classes} logits")
            value = held_out_accuracy(template, states[-1], test, device)
            if value is not None:
                accuracy.append(value)
            bar.update(1)
        assert template is not None  # models ≥ 2
        results: list[AttackResult] = []
        canary_accuracy = None
        if canaries:
            canary, canary_state = canary_audit(train, features, labels, template, num_classes, canaries, delta, seed,
                                                device, test)
            canary_accuracy = held_out_accuracy(template, canary_state, test, device)
            results.append(canary)
            bar.update(1)
    finally:
        bar.close()
    results = score_models(template, states, keep, features, labels, attacks, seed, device,
                           deltas={Unit.RECORD: delta}, key=name) + results

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
