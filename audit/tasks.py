"""A task: the candidate pool, the held-out test split, the model factory, and membership runs.

* The pool is the dataset's training split (or, without an official test split, the part not
  held out); it is the set of candidate units of the membership experiment.
* Membership: run r includes each pool record independently with probability ``inclusion``
  (``keep[r, i]``), as DESIGN.md prescribes, and partitions its included records into the
  configured clients. Keep matrix and partitions derive from the config seed, so every defense
  of an audit trains on the same runs — comparisons between defenses are paired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from torch import nn

from audit.config import AuditConfig, MembershipConfig, PartitionConfig
from audit.datasets import Dataset, Split, load_dataset
from audit.errors import UserInputError
from audit.models import build_model
from audit.partitions import partition
from audit.seeding import numpy_rng


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


def run_clients(pool_labels: np.ndarray, keep_row: np.ndarray, spec: PartitionConfig, seed: int, run_index: int) -> list[np.ndarray]:
    """Partition the records run ``run_index`` includes into clients; returns pool indices per client."""
    members = np.flatnonzero(keep_row)
    parts = partition(pool_labels[members], spec.name, spec.clients, seed, alpha=spec.alpha,
                      classes_per_client=spec.classes_per_client, min_client_size=spec.min_client_size,
                      stream=("run", run_index))
    return [members[p] for p in parts]
