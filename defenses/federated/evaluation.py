"""Running a model given as a parameter dict: logits, loss and accuracy on a labelled set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")


def logits_of(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """Eval-mode logits of ``model`` with ``params`` on ``x``, in batches (float32, on x's device)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            parts = [torch.func.functional_call(model, params, (x[i:i + batch_size],)) for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    if not parts:
        return torch.empty(0, 0)
    return torch.cat(parts)


def evaluate(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the model on (x, y); NaN loss if the model diverged."""
    logits = logits_of(model, params, x)
    loss = float(F.cross_entropy(logits, y).item()) if len(y) else float("nan")
    accuracy = float((logits.argmax(1) == y).double().mean().item()) if len(y) else float("nan")
    return loss, accuracy
