"""C clients' copies of a plain convolutional network run as one network of grouped convolutions.

The batched engine (:mod:`defenses.blocks.local_training`) trains C clients at once. ``vmap``
already turns C clients' convolutions into one convolution with C groups, but it moves the
client dimension into the channels and back around every layer (a copy each way, forward and
backward), and the groups it makes have the model's own channel counts. This module runs a
``nn.Sequential`` of convolutions, pooling, element-wise activations, ``Flatten`` and linear
layers directly on the grouped layout [B, C·channels, H, W] from the first convolution to the
flatten, and the linear layers as batched matrix products [C, B, in] @ [C, in, out].

On the CPU each group's channels are padded with zeros to a multiple of :data:`CPU_CHANNEL_BLOCK`:
oneDNN's direct (JIT) kernels block channels by the vector width (16 fp32 lanes with AVX-512), and
groups of, e.g., 12 channels otherwise fall back to its im2col + GEMM kernels for the weight
gradient — several times slower than the padded convolution, for all its 16²/12² more
multiply-adds. The padding does not change the mathematics: a padded output channel has zero
weights and bias, a padded input channel zero weights, so every real output is the same sum of
products (up to float rounding of the summation order), the padded channels' values never reach
a real one, and the gradient of the real parameters is the slice of the padded one (the
adjoint of the zero padding). The data's own channels (images: 1 or 3) are not padded. Every
tensor stays in torch's default (NCHW) layout: channels-last grouped convolutions measured slower
here, and converting between the two costs a copy of the activations each way.

Only what this layout computes exactly is supported (:func:`supports`); any other model keeps
the ``vmap`` path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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

#: channels per group are padded to a multiple of this (the AVX-512 fp32 vector width)
CPU_CHANNEL_BLOCK = 16

_block_override: list[int] = []

#: float values in the largest activation of one grouped computation (8 MiB): more clients go through in groups
ACTIVATION_BUDGET = 1 << 21


@contextlib.contextmanager
def channel_block(block: int) -> Iterator[None]:
    """Pad the groups' channels to a multiple of ``block`` while inside (1: no padding).

    FLOP counters use ``channel_block(1)`` to count the model's own multiply-adds, not the padding's.
    """
    _block_override.append(int(block))
    try:
        yield
    finally:
        _block_override.pop()


def _block() -> int:
    return _block_override[-1] if _block_override else CPU_CHANNEL_BLOCK


def _spatial(module: nn.Module) -> bool:
    """A layer acting on each channel (or each element) of an image alone: it runs on the grouped layout as is."""
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        return True
    return _elementwise(module)


def _elementwise(module: nn.Module) -> bool:
    if isinstance(module, (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.Identity)):
        return True
    # dropout draws its masks differently from vmap (randomness="different"): only when it is the identity
    return isinstance(module, nn.Dropout) and (not module.training or module.p == 0)


def supports(model: nn.Module) -> bool:
    """Whether ``model`` is a ``nn.Sequential`` this module computes exactly: convolutions (groups 1,
    dilation 1, zero padding given as numbers), pooling and element-wise activations, then one
    ``Flatten`` of all but the batch dimension, then linear layers and element-wise activations —
    and at least one convolution (other networks gain nothing over ``vmap``)."""
    if type(model) is not nn.Sequential:
        return False
    flattened = False
    convolutions = 0
    for module in model:
        if isinstance(module, nn.Conv2d) and not flattened:
            if (module.groups != 1 or tuple(module.dilation) != (1, 1) or module.padding_mode != "zeros"
                    or isinstance(module.padding, str)):
                return False
            convolutions += 1
        elif isinstance(module, nn.Flatten) and not flattened:
            if module.start_dim != 1 or module.end_dim != -1:
                return False
            flattened = True
        elif isinstance(module, nn.Linear) and flattened:
            continue
        elif not (_elementwise(module) or (_spatial(module) and not flattened)):
            return False
    return flattened and convolutions > 0


def applies(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether the batched engine runs ``model`` on ``x`` this way: a supported model, on the CPU (on CUDA,
    cuDNN's grouped convolutions under ``vmap`` stay: the padding is tuned to the CPU's kernels)."""
    return x.device.type == "cpu" and x.dim() == 5 and supports(model)


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _activation_per_example(model: nn.Module, shape: tuple[int, ...], block: int) -> int:
    """The largest convolution output of one example (channels padded to the block), from the layers'
    shape arithmetic (no computation: FLOP counters see none)."""
    size, largest = list(shape[1:]), 0
    for module in model:
        if isinstance(module, nn.Flatten):
            break
        if isinstance(module, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            kernel, stride, padding = _pair(module.kernel_size), _pair(module.stride or module.kernel_size), _pair(module.padding)
            dilation = _pair(getattr(module, "dilation", 1))
            for d in range(2):
                span = size[d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1
                out = (-(-span // stride[d]) if getattr(module, "ceil_mode", False) else span // stride[d]) + 1
                if getattr(module, "ceil_mode", False) and (out - 1) * stride[d] >= size[d] + padding[d]:
                    out -= 1  # torch's rule: the last window starts inside the input or its left padding
                size[d] = out
            if isinstance(module, nn.Conv2d):
                largest = max(largest, -(-module.out_channels // block) * block * size[0] * size[1])
    return largest


def grouped_forward(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Outputs [C, B, K] of C copies of ``model`` (stacked parameters [C, *shape]) on their inputs x [C, B, ...]:
    what ``vmap(functional_call(model))`` computes, for a model :func:`supports` accepts.

    Clients go through in groups whose largest activation holds at most :data:`ACTIVATION_BUDGET`
    values: one computation over all of them is slower per client once its activations outgrow
    the caches (LeNet, batch 16: 100 clients at once 1.35×, 312 clients 2× the time of groups of
    ≤ 64). A client's result does not depend on the clients it is grouped with.
    """
    clients, batch = x.shape[:2]
    per_client = max(1, batch * _activation_per_example(model, tuple(x.shape[2:]), _block()))
    groups = -(-clients // max(2, ACTIVATION_BUDGET // per_client))
    bounds = [clients * k // groups for k in range(groups + 1)]  # groups of equal size (± 1 client)
    return torch.cat([_grouped_forward_of(model, {n: p[a:b] for n, p in params.items()}, x[a:b])
                      for a, b in zip(bounds, bounds[1:])])


def _grouped_forward_of(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """One grouped computation; a lone client goes with a detached copy of itself, whose output is dropped:
    oneDNN computes a convolution of one group with other kernels than a grouped one (other rounding),
    and a client's result must not depend on whether others share its computation."""
    if x.shape[0] > 1:
        return _grouped_forward(model, params, x)
    twin = {n: torch.cat([p, p.detach()]) for n, p in params.items()}
    return _grouped_forward(model, twin, torch.cat([x, x]))[:1]


def _grouped_forward(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    clients, batch = x.shape[:2]
    block = _block()
    real = x.shape[2]  # the real channels per group of h, and the padded ones
    padded = real
    h = x.transpose(0, 1).reshape(batch, clients * real, *x.shape[3:])  # [B, C·channels, H, W]
    for name, module in model.named_children():
        if isinstance(module, nn.Conv2d):
            weight = params[f"{name}.weight"]  # [C, out, in, kh, kw]
            out = weight.shape[1]
            out_padded = -(-out // block) * block
            weight = F.pad(weight, (0, 0, 0, 0, 0, padded - real, 0, out_padded - out))
            weight = weight.reshape(clients * out_padded, padded, *weight.shape[3:])
            h = F.conv2d(h, weight, None, module.stride, module.padding, groups=clients)
            bias = params.get(f"{name}.bias")
            if bias is not None:
                # added apart, not fused into the convolution: oneDNN's bias gradient (its reduction inside the
                # weight-gradient kernel) is split among threads differently for different numbers of groups, so a
                # client's result would depend on how many others share the computation; torch's sum does not
                h = h + F.pad(bias, (0, out_padded - out)).view(1, -1, 1, 1)
            real, padded = out, out_padded
        elif isinstance(module, nn.Flatten):  # back to [C, B, features] in the model's (channel, H, W) order
            h = h.reshape(batch, clients, padded, *h.shape[2:])[:, :, :real].transpose(0, 1).reshape(clients, batch, -1)
        elif isinstance(module, nn.Linear):
            weight = params[f"{name}.weight"].transpose(1, 2)  # [C, in, out]
            bias = params.get(f"{name}.bias")
            h = torch.bmm(h, weight) if bias is None else torch.baddbmm(bias.unsqueeze(1), h, weight)
        else:
            h = module(h)
    return h
