"""A local DP-SGD step with any additive mechanism (Abadi et al. 2016; UDP-FL's client step,
Feng et al. 2024, §3.2):

    g̃ = (Σ_{i∈B} g_i·min(1, C/‖g_i‖) + noise) / (q·n),     noise_j ~ mechanism with sensitivity C,

with per-example gradients g_i (``torch.func``: ``vmap(grad)`` over examples, and over clients
for the batched engine), ℓ2 or ℓ1 per-example clipping, a Poisson batch B (each record with
probability q, so the expected batch size q·n divides the sum) and i.i.d. noise on every
coordinate drawn from a per-(client, round, step) generator — so the batched engine and the
per-client loop add the same noise.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.blocks.local_training import LocalObjective, Params
from defenses.blocks.mechanisms import Mechanism
from defenses.blocks.record_gradient_canaries import GradientCanaryLog

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")


def _example_loss(model, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(torch.func.functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))


def per_example_gradients(model, params: Params, x: torch.Tensor, y: torch.Tensor) -> Params:
    """Per-example gradients [C, B, *shape] of C clients' stacked parameters on their own batches."""
    per_client = torch.func.vmap(torch.func.grad(partial(_example_loss, model)), in_dims=(None, 0, 0), randomness="different")
    return torch.func.vmap(per_client, in_dims=(0, 0, 0), randomness="different")(params, x, y)


#: per-example gradients are computed in groups of about this many values (16 MB of float32):
#: below glibc's mmap threshold, so the buffers are reused instead of mapped and unmapped
#: (page faults) on every step
EXAMPLE_CHUNK_VALUES = 1 << 22


def clipped_gradient_sum(model, params: Params, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, clip: float,
                         clip_norm: str, canaries: GradientCanaryLog | None = None) -> Params:
    """Σ_i g_i·min(1, C/‖g_i‖) over each client's real examples ([C, *shape]), in chunks of examples;
    the gradient canaries joining this step (``canaries``) are examples of their holders, clipped by
    the same code (:mod:`defenses.blocks.record_gradient_canaries`)."""
    clients, width = mask.shape
    dim = sum(int(p[0].numel()) for p in params.values())
    step = max(1, EXAMPLE_CHUNK_VALUES // max(1, clients * dim))
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for start in range(0, width, step):
        part = slice(start, start + step)
        if not bool(mask[:, part].any()):
            continue
        gradients = per_example_gradients(model, params, x[:, part], y[:, part])
        for name, summed in clip_and_sum(gradients, mask[:, part], clip, clip_norm).items():
            total[name] += summed
    if canaries is not None:
        canaries.real_share(total)
        for rows, joined in canaries.rows(mask):
            for name, summed in clip_and_sum(rows, joined, clip, clip_norm).items():
                total[name] += summed
    return total


def clip_and_sum(gradients: Params, mask: torch.Tensor, clip: float, clip_norm: str) -> Params:
    """Σ_i g_i·min(1, C/‖g_i‖) over the examples of each client ([C, B, *shape] → [C, *shape]);
    ``mask`` [C, B] is 0 for padded examples."""
    weights = clip_factors(gradients, clip, clip_norm) * mask  # padded examples count 0
    return {name: (weights.view(*weights.shape, *([1] * (g.dim() - 2))) * g).sum(1) for name, g in gradients.items()}


def clip_factors(gradients: Params, clip: float, clip_norm: str) -> torch.Tensor:
    """min(1, C/‖g_i‖) for every example, norms over all parameters ([C, B])."""
    first = next(iter(gradients.values()))
    lead = first.shape[:2]
    if clip_norm == "l1":
        norms = sum(g.abs().reshape(*lead, -1).sum(-1) for g in gradients.values())
    else:
        norms = torch.sqrt(sum((g ** 2).reshape(*lead, -1).sum(-1) for g in gradients.values()))
    return torch.clamp(clip / norms.clamp_min(1e-12), max=1.0)


class DPSGDObjective(LocalObjective):
    """DP-SGD's noisy clipped gradient; ``mechanism_of(client)`` and ``expected_batch_of(client)``
    give each client its noise and its expected batch size q·n_i; ``pull_of(client)`` optionally
    returns (strength, target) for UDP-FL's heterogeneous-ε penalty λ_k(w − w_max)."""

    #: its noise streams are keyed by one run's seed and client ids: rows of other runs would
    #: draw this run's noise, so each run trains its own clients
    joins_runs = False

    def __init__(self, clip: float, clip_norm: str, mechanism_of: Callable[[int], Mechanism],
                 expected_batch_of: Callable[[int], float], seed: int,
                 pull_of: Callable[[int], tuple[float, Params] | None] | None = None):
        self.clip = clip
        self.clip_norm = clip_norm
        self.mechanism_of = mechanism_of
        self.expected_batch_of = expected_batch_of
        self.seed = seed
        self.pull_of = pull_of
        self.round = 0
        self.step = 0
        self.clients: list[int] = []

    def begin_round(self, ctx) -> None:
        self.round = ctx.round

    def at_step(self, step: int, clients: list[int]) -> None:
        self.step = step
        self.clients = list(clients)

    def noise(self, client: int, shapes: dict[str, torch.Size], device) -> Params:
        generator = torch_generator(self.seed, "round", self.round, "client", int(client), "dpsgd", self.step)
        total = sum(int(torch.Size(s).numel()) for s in shapes.values())
        flat = self.mechanism_of(client).sample(generator, (total,), scale=self.clip).to(torch.float32).to(device)
        out, start = {}, 0
        for name, shape in shapes.items():
            size = int(torch.Size(shape).numel())
            out[name] = flat[start:start + size].view(shape)
            start += size
        return out

    def _finish(self, name: str, summed: torch.Tensor, noise: torch.Tensor, client: int, params: torch.Tensor) -> torch.Tensor:
        g = (summed + noise) / self.expected_batch_of(client)
        pull = self.pull_of(client) if self.pull_of is not None else None
        if pull is not None:
            strength, target = pull
            g = g + strength * (params - target[name])
        return g

    def noisy_gradient(self, summed: Params, params: Params) -> Params:
        """g̃ of each client of this step (rows in the order of :meth:`at_step`'s clients): its clipped
        sum plus this step's noise, over its expected batch q·n_i (plus the optional pull)."""
        shapes = {n: p.shape[1:] for n, p in params.items()}
        device = next(iter(params.values())).device
        noises = [self.noise(c, shapes, device) for c in self.clients]
        return {name: torch.stack([self._finish(name, summed[name][i], noises[i][name], c, params[name][i])
                                   for i, c in enumerate(self.clients)])
                for name in params}

    def batched_gradient(self, model, params, anchor, x, y, mask):
        summed = clipped_gradient_sum(model, params, x, y, mask, self.clip, self.clip_norm, self.gradient_canaries)
        return self.noisy_gradient(summed, params)

    def released_scale(self, client: int) -> float:
        """B/C: what turns a coordinate of the released step g̃ into units of the clipped sum."""
        return self.expected_batch_of(client) / self.clip

    def module_backward(self, model, anchor, x, y):
        named = dict(model.named_parameters())
        params = {n: p.detach()[None] for n, p in named.items()}
        if len(y):
            mask = torch.ones(1, len(y), device=x.device)
            summed = {n: g[0] for n, g in clipped_gradient_sum(model, params, x[None], y[None], mask, self.clip,
                                                                 self.clip_norm).items()}
        else:  # an empty Poisson batch: only noise
            summed = {n: torch.zeros_like(p) for n, p in named.items()}
        client = self.clients[0]
        noise = self.noise(client, {n: p.shape for n, p in named.items()}, x.device)
        for name, p in named.items():
            p.grad = self._finish(name, summed[name], noise[name], client, p.detach())
