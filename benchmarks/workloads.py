"""The benchmark workloads, defined once so every side (batched engine, per-client loop, Flower)
does exactly the same work.

Workload 1 (issue 9): DP-FedAvg on scikit-learn's digits split over 100 clients of 15 records
each, the MLP 64→128→10, one local epoch of batch 5 (3 SGD steps per client, lr 0.1), flat
clipping at 1, noise multiplier σ = 1 on the aggregate (McMahan et al. 2018, Alg. 1: a trusted
server adds N(0, σ²S²) to the sum of clipped updates — what Flower's server-side DP wrapper
does), all 100 clients in every round, 10 timed rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from audit.core.datasets import load_dataset
from audit.core.models import build_model
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.training_job import TrainingConfig, TrainingJob

CLIENTS = 100
RECORDS_PER_CLIENT = 15
BATCH_SIZE = 5
LOCAL_EPOCHS = 1
LEARNING_RATE = 0.1
CLIP = 1.0
NOISE_MULTIPLIER = 1.0
ROUNDS = 10
SEED = 0


@dataclass
class Workload:
    """Workload 1's data: the digits records, each client's indices, the held-out test indices."""

    features: torch.Tensor  # [1797, 1, 8, 8] float32 in [0, 1]
    labels: torch.Tensor  # [1797] int64
    clients: list[np.ndarray]
    test: np.ndarray

    def model(self) -> nn.Module:
        """MLP 64→128→10 (flatten, Linear, ReLU, Linear)."""
        return build_model("mlp", tuple(self.features.shape[1:]), 10)

    def training(self, rounds: int = ROUNDS, engine: str = "batched") -> TrainingConfig:
        return TrainingConfig(rounds=rounds, client_rate=1.0, local_unit="epochs", local_steps=LOCAL_EPOCHS,
                              batch_size=BATCH_SIZE, lr=LEARNING_RATE, engine=engine, eval_every=rounds)

    def job(self, rounds: int = ROUNDS, engine: str = "batched", seed: int = SEED) -> TrainingJob:
        test = torch.as_tensor(self.test)
        return TrainingJob(self.model, self.features, self.labels, self.clients, self.features[test],
                           self.labels[test], self.training(rounds, engine), seed=seed)


def dp_fedavg() -> DPFedAvg:
    """DP-FedAvg with flat clipping at 1 and σ = 1 on the aggregate (central DP, as Flower's wrapper)."""
    return DPFedAvg(DPFedAvgParams(clip=CLIP, noise_multiplier=NOISE_MULTIPLIER, noise_placement="aggregate"))


def workload_one(seed: int = SEED) -> Workload:
    """Digits shuffled with ``seed``: the first 1,500 records go to 100 clients of 15, the rest is the test set."""
    digits = load_dataset("digits")
    order = np.random.default_rng(seed).permutation(len(digits.train))
    used = CLIENTS * RECORDS_PER_CLIENT
    clients = [order[i * RECORDS_PER_CLIENT:(i + 1) * RECORDS_PER_CLIENT] for i in range(CLIENTS)]
    return Workload(digits.train.features, digits.train.labels, clients, order[used:])
