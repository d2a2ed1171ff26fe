"""C clients' convolutional networks as one grouped network (defenses.blocks.grouped_network): the
batched engine's gradients and trained models equal the reference — torch.autograd through the
plain module (F.conv2d), one client at a time — for every channel padding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from audit.core.models import build_model
from defenses.blocks import grouped_network
from defenses.blocks.local_training import (
    LocalObjective,
    LocalSchedule,
    OptimizerSettings,
    client_batches,
    mean_loss_gradient,
    stacked_forward,
    train_batched,
    train_loop,
)


def _odd_network() -> nn.Module:
    """Odd sizes everywhere: 3 → 5 → 7 channels, a non-square kernel and stride, no bias, pooling, two linear layers."""
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 5, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(5, 7, (3, 2), stride=(2, 1), padding=(1, 0), bias=False), nn.Tanh(), nn.AvgPool2d(1),
        nn.Flatten(), nn.Linear(7 * 3 * 3, 6), nn.Sigmoid(), nn.Linear(6, 4, bias=False),
    )


NETWORKS = {"odd": (_odd_network, (3, 11, 9), 4), "lenet": (lambda: build_model("lenet", (1, 28, 28), 10), (1, 28, 28), 10)}


def _stacked(model: nn.Module, clients: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Different parameters per client (the global model plus a client's own perturbation)."""
    generator = torch.Generator().manual_seed(seed)
    return {n: p.detach().unsqueeze(0) + 0.1 * torch.randn(clients, *p.shape, generator=generator)
            for n, p in model.named_parameters()}


def _reference_gradient(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> dict:
    """Client by client: the plain module, its real rows only, torch.autograd."""
    out: dict[str, list[torch.Tensor]] = {n: [] for n in params}
    for c in range(x.shape[0]):
        local = copy.deepcopy(model)
        with torch.no_grad():
            for n, p in local.named_parameters():
                p.copy_(params[n][c])
        real = mask[c] > 0
        loss = nn.functional.cross_entropy(local(x[c][real]), y[c][real]) if real.any() else sum(
            p.sum() * 0 for p in local.parameters())
        grads = torch.autograd.grad(loss, list(local.parameters()), allow_unused=True)
        for (n, p), g in zip(local.named_parameters(), grads):
            out[n].append(torch.zeros_like(p) if g is None else g)
    return {n: torch.stack(v) for n, v in out.items()}


def _close(a: dict, b: dict, tolerance: float = 1e-5) -> None:
    for name in a:
        scale = max(1.0, float(b[name].abs().max()))
        assert float((a[name] - b[name]).abs().max()) <= tolerance * scale, name


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("block", [1, 8, 16])
def test_batched_gradient_equals_the_reference_convolution(network, block):
    factory, shape, classes = NETWORKS[network]
    model = factory()
    assert grouped_network.supports(model)
    clients, batch = 3, 5
    params = _stacked(model, clients)
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(clients, batch, *shape, generator=generator)
    y = torch.randint(0, classes, (clients, batch), generator=generator)
    mask = torch.ones(clients, batch)
    mask[1, 3:] = 0  # padding rows
    mask[2] = 0  # a client with an empty batch: zero gradient
    assert grouped_network.applies(model, x)
    with grouped_network.channel_block(block):
        gradients = LocalObjective().batched_gradient(model, params, params, x, y, mask)
    expected = _reference_gradient(model, params, x, y, mask)
    _close(gradients, expected)
    assert all(float(g[2].abs().max()) == 0.0 for g in gradients.values())


def test_a_clients_gradient_does_not_depend_on_the_clients_beside_it():
    """Runs trained together must equal runs trained alone bit for bit (defenses.run_batch): a client's
    gradient is the same whether 10 or 40 clients share the grouped computation. Several threads,
    where kernels split reductions among threads by the size of the problem (oneDNN's fused bias
    gradient did, so the bias is added apart)."""
    model = build_model("lenet", (1, 28, 28), 10)
    params = _stacked(model, 40)
    generator = torch.Generator().manual_seed(4)
    x, y = torch.rand(40, 16, 1, 28, 28, generator=generator), torch.randint(0, 10, (40, 16), generator=generator)
    mask = torch.ones(40, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        together = LocalObjective().batched_gradient(model, params, params, x, y, mask)
        alone = LocalObjective().batched_gradient(model, {n: p[:10] for n, p in params.items()}, None, x[:10], y[:10], mask[:10])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(together[n][:10], alone[n]) for n in together)


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_clients_in_groups_under_the_activation_budget_give_the_same_gradients(monkeypatch, network):
    """Many clients go through in groups (a small budget here: 1 or 2 clients per group, the last one
    smaller): the gradients are the reference's — for LeNet bit for bit those of one computation
    over all. (Not for any network: torch's vectorised sigmoid, tanh and exp round differently from
    their scalar code, which takes the elements left over after the last full vector, so with sizes
    that are not multiples of the vector width a group's size can move a last bit; LeNet's padded
    16-channel activations are.)"""
    factory, shape, classes = NETWORKS[network]
    model = factory()
    params = _stacked(model, 5)
    generator = torch.Generator().manual_seed(5)
    x, y = torch.rand(5, 4, *shape, generator=generator), torch.randint(0, classes, (5, 4), generator=generator)
    mask = torch.ones(5, 4)
    whole = LocalObjective().batched_gradient(model, params, params, x, y, mask)
    one_client = 4 * grouped_network._activation_per_example(model, shape, grouped_network.CPU_CHANNEL_BLOCK)
    for clients_per_group in (1, 2):
        monkeypatch.setattr(grouped_network, "ACTIVATION_BUDGET", clients_per_group * one_client)
        grouped = LocalObjective().batched_gradient(model, params, params, x, y, mask)
        _close(grouped, _reference_gradient(model, params, x, y, mask))
        if network == "lenet":
            assert all(torch.equal(grouped[n], whole[n]) for n in whole)


def test_forward_equals_vmap_and_keeps_eval_mode_semantics():
    model = build_model("lenet", (1, 28, 28), 10)
    params = _stacked(model, 4)
    x = torch.rand(4, 6, 1, 28, 28)
    expected = torch.func.vmap(torch.func.functional_call, in_dims=(None, 0, 0))(model, params, (x,))
    assert torch.allclose(stacked_forward(model, params, x), expected, atol=1e-5)
    records = [np.arange(0, 7), np.arange(7, 10), np.arange(10, 30), np.arange(30, 31)]
    pool_x, pool_y = torch.rand(31, 1, 28, 28), torch.randint(0, 10, (31,))
    full = mean_loss_gradient(model, params, records, pool_x, pool_y, batch_size=4)
    mask = torch.zeros(4, 20)
    for c, r in enumerate(records):
        mask[c, :len(r)] = 1
    index = torch.as_tensor(np.stack([np.pad(r, (0, 20 - len(r))) for r in records]))
    _close(full, _reference_gradient(model, params, pool_x[index], pool_y[index], mask))


def test_trained_models_equal_the_loop_with_per_client_starts_and_unequal_clients():
    """SGD with momentum and weight decay over a padded schedule (clients of 9, 4 and 1 records,
    different starting models): the batched engine's models are the loop's."""
    model = _odd_network()
    sizes = [9, 4, 1]
    members = [np.arange(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(3)]
    batches = [client_batches(n, "epochs", 2, 3, np.random.default_rng(i)) for i, n in enumerate(sizes)]
    schedule = LocalSchedule.build(batches, members)
    pool_x, pool_y = torch.rand(sum(sizes), 3, 11, 9), torch.randint(0, 4, (sum(sizes),))
    opt = OptimizerSettings(lr=0.1, momentum=0.9, weight_decay=1e-3)
    starts = _stacked(model, 3, seed=2)
    batched = train_batched(model, LocalObjective(), starts, schedule, pool_x, pool_y, opt, per_client_start=True)
    loop = {n: [] for n in starts}
    for c in range(3):  # the loop trains from one global model: run it once per client's start
        one = train_loop(model, LocalObjective(), {n: p[c] for n, p in starts.items()}, schedule.select([c]),
                         pool_x, pool_y, opt)
        for n in loop:
            loop[n].append(one[n][0])
    _close(batched, {n: torch.stack(v) for n, v in loop.items()})


@pytest.mark.parametrize("layer", [
    nn.Conv2d(3, 4, 3, groups=1, dilation=2), nn.Conv2d(4, 4, 3, groups=2), nn.Conv2d(3, 4, 3, padding="same"),
    nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.Dropout(0.5), nn.BatchNorm2d(3),
])
def test_other_layers_keep_the_vmap_path(layer):
    model = nn.Sequential(nn.Conv2d(3, 3, 1), layer, nn.Flatten(), nn.LazyLinear(2))
    assert not grouped_network.supports(model)


def test_which_models_are_supported():
    assert grouped_network.supports(build_model("lenet", (1, 28, 28), 10))
    assert grouped_network.supports(build_model("cnn-tiny", (1, 28, 28), 10))
    assert not grouped_network.supports(build_model("mlp", (1, 8, 8), 10))  # no convolution: vmap
    dropout = build_model("cnn2", (1, 28, 28), 10)
    assert not grouped_network.supports(dropout)  # dropout draws its masks under vmap
    assert grouped_network.supports(dropout.eval())  # ... but is the identity in eval mode
    assert not grouped_network.supports(nn.Sequential(nn.Sequential(nn.Conv2d(1, 2, 3)), nn.Flatten(), nn.Linear(2, 2)))
