"""Membership attacks on models trained elsewhere: a user's checkpoints —
safetensors state dicts, never pickle — scored by our attacks without our training or run store.

The design is the one our membership experiments use (:mod:`audit.targets`): N models, each
trained on a known subset of a pool of candidate records (``keep[model, record]``, every record
in by an independent fair coin in the usual design), each model the target in turn with the
others as its reference (shadow) models. What the caller supplies:

* ``model_factory`` — a zero-argument callable returning the architecture (an ``nn.Module``);
* ``checkpoints`` — one ``.safetensors`` file per model, its state dict (``safetensors.torch
  .save_file(model.state_dict(), path)``), read with :func:`safetensors.torch.load_file`, which
  parses tensors only: a pickle can run code when loaded, a safetensors file cannot;
* ``keep`` — bool [models, records]: which candidate records each model trained on;
* ``features`` / ``labels`` — the candidate records.

Every file is checked before any attack runs: it must be a safetensors file whose tensors match
the factory's parameters name by name and shape by shape; a bad one is a one-line error naming
the file and what is wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError

import attacks.catalog  # noqa: F401  (registers the attacks)
from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack
from attacks.membership_experiment import MembershipExperiment
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.schema import from_mapping

if TYPE_CHECKING:
    import torch
    from safetensors import torch as safetensors_torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    safetensors_torch = lazy_module("safetensors.torch")
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


def load_state_dict(path: str | os.PathLike, template: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of a safetensors checkpoint, checked against ``template``'s (names, shapes)."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"checkpoints: {path}: no such file")
    try:
        tensors = safetensors_torch.load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserInputError(f"checkpoints: {path}: not a safetensors file ({str(exc).splitlines()[0]}); "
                             "save with safetensors.torch.save_file(model.state_dict(), path) — pickles are not read") from None
    expected = {name: tuple(p.shape) for name, p in template.named_parameters()}
    for name, shape in expected.items():
        if name not in tensors:
            raise UserInputError(f"checkpoints: {path}: parameter '{name}' is missing; the model has {', '.join(expected)}")
        if tuple(tensors[name].shape) != shape:
            raise UserInputError(f"checkpoints: {path}: parameter '{name}' has shape {tuple(tensors[name].shape)}, "
                                 f"the model's is {shape}")
    return {name: tensors[name].to(torch.float32) for name in expected}


def check_design(keep: np.ndarray, models: int, features: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """``keep`` as bool [models, records], checked against the models and the candidate records."""
    keep = np.asarray(keep)
    if keep.ndim != 2 or keep.shape != (models, len(labels)):
        raise UserInputError(f"keep: shape {keep.shape} must be (checkpoints, records) = ({models}, {len(labels)})")
    if not np.isin(keep, (0, 1)).all():
        raise UserInputError("keep: must hold booleans (or 0/1): which records each checkpoint trained on")
    if len(features) != len(labels):
        raise UserInputError(f"features: {len(features)} records but labels: {len(labels)}")
    return keep.astype(bool)


def membership_attacks(attacks: Sequence[str | dict[str, Any]], models: int, field: str = "models") -> list[MembershipAttack]:
    """The membership attacks named by ``attacks`` (registry names or ``{"name", "params", "label"}``
    entries as in a config's ``attacks:``), each checked against the number of models it compares
    (``field`` names that number in the error)."""
    chosen: list[MembershipAttack] = []
    for i, entry in enumerate(attacks):
        spec = {"name": entry} if isinstance(entry, str) else dict(entry)
        cls = ATTACKS.get(str(spec.get("name")), f"attacks[{i}].name")
        if not issubclass(cls, MembershipAttack):
            raise UserInputError(f"attacks[{i}].name: '{spec['name']}' is not a membership attack on models")
        attack = cls(from_mapping(cls.Params, spec.get("params", {}), f"attacks[{i}].params"), spec.get("label"))
        if models < attack.min_runs:
            raise UserInputError(f"{field}: {attack.label} needs at least {attack.min_runs} models, got {models}")
        chosen.append(attack)
    return chosen


def score_models(template: nn.Module, states: Sequence[dict[str, torch.Tensor]], keep: np.ndarray,
                 features: torch.Tensor, labels: torch.Tensor, attacks: Sequence[str | dict[str, Any]] = ("lira", "rmia"),
                 seed: int = 0, device: str = "cpu", deltas: dict[str, float] | None = None,
                 key: str = "checkpoints") -> list[AttackResult]:
    """Membership attacks on models held in memory: ``states[r]`` is model r's tensors by name
    (parameters, and buffers where a model has them), evaluated through ``template``'s architecture;
    ``keep[r, i]``: did model r train on record i. Each model is the target once with the others as
    its references (leave-one-out, as in LiRA's own evaluation: Carlini et al. 2022, §VI-A).
    ``deltas``: unit → δ of the ε lower bounds (:func:`reports.soundness.measurement_delta`; 0 when
    unset). The shared path of :func:`score_checkpoints` and :func:`audit.own_training.audit_training`."""
    keep = check_design(keep, len(states), features, labels)
    chosen = membership_attacks(attacks, len(states))
    kind = "image" if features.dim() >= 3 else "tabular"
    experiment = MembershipExperiment(key, keep, features, labels, kind, template.to(device),
                                      lambda r: {n: v.to(device) for n, v in states[r].items()}, seed, device,
                                      deltas=dict(deltas or {}))
    return [result for attack in chosen for result in attack.run(experiment)]


def score_checkpoints(model_factory: Callable[[], nn.Module], checkpoints: Sequence[str | os.PathLike], keep: np.ndarray,
                      features: torch.Tensor, labels: torch.Tensor, attacks: Sequence[str | dict[str, Any]] = ("lira", "rmia"),
                      seed: int = 0, device: str = "cpu") -> list[AttackResult]:
    """Run membership attacks on checkpoints trained elsewhere; returns their results (AUC and TPR
    at low FPR with two-way intervals, the one-run ε lower bounds) exactly as an audit computes them.

    ``attacks``: registry names, or ``{"name": ..., "params": {...}, "label": ...}`` entries as in
    a config's ``attacks:``. Each checkpoint is the target once with the others as references."""
    template = model_factory()
    check_design(keep, len(checkpoints), features, labels)  # a bad design fails before any file is read
    membership_attacks(attacks, len(checkpoints), "checkpoints")
    states = [load_state_dict(path, template) for path in checkpoints]  # every file checked before any attack runs
    return score_models(template, states, keep, features, labels, attacks, seed, device)
