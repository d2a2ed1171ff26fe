"""Auditing your own components: a dataset, a model and a defense named as ``file.py:callable``.

Run it with ``dpfl-audit run examples/custom.yaml``. Each callable follows the contract of the
built-in registries:

* a dataset loader ``f(root=None, **options) -> audit.core.datasets.Dataset``;
* a model factory ``f(input_shape, num_classes, **options) -> torch.nn.Module`` (no buffers);
* a defense: a subclass of ``defenses.base.Defense`` with a ``Params`` dataclass. Round-based
  defenses override the engine's hooks (``local_objective``, ``privatize``, ``aggregate``) and
  ``privacy_claim``; everything else (sampling, batching, metrics, the run store, the attacks,
  the report) comes from the harness. ``DPFedProx`` builds on DP-FedAvg instead, and inherits its
  privatisation, its claim and what the audits need of it (its audit hooks).

The page that explains the interface quotes this file: docs/how-to/add-a-defense.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audit.core.datasets import Dataset, Split
from defenses.base import NO_STATE, Defense, PrivacyClaim
from defenses.blocks.local_training import LocalObjective
from defenses.fedavg import DPFedAvg, DPFedAvgParams


def breast_cancer(root=None) -> Dataset:
    """scikit-learn's Wisconsin breast-cancer records (569 patients, 30 features, binary)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    features = (data.data - data.data.mean(0)) / data.data.std(0)
    return Dataset("breast-cancer", Split(torch.as_tensor(features, dtype=torch.float32),
                                          torch.as_tensor(data.target, dtype=torch.int64)),
                   num_classes=2, kind="tabular", source="sklearn.datasets.load_breast_cancer")


def logistic(input_shape, num_classes) -> nn.Module:
    """Multinomial logistic regression."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


class ProximalObjective(LocalObjective):
    """FedProx's local loss f_i(w) + (μ/2)‖w − w_global‖² (Li et al. 2020, Eq. 2)."""

    def __init__(self, mu: float):
        self.mu = mu

    def batched_gradient(self, model, params, anchor, x, y, mask):
        gradients = super().batched_gradient(model, params, anchor, x, y, mask)
        return {n: g + self.mu * (params[n] - anchor[n]) for n, g in gradients.items()}

    def module_backward(self, model, anchor, x, y):
        penalty = sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
        (F.cross_entropy(model(x), y) + 0.5 * self.mu * penalty).backward()


@dataclass(frozen=True)
class FedProxParams:
    mu: float = field(default=0.01, metadata={"min": 0.0, "help": "proximal weight μ"})


class FedProx(Defense):
    """FedProx (non-private): FedAvg whose clients stay close to the global model."""

    name = "fedprox"
    summary = "FedAvg with a proximal term in the local loss (not private)"
    reference = "Li et al. 2020, Federated Optimization in Heterogeneous Networks"
    Params = FedProxParams

    def local_objective(self) -> LocalObjective:
        return ProximalObjective(self.params.mu)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        return PrivacyClaim.non_private("FedProx adds no noise")


@dataclass(frozen=True)
class DPFedProxParams(DPFedAvgParams):
    mu: float = field(default=0.01, metadata={"min": 0.0, "help": "proximal weight μ"})


class DPFedProx(DPFedAvg):
    """DP-FedAvg whose clients train FedProx's local loss: the clip, the noise, the claim and the audit
    hooks are DP-FedAvg's, since the loss changes what a client computes, not how much one upload may move."""

    name = "dp-fedprox"
    summary = "DP-FedAvg with a proximal term in the local loss"
    reference = "Li et al. 2020 (local loss); McMahan et al. 2018 (clip and noise)"
    Params = DPFedProxParams

    def local_objective(self) -> LocalObjective:
        return ProximalObjective(self.params.mu)
