"""A task: the candidate pool, the held-out test split, the model factory, and membership runs.

* The pool is the dataset's training split (or, without an official test split, the part not
  held out); it is the set of candidate units of the membership experiment.
* Membership by **record**: run r includes each pool record independently with probability
  ``inclusion`` (``keep[r, i]``), as DESIGN.md prescribes, and partitions its included records
  into the configured clients.
* Membership by **client** (for client-level DP): the pool is partitioned once into
  C = round(N / inclusion) candidate clients; run r trains on a uniformly random N of them
  (``client_keep[r, c]``), so each candidate is in a run with probability N/C and a record is
  in exactly when its client is. The attacks then ask "was this client in the run?".

Keep matrices and partitions derive from the config seed, so every defense of an audit trains
on the same runs — comparisons between defenses are paired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from torch import nn

from audit.config import AuditConfig, MembershipConfig, PartitionConfig
from audit.core.dataset_types import Dataset, Split
from audit.core.datasets import load_dataset
from audit.core.errors import UserInputError
from audit.core.models import build_model
from audit.core.seeding import numpy_rng
from audit.partitions import partition


@dataclass
class Task:
    dataset: Dataset
    pool: Split
    test: Split
    model_factory: Callable[[], nn.Module]

    @property
    def kind(self) -> str:
        return self.dataset.kind


def stratified_choice(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A sorted sample of about ``fraction`` of the indices, the same fraction of every class."""
    chosen = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        chosen.append(members[: int(round(fraction * len(members)))])
    return np.sort(np.concatenate(chosen)) if chosen else np.array([], dtype=np.int64)


def build_task(config: AuditConfig) -> Task:
    """Load the dataset, cut pool and test split, and check the model builds."""
    spec = config.dataset
    dataset = load_dataset(spec.name, spec.root, spec.options)
    labels = dataset.train.labels.numpy()
    if dataset.test is not None:
        pool, test = dataset.train, dataset.test
    else:
        held_out = stratified_choice(labels, spec.test_fraction, numpy_rng(config.seed, "task", "test-split"))
        rest = np.setdiff1d(np.arange(len(labels)), held_out)
        pool, test = dataset.train.subset(rest), dataset.train.subset(held_out)
    if spec.max_pool is not None and spec.max_pool < len(pool):
        pool_labels = pool.labels.numpy()
        pool = pool.subset(stratified_choice(pool_labels, spec.max_pool / len(pool), numpy_rng(config.seed, "task", "pool-cap")))
    if spec.max_test is not None and spec.max_test < len(test):
        test = test.subset(stratified_choice(test.labels.numpy(), spec.max_test / len(test), numpy_rng(config.seed, "task", "test-cap")))
    if len(test) == 0:
        raise UserInputError("dataset.test_fraction: the test split is empty; raise test_fraction")
    factory = partial(build_model, config.model.name, dataset.input_shape, dataset.num_classes, config.model.options)
    factory()  # fail now, before anything is written, if the model does not fit the data
    return Task(dataset, pool, test, factory)


def keep_matrix(pool_size: int, membership: MembershipConfig, seed: int) -> np.ndarray:
    """keep[r, i]: run r trains on pool record i; independent Bernoulli(inclusion) entries."""
    rng = numpy_rng(seed, "membership", "keep")
    return rng.random((membership.runs, pool_size)) < membership.inclusion


@dataclass
class Membership:
    """Who trains in which membership run."""

    unit: str  # "record" or "client"
    keep: np.ndarray  # bool [runs, pool records]
    clients: list[list[np.ndarray]]  # per run, the pool indices of each of its clients
    owners: np.ndarray | None = None  # candidate client of each pool record (client unit)
    client_keep: np.ndarray | None = None  # bool [runs, candidate clients] (client unit)

    def truth(self, unit: str) -> np.ndarray:
        """Membership of every unit in every run: bool [runs, records or candidate clients]."""
        return self.keep if unit == "record" else self.client_keep


def client_membership(pool_labels: np.ndarray, membership: MembershipConfig, spec: PartitionConfig, seed: int) -> Membership:
    """Candidate clients fixed once; each run trains on a random ``spec.clients`` of them."""
    candidates = max(spec.clients + 1, int(round(spec.clients / membership.inclusion)))
    parts = partition(pool_labels, spec.name, candidates, seed, alpha=spec.alpha, classes_per_client=spec.classes_per_client,
                      min_client_size=spec.min_client_size, stream=("candidates",))
    owners = np.empty(len(pool_labels), dtype=np.int64)
    for c, part in enumerate(parts):
        owners[part] = c
    client_keep = np.zeros((membership.runs, candidates), dtype=bool)
    clients = []
    for r in range(membership.runs):
        chosen = np.sort(numpy_rng(seed, "membership", "clients", r).choice(candidates, size=spec.clients, replace=False))
        client_keep[r, chosen] = True
        clients.append([parts[c] for c in chosen])
    return Membership("client", client_keep[:, owners], clients, owners, client_keep)


def record_membership(pool_labels: np.ndarray, membership: MembershipConfig, spec: PartitionConfig, seed: int) -> Membership:
    keep = keep_matrix(len(pool_labels), membership, seed)
    return Membership("record", keep, [run_clients(pool_labels, keep[r], spec, seed, r) for r in range(membership.runs)])


def run_clients(pool_labels: np.ndarray, keep_row: np.ndarray, spec: PartitionConfig, seed: int, run_index: int) -> list[np.ndarray]:
    """Partition the records run ``run_index`` includes into clients; returns pool indices per client."""
    members = np.flatnonzero(keep_row)
    parts = partition(pool_labels[members], spec.name, spec.clients, seed, alpha=spec.alpha,
                      classes_per_client=spec.classes_per_client, min_client_size=spec.min_client_size,
                      stream=("run", run_index))
    return [members[p] for p in parts]
