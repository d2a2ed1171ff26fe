"""The benchmark workloads, defined once so every side (batched engine, per-client loop, Flower)
does exactly the same work.

Both are DP-FedAvg as McMahan et al. 2018, Alg. 1: all 100 clients train in every round from the
global model (plain SGD on the mean cross-entropy, lr 0.1, one local epoch over a fresh
permutation of their records); a trusted server clips each update to L2 norm S = 1 (flat
clipping) and adds N(0, σ²S²), σ = 1, to the sum of clipped updates before averaging — what
Flower's server-side DP wrapper does. 10 timed rounds.

Workload 1 ("mlp"): scikit-learn's digits (8×8), 100 clients of 15 records, the MLP
64→128→10, batches of 5 (3 local steps per client). Overhead- and memory-bound by construction.

Workload 2 ("cnn"): the MNIST test split (28×28, the t10k IDX files in ``MNIST_ROOT``), shuffled
with the seed; 100 clients of 80 records (the first 8,000), the other 2,000 are the test set;
the ``lenet`` model of :mod:`audit.core.models` (three 5×5 convolutions with 12 channels, strides
2, 2, 1, sigmoid, one linear layer: 13,426 parameters), batches of 16 (5 local steps per client).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from audit.core.datasets import load_dataset
from audit.core.models import build_model
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import TrainingConfig, TrainingJob

CLIENTS = 100
LOCAL_EPOCHS = 1
LEARNING_RATE = 0.1
CLIP = 1.0
NOISE_MULTIPLIER = 1.0
ROUNDS = 10
SEED = 0
# workload 1
RECORDS_PER_CLIENT = 15
BATCH_SIZE = 5
# workload 2
CNN_RECORDS_PER_CLIENT = 80
CNN_BATCH_SIZE = 16
#: the MNIST test split: $DPFL_AUDIT_DATA/mnist when set (as the project's loaders read it), else the shared data
#: folder beside the repository
MNIST_ROOT = (Path(os.environ["DPFL_AUDIT_DATA"]) / "mnist" if os.environ.get("DPFL_AUDIT_DATA")
              else Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist")

WORKLOADS = ("mlp", "cnn")


@dataclass
class Workload:
    """A workload's data (records, each client's indices, the held-out test indices) and settings."""

    name: str  # "mlp" (workload 1) or "cnn" (workload 2)
    features: torch.Tensor  # [N, 1, H, W] float32 in [0, 1]
    labels: torch.Tensor  # [N] int64
    clients: list[np.ndarray]
    test: np.ndarray
    model_name: str
    batch_size: int
    description: str
    local_epochs: int = LOCAL_EPOCHS
    lr: float = LEARNING_RATE
    device: str = "cpu"

    def model(self) -> nn.Module:
        """Workload 1: MLP 64→128→10 (flatten, Linear, ReLU, Linear); workload 2: the sigmoid LeNet."""
        return build_model(self.model_name, tuple(self.features.shape[1:]), 10)

    @property
    def records_per_client(self) -> int:
        return len(self.clients[0])

    @property
    def steps_per_client(self) -> int:
        return self.local_epochs * -(-self.records_per_client // self.batch_size)

    def training(self, rounds: int = ROUNDS, engine: str = "batched") -> TrainingConfig:
        return TrainingConfig(rounds=rounds, client_rate=1.0, local_unit="epochs", local_steps=self.local_epochs,
                              batch_size=self.batch_size, lr=self.lr, engine=engine, eval_every=rounds)

    def job(self, rounds: int = ROUNDS, engine: str = "batched", seed: int = SEED) -> TrainingJob:
        test = torch.as_tensor(self.test)
        x, y = self.features.to(self.device), self.labels.to(self.device)
        return TrainingJob(self.model, x, y, self.clients, x[test.to(self.device)], y[test.to(self.device)],
                           self.training(rounds, engine), seed=seed, device=self.device)

    def on(self, device: str) -> Workload:
        """The same workload with its tensors on ``device`` (the engine trains where the data is)."""
        from dataclasses import replace

        return replace(self, device=device)


def dp_fedavg() -> DPFedAvg:
    """DP-FedAvg with flat clipping at 1 and σ = 1 on the aggregate (central DP, as Flower's wrapper)."""
    return DPFedAvg(DPFedAvgParams(clip=CLIP, noise_multiplier=NOISE_MULTIPLIER, noise_placement="aggregate"))


def _split(count: int, per_client: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    order = np.random.default_rng(seed).permutation(count)
    clients = [order[i * per_client:(i + 1) * per_client] for i in range(CLIENTS)]
    return clients, order[CLIENTS * per_client:]


def workload_one(seed: int = SEED) -> Workload:
    """Digits shuffled with ``seed``: the first 1,500 records go to 100 clients of 15, the rest is the test set."""
    digits = load_dataset("digits")
    clients, test = _split(len(digits.train), RECORDS_PER_CLIENT, seed)
    return Workload("mlp", digits.train.features, digits.train.labels, clients, test, "mlp", BATCH_SIZE,
                    f"digits 8x8, {CLIENTS} clients x {RECORDS_PER_CLIENT} records, mlp 64-128-10, batch {BATCH_SIZE}")


def workload_two(seed: int = SEED, root: Path | str = MNIST_ROOT) -> Workload:
    """The MNIST test split shuffled with ``seed``: the first 8,000 records go to 100 clients of 80,
    the other 2,000 are the test set."""
    root = Path(root)
    if not any((root / f"t10k-labels-idx1-ubyte{ext}").exists() for ext in ("", ".gz")):
        raise FileNotFoundError(f"workload 2 needs the MNIST t10k IDX files in {root} (or set $DPFL_AUDIT_DATA)")
    mnist = load_dataset("mnist", root=str(root), options={"download": False})
    features, labels = mnist.train.features, mnist.train.labels
    clients, test = _split(len(labels), CNN_RECORDS_PER_CLIENT, seed)
    return Workload("cnn", features, labels, clients, test, "lenet", CNN_BATCH_SIZE,
                    f"mnist 28x28 (t10k), {CLIENTS} clients x {CNN_RECORDS_PER_CLIENT} records, lenet "
                    f"(3 conv 5x5, 12 ch, sigmoid), batch {CNN_BATCH_SIZE}")


def load_workload(name: str, seed: int = SEED, device: str = "cpu") -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
    workload = workload_one(seed) if name == "mlp" else workload_two(seed)
    return workload.on(device) if device != "cpu" else workload
