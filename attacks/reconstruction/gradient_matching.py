"""Gradient matching: scoring the attacker's simulated upload against the observed one.

Gradient inversion (DLG, iDLG, Inverting Gradients) searches for dummy inputs whose upload, as
the attacker simulates it (:meth:`attacks.threat_models.ThreatModel.simulate`), matches the
observed one. This module holds what those attacks share besides the threat model and label
recovery (:mod:`attacks.reconstruction.label_recovery`):

* the **matching losses**: squared ℓ2 distance (DLG, Zhu et al. 2019, Eq. 2) and 1 − cosine
  similarity (Inverting Gradients, Geiping et al. 2020, Eq. 4), and the total-variation image prior;
* what every attack returns (:class:`Reconstruction`) and does first (:func:`attack_setup`:
  check the settings, detach the model and the observation, fix the labels).

Uploads are dicts of tensors keyed by parameter name (the layout of ``model.named_parameters``);
everything runs in float32 on the device of the parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from attacks.reconstruction.label_recovery import recover_labels
from attacks.threat_models import Params, ThreatModel
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")

# --------------------------------------------------------------------------- matching losses and priors


def l2_distance(simulated: Params, observed: Params) -> torch.Tensor:
    """DLG's matching loss (Zhu et al. 2019, Eq. 2): Σ_layers ‖∇W' − ∇W‖²."""
    return sum(((simulated[name] - observed[name]) ** 2).sum() for name in observed)


def cosine_distance(simulated: Params, observed: Params, layerwise: bool = False) -> torch.Tensor:
    """Inverting Gradients' matching loss (Geiping et al. 2020, Eq. 4): 1 − cos(∇W', ∇W).

    Default: the cosine of the whole upload, inner products and squared norms summed over
    layers (the authors' ``cost_fn='sim'``); ``layerwise``: Σ_layers (1 − cos) (``'simlocal'``).
    Scale-invariant, so it also matches clipped uploads and FedAvg deltas of unknown step size.
    """
    if layerwise:
        return sum(1 - F.cosine_similarity(simulated[n].flatten(), observed[n].flatten(), dim=0, eps=1e-10)
                   for n in observed)
    dot = sum((simulated[name] * observed[name]).sum() for name in observed)
    norm_simulated = sum((simulated[name] ** 2).sum() for name in observed).sqrt()
    norm_observed = sum((observed[name] ** 2).sum() for name in observed).sqrt()
    return 1 - dot / (norm_simulated * norm_observed).clamp_min(1e-30)


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation, mean |∂x| + mean |∂y| over the batch (Geiping et al. 2020, Eq. 4;
    the authors' ``total_variation``): the natural-image prior added to the cosine loss."""
    dx = (images[:, :, :, :-1] - images[:, :, :, 1:]).abs().mean()
    dy = (images[:, :, :-1, :] - images[:, :, 1:, :]).abs().mean()
    return dx + dy


# --------------------------------------------------------------------------- what every attack returns


class Reconstruction(NamedTuple):
    """An attack's answer: images [N, C, H, W] in the data range, int64 labels [N], and the
    matching loss of the returned images (the attack's own loss, without priors)."""

    images: torch.Tensor
    labels: torch.Tensor
    matching_loss: float


def labels_for(model: nn.Module, params: Params, observed: Params, threat: ThreatModel,
               image_shape: Sequence[int], labels: torch.Tensor | None, data_range: tuple[float, float],
               seed: int) -> torch.Tensor:
    """The given labels (checked), or those :func:`recover_labels` reads from the observation."""
    if labels is None:
        return recover_labels(model, params, observed, threat, image_shape, data_range, seed)
    labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
    if labels.numel() != threat.examples:
        raise ValueError(f"{labels.numel()} labels given for {threat.examples} images")
    return labels


def attack_setup(model: nn.Module, params: Params, observed: Params, threat: ThreatModel, image_shape: Sequence[int],
                 labels: torch.Tensor | None, iterations: int, restarts: int, data_range: tuple[float, float],
                 seed: int) -> tuple[Params, Params, torch.Tensor]:
    """What every reconstruction attack does first: check its settings, detach the model and the
    observation from any graph, and fix the labels (given, or recovered from the observation)."""
    check_attack_inputs(iterations, restarts, data_range)
    device = next(iter(params.values())).device
    params = {name: value.detach() for name, value in params.items()}
    observed = {name: value.detach() for name, value in observed.items()}
    labels = labels_for(model, params, observed, threat, image_shape, labels, data_range, seed).to(device)
    return params, observed, labels


def check_attack_inputs(iterations: int, restarts: int, data_range: tuple[float, float]) -> None:
    if int(iterations) < 1:
        raise UserInputError(f"iterations: must be >= 1, got {iterations}")
    if int(restarts) < 1:
        raise UserInputError(f"restarts: must be >= 1, got {restarts}")
    if not data_range[1] > data_range[0]:
        raise UserInputError(f"data_range: needs low < high, got {tuple(data_range)}")
