"""Running a model given as a parameter dict: logits, loss and accuracy on a labelled set."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
    with _eval_mode([model]):
        return _logits(model, params, x, batch_size)


@contextmanager
def _eval_mode(models: list[nn.Module]) -> Iterator[None]:
    """The models in eval mode (each set once, however many evaluations it runs), then as they were."""
    distinct = list({id(model): model for model in models}.values())
    was_training = [model.training for model in distinct]
    for model in distinct:
        model.eval()
    try:
        yield
    finally:
        for model, mode in zip(distinct, was_training):
            model.train(mode)


def _logits(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    with torch.no_grad():
        parts = [torch.func.functional_call(model, params, (x[i:i + batch_size],)) for i in range(0, len(x), batch_size)]
    if not parts:
        return torch.empty(0, 0)
    return torch.cat(parts)


def evaluate(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the model on (x, y); NaN loss if the model diverged."""
    return evaluate_many([(model, params, x, y)])[0]


def evaluate_many(items: list[tuple[nn.Module, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]
                  ) -> list[tuple[float, float]]:
    """:func:`evaluate` of several (model, params, x, y), with one host synchronisation for all.

    Each item's loss and accuracy are computed by the same calls as for an item alone (its own
    logits, cross-entropy and argmax on its own set: a batched product over several models would
    round differently); only their transfer to the host is shared. An empty set gives NaN for both.
    """
    figures = []
    with _eval_mode([model for model, _, _, _ in items]):
        for model, params, x, y in items:
            if not len(y):
                continue
            logits = _logits(model, params, x)
            # the float32 loss widens to float64 exactly, so the host reads the same number as .item()
            figures += [F.cross_entropy(logits, y).double(), (logits.argmax(1) == y).double().mean()]
    values = iter(torch.stack(figures).tolist() if figures else [])
    return [(next(values), next(values)) if len(y) else (float("nan"), float("nan")) for _, _, _, y in items]
