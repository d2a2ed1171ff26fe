"""Label recovery: the labels of an observed batch, read from the last linear layer.

One example: iDLG's exact rule (Zhao, Mopuri, Bilen 2020, §3) on the last weight's gradient.
Larger batches: the label counts from the last bias gradient (the "analytic" count of Wainakh
et al. 2022 / Geiping's breaching), assuming the batch's mean softmax is the model's mean output
on random images. Gradient-inversion attacks (:mod:`attacks.reconstruction.dlg`,
:mod:`attacks.reconstruction.inverting_gradients`) use the recovered labels when none are given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attacks.threat_models import Params, ThreatModel
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")


def last_layer(params: Params) -> tuple[str, str | None]:
    """Names of the final linear layer's weight (the last 2-D parameter) and its bias (if any)."""
    names = list(params)
    weights = [i for i, name in enumerate(names) if params[name].ndim == 2]
    if not weights:
        raise UserInputError("the model has no final linear layer; label recovery needs one")
    index = weights[-1]
    bias = names[index + 1] if index + 1 < len(names) and params[names[index + 1]].ndim == 1 \
        and params[names[index + 1]].shape[0] == params[names[index]].shape[0] else None
    return names[index], bias


def idlg_label(weight_gradient: torch.Tensor) -> int:
    """iDLG (Zhao, Mopuri, Bilen 2020, §3): the label of a single example from ∂ℓ/∂W of the last layer.

    For cross-entropy, ∂ℓ/∂W_i = (p_i − y_i) h, with h the last layer's input. When h ≥ 0
    (sigmoid/ReLU features) the row of the true class c is the only one whose entries are
    ≤ 0 (p_c − 1 < 0), every other row is ≥ 0; the label is the argmin of the row sums
    (the authors' code: ``argmin(sum(dW, -1))``).
    """
    return int(torch.argmin(weight_gradient.sum(dim=-1)))


def count_labels(example_sum: torch.Tensor, count: int, expected_probabilities: torch.Tensor) -> torch.Tensor:
    """Label counts of a batch from G = Σ_examples ∂ℓ/∂b of the last layer's bias (batches > 1).

    G_i = Σ_n p_{n,i} − n_i, so n_i = N p̄_i − G_i, where p̄ is the batch's mean softmax. The
    heuristic (the "analytic" count of Wainakh et al. 2022 / Geiping's breaching) assumes p̄ is
    the model's mean output ``expected_probabilities`` (close for an untrained model, whose
    output hardly depends on the input). Every class with G_i < 0 must be present (p ≥ 0), so it
    gets at least one; the rest is rounded to sum to N by largest remainder.
    Returns the N labels sorted (the batch's order is not recoverable).
    """
    estimate = (count * expected_probabilities - example_sum).clamp_min(0.0).double()
    present = example_sum < 0
    if int(present.sum()) > count:  # noise can make more classes negative than there are examples
        present = torch.zeros_like(present)
        present[torch.argsort(example_sum)[:count]] = True
    counts = torch.floor(estimate).long()
    counts = torch.where(present & (counts < 1), torch.ones_like(counts), counts)
    while counts.sum() > count:  # too many: take from the largest surplus over the estimate
        surplus = (counts - estimate).masked_fill(counts <= present.long(), -float("inf"))
        counts[int(torch.argmax(surplus))] -= 1
    while counts.sum() < count:  # too few: give to the largest remainder
        counts[int(torch.argmax(estimate - counts))] += 1
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


def expected_probabilities(model: nn.Module, params: Params, image_shape: Sequence[int],
                           data_range: tuple[float, float], seed: int, samples: int = 64) -> torch.Tensor:
    """The model's mean softmax on random images in the data range: the p̄ of :func:`count_labels`."""
    low, high = data_range
    device = next(iter(params.values())).device
    generator = torch_generator(seed, "labels", "probe")
    probe = low + (high - low) * torch.rand(samples, *image_shape, generator=generator).to(device)
    with torch.no_grad():
        return F.softmax(torch.func.functional_call(model, params, (probe,)), dim=1).mean(0).cpu()


def recover_labels(model: nn.Module, params: Params, observed: Params, threat: ThreatModel,
                   image_shape: Sequence[int], data_range: tuple[float, float] = (0.0, 1.0),
                   seed: int = 0) -> torch.Tensor:
    """The labels of the observed batch (int64, length ``threat.examples``) from the last layer.

    One example: iDLG's exact rule on the last weight's gradient (sign-corrected for an update,
    which is −η × gradient; clipping and noise only rescale or perturb it). More: the counting
    heuristic of :func:`count_labels` on the bias; without a bias, the classes with a negative
    weight-row sum, one each, then the most negative ones again (a weaker fallback).
    """
    weight_name, bias_name = last_layer(params)
    factor = threat.example_sum_factor()
    if threat.examples == 1:
        return torch.tensor([idlg_label(observed[weight_name].detach().cpu() * (1.0 if factor > 0 else -1.0))])
    if bias_name is not None:
        example_sum = observed[bias_name].detach().cpu().double() * factor
        probabilities = expected_probabilities(model, params, image_shape, data_range, seed).double()
        return count_labels(example_sum, threat.examples, probabilities)
    row_sums = observed[weight_name].detach().cpu().double().sum(-1) * factor
    order = torch.argsort(row_sums)
    negatives = max(1, int((row_sums < 0).sum()))
    return torch.sort(order[torch.arange(threat.examples) % negatives]).values
