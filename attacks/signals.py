"""What a black-box membership attack observes of a model: its confidence on a record's true label.

LiRA (Carlini et al. 2022, §IV-B) uses the logit-scaled confidence φ = log(p_y / (1 − p_y)),
which makes the confidence on a record approximately Gaussian across models. Computed from
the logits z as z_y − logsumexp_{j≠y} z_j, which is exact and does not saturate at p_y ≈ 1.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from defenses.evaluation import logits_of

AUGMENTATIONS = ("none", "flip", "flip+shift")


def logit_scaled_confidence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """φ = log p_y − log(1 − p_y) per row, stably."""
    logits = logits.to(torch.float64)
    true = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return true - torch.logsumexp(others, dim=1)


def query_views(x: torch.Tensor, kind: str, augment: str) -> list[torch.Tensor]:
    """The inputs queried per record: the record itself, plus mirror images and one-pixel shifts
    of images (LiRA's augmented queries, §VI-B)."""
    views = [x]
    if kind != "image" or augment == "none":
        return views
    views.append(torch.flip(x, dims=[-1]))
    if augment == "flip+shift":
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        height, width = x.shape[-2:]
        for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
            shifted = padded[..., dy:dy + height, dx:dx + width]
            views += [shifted, torch.flip(shifted, dims=[-1])]
    return views


def confidence_signals(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                       kind: str, augment: str = "none") -> np.ndarray:
    """φ of every record under every query view: float64 array [records, views]."""
    columns = [logit_scaled_confidence(logits_of(model, params, view), y) for view in query_views(x, kind, augment)]
    return torch.stack(columns, dim=1).cpu().numpy()
