"""How FL-TOP chooses the K coordinates its clients train and exchange: Kerkouche, Ács,
Castelluccia, Genevès, "Constrained Differentially Private Federated Learning for Low-bandwidth
Devices" (UAI 2021).

* :func:`select_top_k` (§3.1, §4, Alg. 1): before training the server runs T_init SGD steps on a
  small public batch and keeps the K coordinates with the largest accumulated |gradient| (or the
  largest change |w_T − w0|).
* :func:`private_top_k` (our form of the alternative §3.2.3 mentions): without public data,
  sampled clients train from w0 and send their local top-K indicator, scaled to norm S and noised
  as in FL-TOP-DP; the server keeps the K largest coordinates of the noisy sum. It is one more
  noisy round, which the claim accounts.

Both return the K indices sorted; ties go to the lower index (stable sorts).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, torch_generator
from defenses.blocks.local_training import (
    LocalObjective,
    LocalSchedule,
    OptimizerSettings,
    client_batches,
    train_batched,
)
from defenses.blocks.noise import gaussian_rows

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")


def select_top_k(model: torch.nn.Module, initial: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, steps: int,
                 lr: float, keep: int, score: str) -> torch.Tensor:
    """§4: T_init SGD steps on one public batch; the K coordinates with the largest Σ|g|
    (``score: abs_gradient``) or the largest |w_T − w0| (``change``), sorted; ties by lower index."""
    params = {n: p.detach().clone() for n, p in initial.items()}
    names = list(params)
    accumulated = torch.zeros(sum(p.numel() for p in params.values()), dtype=torch.float64)

    def loss(p):
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    for _ in range(steps):
        gradients = torch.func.grad(loss)(params)
        accumulated += torch.cat([gradients[n].reshape(-1) for n in names]).abs().double().cpu()
        params = {n: params[n] - lr * gradients[n] for n in names}
    if score == "change":
        accumulated = torch.cat([(params[n] - initial[n]).reshape(-1) for n in names]).abs().double().cpu()
    order = torch.sort(accumulated, descending=True, stable=True).indices[:keep]
    return torch.sort(order).values


def private_top_k(job, model, initial, keep: int, clip: float, noise_multiplier: float) -> torch.Tensor:
    """After §3.2.3: sampled clients train from w0, send their local top-K indicator (scaled to norm S =
    ``clip`` and noised as in FL-TOP-DP), the server keeps the K largest of the noisy sum."""
    dim = sum(p.numel() for p in initial.values())
    rng = numpy_rng(job.seed, "private-topk", "sampling")
    chosen = np.flatnonzero(rng.random(len(job.clients)) < job.training.sampling_rate(len(job.clients)))
    if len(chosen) == 0:
        # the accounted round is a Poisson-sampled Gaussian, which releases N(0, S²σ²) even when
        # nobody is sampled: the server draws the noise itself (forcing a client in would not be)
        noise = gaussian_rows(1, dim, clip * noise_multiplier,
                              [torch_generator(job.seed, "private-topk", "server", "noise")], job.pool_x.device)[0]
        return torch.sort(torch.sort(noise, descending=True, stable=True).indices[:keep]).values
    batches = [client_batches(len(job.clients[c]), job.training.local_unit, job.training.local_steps, job.training.batch_size,
                              numpy_rng(job.seed, "private-topk", "client", int(c))) for c in chosen]
    schedule = LocalSchedule.build(batches, [job.clients[c] for c in chosen], chosen)
    local = train_batched(model, LocalObjective(), initial, schedule, job.pool_x, job.pool_y, OptimizerSettings(job.training.lr))
    start = torch.cat([p.reshape(-1) for p in initial.values()])
    changes = torch.cat([local[n].reshape(len(chosen), -1) for n in initial], dim=1) - start
    indicators = torch.zeros_like(changes)
    top = torch.sort(changes.abs(), dim=1, descending=True, stable=True).indices[:, :keep]
    indicators.scatter_(1, top, clip / math.sqrt(keep))  # ℓ2 norm S
    std = clip * noise_multiplier / math.sqrt(len(chosen))
    generators = [torch_generator(job.seed, "private-topk", "client", int(c), "noise") for c in chosen]
    noisy = (indicators + gaussian_rows(len(chosen), dim, std, generators, indicators.device)).sum(0)
    return torch.sort(torch.sort(noisy, descending=True, stable=True).indices[:keep]).values
