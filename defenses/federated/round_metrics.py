"""What a finished round records about its updates, and whether it diverged — for one run or several.

The per-round metrics of the round loop (:mod:`defenses.federated.engine`): the distribution of
the pre-clip update norms (quantiles, mean, the rounded list) and the divergence check (a
non-finite global model, or a non-finite loss where one is computed). Runs trained together
(:mod:`defenses.run_batch`) finish their rounds together: their norms cross to the host in one
transfer and their global models are checked for non-finite values with one synchronisation,
while each run's figures are computed exactly as for a run alone (a run alone is the case of one).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


LOSS_NAMES = {"train_loss": "training loss", "test_loss": "test loss"}

QUANTILES = (("update_norm_min", 0.0), ("update_norm_q25", 0.25), ("update_norm_median", 0.5), ("update_norm_q75", 0.75),
             ("update_norm_max", 1.0))


def _losses_diverged(row: dict[str, Any] | None, losses: tuple[str, ...]) -> str | None:
    for name in losses:
        value = (row or {}).get(name)
        if value is not None and not math.isfinite(value):
            return f"non-finite {LOSS_NAMES.get(name, name)}"
    return None


def divergence(params: torch.Tensor | dict[str, torch.Tensor], row: dict[str, Any] | None = None,
               losses: tuple[str, ...] = ()) -> str | None:
    """What is non-finite after a round — the global parameters (a flat vector or a parameter dict),
    or one of the ``losses`` named in the round's metrics ``row`` — or None when all is finite."""
    tensors = params.values() if isinstance(params, dict) else (params,)
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        return "non-finite parameters"
    return _losses_diverged(row, losses)


def divergences(vectors: list[torch.Tensor], rows: list[dict[str, Any]], losses: list[tuple[str, ...]]) -> list[str | None]:
    """:func:`divergence` of several runs' flat global vectors, with one host synchronisation."""
    if not vectors:
        return []
    finite = torch.stack([torch.isfinite(v).all() for v in vectors]).tolist()
    return [_losses_diverged(row, names) if ok else "non-finite parameters" for ok, row, names in zip(finite, rows, losses)]


def norm_list(values: list[float]) -> list[float]:
    """Norms rounded to 6 significant digits, for the per-round distribution in metrics.jsonl."""
    return [float(f"{v:.6g}") for v in values]


def norm_summaries(norms: list[torch.Tensor]) -> list[tuple[dict[str, float], list[float]]]:
    """For each run's update norms: (min, quartiles, max and mean; the rounded list).

    All runs' norms cross to the host in one float64 transfer; runs with the same number of rows
    share one numpy call along axis 1, which computes each row's quantiles and mean as the 1-d call
    does (the same partition, interpolation and pairwise sum of a contiguous row).
    """
    if not norms:
        return []
    sizes = [int(n.shape[0]) for n in norms]
    values = torch.cat([n.detach().reshape(-1).to(torch.float64) for n in norms]).cpu().numpy()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    summaries: list[dict[str, float]] = [{} for _ in norms]
    for size in sorted(set(sizes)):
        which = [k for k, s in enumerate(sizes) if s == size]
        block = np.stack([values[offsets[k]:offsets[k] + size] for k in which])
        q = np.quantile(block, [level for _, level in QUANTILES], axis=1)
        means = block.mean(axis=1)
        for j, k in enumerate(which):
            summary = {name: float(q[i, j]) for i, (name, _) in enumerate(QUANTILES)}
            summary["update_norm_mean"] = float(means[j])
            summaries[k] = summary
    listed = values.tolist()
    return [(summary, norm_list(listed[offsets[k]:offsets[k + 1]])) for k, summary in enumerate(summaries)]
