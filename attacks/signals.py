"""What a black-box membership attack observes of a model, computed from its logits.

* LiRA (Carlini et al. 2022, §IV-B) uses the logit-scaled confidence φ = log(p_y / (1 − p_y)),
  which makes the confidence on a record approximately Gaussian across models; computed as
  z_y − logsumexp_{j≠y} z_j, exact and unsaturated at p_y ≈ 1.
* Yeom et al. 2018 threshold the loss, Salem et al. 2019 the confidence, Song & Mittal 2021
  the (modified) prediction entropy.
* Query views: the record itself plus mirror images and one-pixel shifts of images (LiRA's
  augmented queries, §VI-B).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")

AUGMENTATIONS = ("none", "flip", "flip+shift")
_SHIFTS = {"shift-up": (0, 1), "shift-down": (2, 1), "shift-left": (1, 0), "shift-right": (1, 2)}


def augmentation_views(kind: str, augment: str) -> tuple[str, ...]:
    """The view names an augmentation setting queries (images only; tabular data: the record)."""
    if kind != "image" or augment == "none":
        return ("identity",)
    views = ("identity", "flip")
    if augment == "flip+shift":
        views += tuple(f"{name}{suffix}" for name in _SHIFTS for suffix in ("", "+flip"))
    return views


def view_inputs(x: torch.Tensor, views: tuple[str, ...]) -> list[torch.Tensor]:
    out = []
    for view in views:
        if view == "identity":
            out.append(x)
        elif view == "flip":
            out.append(torch.flip(x, dims=[-1]))
        else:
            name, _, flip = view.partition("+")
            dy, dx = _SHIFTS[name]
            height, width = x.shape[-2:]
            shifted = F.pad(x, (1, 1, 1, 1), mode="reflect")[..., dy:dy + height, dx:dx + width]
            out.append(torch.flip(shifted, dims=[-1]) if flip else shifted)
    return out


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _true_label(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """values[..., i, labels[i]] for arrays [..., records, classes]."""
    return np.take_along_axis(values, np.broadcast_to(labels[:, None], values.shape[:-1] + (1,)), -1)[..., 0]


def logit_scaled_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """φ = log p_y − log(1 − p_y) for logits [..., records, classes], stably (float64)."""
    logits = logits.astype(np.float64)
    true = _true_label(logits, labels)
    others = logits.copy()
    np.put_along_axis(others, np.broadcast_to(labels[:, None], logits.shape[:-1] + (1,)), -np.inf, -1)
    top = others.max(-1, keepdims=True)
    return true - (top[..., 0] + np.log(np.exp(others - top).sum(-1)))


def loss(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Cross-entropy of each record, float64: −log p_y = log(1 + (1 − p_y)/p_y) = log(1 + e^{−φ}).

    Through φ, not log-softmax: where the true class leads the others by more than ≈ 37 nats the
    log-softmax sum is 1 in float64 and every such loss would be exactly 0 — a tie at the most
    confident records, just where a low-FPR threshold sits."""
    return np.logaddexp(0.0, -logit_scaled_confidence(logits, labels))


def confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Probability the model gives the record's true label."""
    return np.exp(_true_label(_log_softmax(logits), labels))


def entropy(logits: np.ndarray, labels: np.ndarray | None = None, modified: bool = False) -> np.ndarray:
    """Prediction entropy, or Song & Mittal's modified entropy (needs the labels):
    Mentr = −(1 − p_y) log p_y − Σ_{j≠y} p_j log(1 − p_j), low for a confident correct prediction."""
    log_p = _log_softmax(logits)
    p = np.exp(log_p)
    if not modified:
        return -(p * log_p).sum(-1)
    p_true = _true_label(p, labels)
    log_not = np.log(np.clip(1.0 - p, 1e-300, None))
    rest = -(p * log_not).sum(-1) + _true_label(p * log_not, labels)
    return -(1.0 - p_true) * _true_label(log_p, labels) + rest
