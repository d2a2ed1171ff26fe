"""What the property-inference attacker computes from a batch (:mod:`attacks.inference.property_inference`).

A client's upload as it would make it from a batch — the loss gradient at the global model, or
the model delta after local SGD steps (Melis, Song, De Cristofaro, Shmatikov 2019, §4: the
updates of a batch carry its records' features) — privatised like the defense privatises one
upload (clip and noise share; :mod:`attacks.server_view`), and compressed for the classifier by
a count sketch (feature hashing; Weinberger et al. 2009): coordinate i is added, with a random
sign s(i) ∈ {±1}, to bucket h(i) ∈ {0, …, k−1} — inner products are kept in expectation in O(d)
time and memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from attacks.server_view import UploadView
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")

#: a client's upload from a batch (x, y): a flat tensor
UpdateFunction = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def flat_gradient(model: nn.Module, params: dict[str, torch.Tensor],
                  loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> UpdateFunction:
    """``update_of`` for FedSGD-style uploads: the gradient of the mean loss (default: cross-entropy)
    over the client's batch at the global model ``params``, flattened in ``params``' order."""
    loss = F.cross_entropy if loss is None else loss
    names = list(params)
    detached = {name: value.detach() for name, value in params.items()}

    def batch_loss(trainable: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss(torch.func.functional_call(model, trainable, (x,)), y)

    gradient = torch.func.grad(batch_loss)

    def update_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads = gradient(detached, x, y)
        return torch.cat([grads[name].reshape(-1) for name in names]).detach()

    return update_of


def local_sgd_delta(model: nn.Module, params: dict[str, torch.Tensor], steps: int, lr: float,
                    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> UpdateFunction:
    """``update_of`` for FedAvg-style uploads: the model delta (local − global) after ``steps``
    full-batch gradient-descent steps of size ``lr`` on the client's records (deterministic;
    default loss: cross-entropy)."""
    loss = F.cross_entropy if loss is None else loss
    names = list(params)

    def batch_loss(trainable: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss(torch.func.functional_call(model, trainable, (x,)), y)

    gradient = torch.func.grad(batch_loss)

    def update_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        local = {name: value.detach().clone() for name, value in params.items()}
        for _ in range(steps):
            grads = gradient(local, x, y)
            local = {name: local[name] - lr * grads[name] for name in names}
        return torch.cat([(local[name] - params[name]).reshape(-1) for name in names]).detach()

    return update_of


def privatised_upload(update_of: UpdateFunction, view: UploadView, sizes: Sequence[int],
                      generator: torch.Generator) -> UpdateFunction:
    """``update_of`` followed by the defense's privatisation of one upload (:mod:`attacks.server_view`):
    the clip (flat or per parameter tensor; ``sizes``: the tensors of the flat upload, in its order)
    and this upload's noise share, std ``view.noise``·S per coordinate from ``generator``. Summing m
    such uploads gives the aggregate's noise, std S·σ."""

    def privatised(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        upload = update_of(x, y)
        if view.clip is None:
            return upload
        clipped = view.clip_rows(upload[None, :], sizes)[0]
        noise = torch.randn(clipped.shape, generator=generator, dtype=torch.float32).to(clipped)
        return clipped + view.noise * view.clip * noise

    return privatised


class CountSketch:
    """x ↦ S x with S ∈ {0, ±1}^{k×d} having one nonzero per column (bucket h(i), sign s(i))."""

    def __init__(self, dimension: int, width: int, seed: int):
        rng = numpy_rng(seed, "property-inference", "sketch")
        self.width = int(width)
        self.bucket = torch.as_tensor(rng.integers(0, self.width, dimension), dtype=torch.long)
        self.sign = torch.as_tensor(rng.choice(np.array([-1.0, 1.0]), dimension), dtype=torch.float64)

    def __call__(self, update: torch.Tensor) -> np.ndarray:
        sketched = torch.zeros(self.width, dtype=torch.float64)
        sketched.index_add_(0, self.bucket, self.sign * update.detach().to("cpu", torch.float64))
        return sketched.numpy()
