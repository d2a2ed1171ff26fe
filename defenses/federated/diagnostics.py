"""Loss-landscape diagnostics of a trained model (flatness is DP-FedSAM's claim: Shi et al.
2023, §6.3).

* **Sharpness**: the rise of the training loss along random directions normalised filter by
  filter to the weights (Li, Xu, Taylor, Studer, Goldstein 2018, "Visualizing the Loss Landscape
  of Neural Nets", §4): every filter d_f of a Gaussian direction is rescaled to ‖w_f‖, biases and
  other one-dimensional parameters get no perturbation. Reported per radius r: the mean and the
  maximum over directions of L(w + r·d) − L(w).
* **Weight-perturbation robustness** (our measure; the paper shows robustness only in pictures):
  test accuracy under w + N(0, s²I), averaged over repetitions, and its drop from the unperturbed
  accuracy.

Both are seeded: the same model and seed give the same numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.blocks.local_training import Params
from defenses.federated.evaluation import evaluate

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")



def filter_normalized_direction(params: Params, generator: torch.Generator) -> Params:
    """A random direction with each filter (slice along the first axis) scaled to the weights' filter norm."""
    direction = {}
    for name, weight in params.items():
        d = torch.randn(weight.shape, generator=generator, dtype=weight.dtype).to(weight.device)
        if weight.dim() <= 1:
            d.zero_()
        else:
            flat_w, flat_d = weight.reshape(weight.shape[0], -1), d.reshape(weight.shape[0], -1)
            scale = flat_w.norm(dim=1) / (flat_d.norm(dim=1) + 1e-10)
            d = (flat_d * scale[:, None]).reshape(weight.shape)
        direction[name] = d
    return direction


def sharpness(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, radii: list[float],
              directions: int, seed: int) -> dict:
    base_loss, _ = evaluate(model, params, x, y)
    rises = np.zeros((directions, len(radii)))
    for k in range(directions):
        direction = filter_normalized_direction(params, torch_generator(seed, "sharpness", k))
        for j, radius in enumerate(radii):
            moved = {n: p + radius * direction[n] for n, p in params.items()}
            rises[k, j] = evaluate(model, moved, x, y)[0] - base_loss
    return {"radii": list(radii), "base_loss": base_loss, "mean_rise": rises.mean(0).tolist(), "max_rise": rises.max(0).tolist()}


def perturbation_robustness(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, stds: list[float],
                            repeats: int, seed: int) -> dict:
    _, base_accuracy = evaluate(model, params, x, y)
    accuracy = np.zeros((repeats, len(stds)))
    for k in range(repeats):
        for j, std in enumerate(stds):
            generator = torch_generator(seed, "perturbation", k, j)
            moved = {n: p + std * torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device)
                     for n, p in params.items()}
            accuracy[k, j] = evaluate(model, moved, x, y)[1]
    mean = accuracy.mean(0)
    return {"stds": list(stds), "base_accuracy": base_accuracy, "accuracy": mean.tolist(),
            "accuracy_drop": (base_accuracy - mean).tolist()}
