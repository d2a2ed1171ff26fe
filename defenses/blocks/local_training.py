"""Local client training: local SGD from the global model, batched over clients or one client at a time.

A round's local work is described by a :class:`LocalSchedule`: for every client the sequence
of mini-batches (pool indices) it trains on, padded to a common shape with a mask. Padding is
what lets clients of different sizes share one batched computation: a padded example has
weight 0 in the batch mean, and a padded *step* (a client that has finished its epochs) leaves
that client's parameters and momentum unchanged.

Two interchangeable paths train a schedule:

* :func:`train_batched` — all clients at once: ``torch.func.functional_call`` on stacked
  parameters, ``vmap`` over clients for the forward pass, one backward pass for all, SGD
  applied to the stacked tensors;
* :func:`train_loop` — the reference path: a plain ``nn.Module`` and ``torch.optim.SGD`` per client.

Both consume the same schedule (drawn from per-client seed streams), so for the same seed they
give the same models up to float rounding; ``tests/defenses/federated/test_engine.py`` checks it.
Dropout is the exception: ``vmap`` draws dropout masks differently from the loop, so models
with dropout agree in distribution, not bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from audit.core.lazy_modules import lazy_module
from defenses.blocks import grouped_network
from defenses.blocks.flat import parameters_of
from defenses.blocks.record_gradient_canaries import GradientCanaryLog

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")

Params = dict[str, "torch.Tensor"]


# --------------------------------------------------------------------------- schedules


def client_batches(num_records: int, unit: str, count: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A client's mini-batches as local indices 0..n-1.

    ``unit="epochs"``: ``count`` passes over a fresh permutation, cut into batches of
    ``batch_size`` (the last one smaller). ``unit="iterations"``: ``count`` batches of
    min(batch_size, n) records drawn from successive permutations (reshuffle and cycle,
    our choice).
    """
    if num_records < 1:
        return []
    if unit == "epochs":
        batches = []
        for _ in range(count):
            order = rng.permutation(num_records)
            batches.extend(order[i:i + batch_size] for i in range(0, num_records, batch_size))
        return batches
    size = min(batch_size, num_records)
    needed = count * size
    stream = np.concatenate([rng.permutation(num_records) for _ in range(-(-needed // num_records))])
    return [stream[i * size:(i + 1) * size] for i in range(count)]


@dataclass
class LocalSchedule:
    """Padded mini-batch schedule of C clients: S steps of up to B examples each."""

    indices: torch.Tensor  # int64 [C, S, B], pool indices (0 where padded)
    mask: torch.Tensor  # float32 [C, S, B], 1 for real examples
    active: torch.Tensor  # bool [C, S], False for padded steps (a real step may have an empty batch)
    steps: list[int]  # real steps per client
    clients: np.ndarray | None = None  # the client id of each row, for per-client randomness

    @classmethod
    def concat(cls, schedules: list[LocalSchedule]) -> LocalSchedule:
        """One schedule of the rows of several (padded to the longest run of steps and widest batch)."""
        steps = max(s.indices.shape[1] for s in schedules)
        width = max(s.indices.shape[2] for s in schedules)

        def padded(tensor: torch.Tensor) -> torch.Tensor:  # zeros (False) after the real entries
            out = tensor.new_zeros((tensor.shape[0], steps, width)[:tensor.dim()])
            out[tuple(slice(0, n) for n in tensor.shape)] = tensor
            return out

        return cls(torch.cat([padded(s.indices) for s in schedules]), torch.cat([padded(s.mask) for s in schedules]),
                   torch.cat([padded(s.active) for s in schedules]), [n for s in schedules for n in s.steps])

    @classmethod
    def build(cls, batches_per_client: list[list[np.ndarray]], member_indices: list[np.ndarray],
              clients: np.ndarray | None = None) -> LocalSchedule:
        """From each client's local-index batches and its pool indices."""
        rows = len(batches_per_client)
        steps = [len(b) for b in batches_per_client]
        max_steps = max(steps, default=0)
        width = max((len(batch) for batches in batches_per_client for batch in batches), default=1)
        width = max(width, 1)  # a schedule of empty Poisson batches still needs a tensor to mask
        indices = np.zeros((rows, max_steps, width), dtype=np.int64)
        mask = np.zeros((rows, max_steps, width), dtype=np.float32)
        for c, (batches, members) in enumerate(zip(batches_per_client, member_indices)):
            for s, batch in enumerate(batches):
                indices[c, s, :len(batch)] = members[batch]
                mask[c, s, :len(batch)] = 1.0
        active = torch.as_tensor(np.arange(max_steps)[None, :] < np.array(steps, dtype=np.int64).reshape(-1, 1))
        return cls(torch.as_tensor(indices), torch.as_tensor(mask), active, steps,
                   None if clients is None else np.asarray(clients))

    def select(self, rows: list[int]) -> LocalSchedule:
        """The sub-schedule of some clients, trimmed to their longest run of steps."""
        index = torch.as_tensor(rows, dtype=torch.int64)
        steps = [self.steps[r] for r in rows]
        keep = max(steps, default=0)
        clients = None if self.clients is None else self.clients[np.asarray(rows, dtype=np.int64)]
        return LocalSchedule(self.indices[index, :keep], self.mask[index, :keep], self.active[index, :keep], steps, clients)

    def client(self, row: int) -> int:
        return int(self.clients[row]) if self.clients is not None else row


# --------------------------------------------------------------------------- objectives


def stacked_forward(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """Outputs of C models (stacked parameters [C, *shape]) on their own inputs x [C, B, ...].

    Plain convolutional networks on the CPU run as one network of grouped convolutions
    (:mod:`defenses.blocks.grouped_network`: the same outputs up to float rounding); the rest under ``vmap``.
    """
    if grouped_network.applies(model, x):
        return grouped_network.grouped_forward(model, params, x)
    return torch.func.vmap(partial(torch.func.functional_call, model), in_dims=(0, 0), randomness="different")(params, (x,))


def masked_mean_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-client mean cross-entropy over the real (mask = 1) examples: logits [C, B, K] → [C]."""
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1.0)


class LocalObjective:
    """The loss a client minimises; the default is the mean cross-entropy of the batch.

    Defenses that change the local step (a penalty, a sharpness-aware step, per-example
    clipping) subclass it and override both methods consistently.
    """

    #: whether clients of several independent runs may share one batched computation
    #: (:mod:`defenses.run_batch`): true when the gradient depends only on the parameters, the
    #: anchor and the batch — false for objectives with per-run state (a run's noise streams or masks)
    joins_runs: ClassVar[bool] = True
    #: the run's record-level gradient canaries (:mod:`defenses.blocks.record_gradient_canaries`), set by the
    #: engine on an objective that clips per example (a DP-SGD step); None: no canaries
    gradient_canaries: GradientCanaryLog | None = None

    def released_scale(self, client: int) -> float:
        """What turns a coordinate of ``client``'s released step into units of its clipped sum
        (B/C for DP-SGD); only an objective that clips per example has one."""
        raise NotImplementedError(f"{type(self).__name__} clips no per-example gradient: no gradient canaries")

    def batched_gradient(self, model: nn.Module, params: Params, anchor: Params,
                         x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> Params:
        """Every client's gradient at once: parameters stacked [C, *shape], data [C, B, ...].

        Clients are independent, so the gradient of the *sum* of their losses with respect to
        client c's parameters is client c's own gradient: one vmapped forward and one backward
        pass serve all clients. ``anchor`` is the global model the clients started from;
        ``mask`` [C, B] marks real examples.
        """
        names = list(params)
        with torch.enable_grad():
            leaves = {n: params[n].detach().requires_grad_(True) for n in names}
            losses = masked_mean_cross_entropy(stacked_forward(model, leaves, x), y, mask)
            gradients = torch.autograd.grad(losses.sum(), [leaves[n] for n in names])
        return dict(zip(names, gradients))

    def module_backward(self, model: nn.Module, anchor: Params, x: torch.Tensor, y: torch.Tensor) -> None:
        """Loop path: accumulate the same gradient into ``model``'s ``.grad`` fields."""
        F.cross_entropy(model(x), y).backward()

    def begin_round(self, ctx) -> None:
        """Called by the engine before a round's local training (objectives with per-round state)."""

    def at_step(self, step: int, clients: list[int]) -> None:
        """Called by both trainers before each local step: the step index and the clients computed now."""


@dataclass(frozen=True)
class OptimizerSettings:
    """torch.optim semantics.

    ``sgd``: d = g + wd·w; b = μ·b + d; w = w − lr·(b if μ else d).
    ``adam`` (Kingma & Ba 2015, as torch.optim.Adam): d = g + wd·w; m = β₁m + (1−β₁)d;
    v = β₂v + (1−β₂)d²; w = w − lr·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + eps), t counted per client.
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    kind: str = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def torch_optimizer(self, parameters) -> torch.optim.Optimizer:
        if self.kind == "adam":
            return torch.optim.Adam(parameters, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        return torch.optim.SGD(parameters, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


# --------------------------------------------------------------------------- the two paths


def _stack(params: Params, clients: int) -> Params:
    return {n: p.unsqueeze(0).repeat(clients, *([1] * p.dim())).contiguous() for n, p in params.items()}


def train_batched(model: nn.Module, objective: LocalObjective, global_params: Params, schedule: LocalSchedule,
                  pool_x: torch.Tensor, pool_y: torch.Tensor, opt: OptimizerSettings,
                  per_client_start: bool = False) -> Params:
    """Train C clients as one vmapped computation; returns stacked parameters [C, *shape].

    With ``per_client_start``, ``global_params`` is already stacked [C, *shape]: each client's
    own starting model (clients of several independent runs trained together,
    :mod:`defenses.run_batch`), which is also the anchor the objective sees.
    """
    clients, max_steps = schedule.active.shape
    params = {n: p.clone() for n, p in global_params.items()} if per_client_start else _stack(global_params, clients)
    adam = opt.kind == "adam"
    first = {n: torch.zeros_like(p) for n, p in params.items()} if (opt.momentum or adam) else {}
    second = {n: torch.zeros_like(p) for n, p in params.items()} if adam else {}
    taken = torch.zeros(clients, dtype=torch.float64, device=pool_x.device)  # Adam's per-client step count t
    ids = [schedule.client(i) for i in range(clients)]
    device = pool_x.device
    canaries = objective.gradient_canaries
    for s in range(max_steps):
        objective.at_step(s, ids)
        if canaries is not None:
            canaries.begin_step(s, ids, schedule.active[:, s].tolist())
        index = schedule.indices[:, s].to(device)
        gradients = objective.batched_gradient(model, params, global_params, pool_x[index], pool_y[index],
                                               schedule.mask[:, s].to(device))
        if canaries is not None:  # the released step, as the optimiser gets it
            canaries.read(gradients, objective.released_scale)
        active = schedule.active[:, s].to(device)
        everyone = bool(active.all())
        if adam:
            taken += active.to(taken.dtype)
        for name, p in params.items():
            d_p = gradients[name]
            shape = (clients,) + (1,) * (p.dim() - 1)
            if opt.weight_decay:
                # the same arithmetic on both branches (add with alpha), so a client's result does not
                # depend on whether others in its batch have finished (runs trained together, chunks)
                d_p = d_p.add_(p, alpha=opt.weight_decay) if everyone else d_p.add(p, alpha=opt.weight_decay)
            if adam:
                beta1, beta2 = opt.betas
                m = beta1 * first[name] + (1 - beta1) * d_p
                v = beta2 * second[name] + (1 - beta2) * d_p * d_p
                correction1 = (1 - beta1 ** taken.clamp_min(1)).to(p.dtype).view(shape)
                correction2 = (1 - beta2 ** taken.clamp_min(1)).to(p.dtype).view(shape)
                step = (m / correction1) / ((v / correction2).sqrt() + opt.eps)
                first[name] = m if everyone else torch.where(active.view(shape), m, first[name])
                second[name] = v if everyone else torch.where(active.view(shape), v, second[name])
            elif opt.momentum:
                if everyone:  # in place: the common case, no temporaries
                    step = first[name].mul_(opt.momentum).add_(d_p)
                else:
                    new = opt.momentum * first[name] + d_p
                    first[name] = torch.where(active.view(shape), new, first[name])
                    step = first[name]
            else:
                step = d_p
            if everyone:
                p.add_(step, alpha=-opt.lr)
            else:  # clients that have finished keep their state
                params[name] = torch.where(active.view(shape), p.add(step, alpha=-opt.lr), p)
    return params


def train_loop(model: nn.Module, objective: LocalObjective, global_params: Params, schedule: LocalSchedule,
               pool_x: torch.Tensor, pool_y: torch.Tensor, opt: OptimizerSettings) -> Params:
    """Reference path: one ``nn.Module`` + a ``torch.optim`` optimiser per client, unpadded batches."""
    results = []
    for c, steps in enumerate(schedule.steps):
        local = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in local.named_parameters():
                p.copy_(global_params[name])
        local.train()
        optimizer = opt.torch_optimizer(local.parameters())
        for s in range(steps):
            objective.at_step(s, [schedule.client(c)])
            real = schedule.indices[c, s][schedule.mask[c, s] > 0].to(pool_x.device)
            optimizer.zero_grad(set_to_none=True)
            objective.module_backward(local, global_params, pool_x[real], pool_y[real])
            optimizer.step()
        results.append(parameters_of(local))
    return {n: torch.stack([r[n] for r in results]) for n in global_params}


TRAINERS: dict[str, Callable[..., Params]] = {"batched": train_batched, "loop": train_loop}


def mean_loss_gradient(model: nn.Module, params: Params, index_sets: list[np.ndarray], pool_x: torch.Tensor,
                       pool_y: torch.Tensor, batch_size: int = 512) -> Params:
    """Per-client gradient of the mean cross-entropy over the given records, in eval mode.

    ``params`` are stacked [C, *shape]; ``index_sets[c]`` are the pool indices of client c's
    records. Gradients of per-batch loss *sums* are accumulated and divided by each client's
    record count, so the result is the full-data gradient whatever the batching.
    """
    batches = [[np.arange(i, min(i + batch_size, len(s))) for i in range(0, len(s), batch_size)] for s in index_sets]
    schedule = LocalSchedule.build(batches, index_sets)
    names = list(params)
    totals = {n: torch.zeros_like(p) for n, p in params.items()}
    was_training = model.training
    model.eval()
    try:
        for s in range(schedule.indices.shape[1]):
            index = schedule.indices[:, s].to(pool_x.device)
            mask = schedule.mask[:, s].to(pool_x.device)
            with torch.enable_grad():
                leaves = {n: params[n].detach().requires_grad_(True) for n in names}
                logits = stacked_forward(model, leaves, pool_x[index])
                losses = F.cross_entropy(logits.flatten(0, 1), pool_y[index].flatten(), reduction="none").view_as(mask)
                gradients = torch.autograd.grad((losses * mask).sum(), [leaves[n] for n in names])
            for n, g in zip(names, gradients):
                totals[n] += g
    finally:
        model.train(was_training)
    counts = torch.as_tensor([max(1, len(s)) for s in index_sets], dtype=torch.float32, device=pool_x.device)
    return {n: t / counts.view(-1, *([1] * (t.dim() - 1))) for n, t in totals.items()}
