"""A task: the candidate pool, the held-out test split, the model factory, and membership runs.

* The pool is the dataset's training split (or, without an official test split, the part not
  held out); it is the set of candidate units of the membership experiment.
* The design matches the claim's neighbouring relation (``membership.relation``):
  a run is a function of its inclusion coins alone (:meth:`Membership.run_clients`), so toggling
  one coin gives exactly the neighbouring dataset the relation names — a test checks this.
* Membership by **record** (add/remove): the pool is partitioned once into the configured
  clients (each record has one owner client for good); run r includes each record independently
  with probability ``inclusion`` (``keep[r, i]``) and client c trains on the included records it
  owns. Adding or removing a record therefore changes its owner client's data and nothing else,
  which is what the group-privacy conversion of a client-level claim assumes.
* Membership by **client**, add/remove: the pool is partitioned once into C = round(N / inclusion)
  candidate clients; run r includes each candidate independently with probability ``inclusion``
  (``client_keep[r, c]``), so its number of clients varies around N and a neighbouring run has one
  client more or fewer — nothing replaces it.
* Membership by **client**, zero-out: the N clients of the configuration take part in every run;
  a client whose coin is off has no data (it trains on nothing and contributes nothing), so
  neighbouring runs keep every participant and zero one's contribution — the relation of a mean
  divided by the realized number of participants (Kairouz et al. 2021, §2).
* Membership by **client**, replace-one: 2N candidates in N fixed pairs; run r trains on exactly
  one client of every pair, chosen by a fair coin, so neighbouring runs have the same N clients
  with one replaced (the relation of fixed-size sampling and of NbAFL's analysis).

Every coin is independent of every other, which the one-run ε bounds need (Steinke, Nasr,
Jagielski 2023, Thm 3.1). Keep matrices and partitions derive from the config seed, so every defense of an audit trains
on the same runs — comparisons between defenses are paired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from audit.config import AuditConfig, DatasetConfig, MembershipConfig, PartitionConfig
from audit.core.dataset_types import Dataset, Split
from audit.core.datasets import load_dataset
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.models import build_model
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Relation, Unit
from audit.partitions import partition

if TYPE_CHECKING:
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    nn = lazy_module("torch.nn")


@dataclass(frozen=True)
class Task:
    """What every run of an audit trains on: the dataset, its candidate pool and test split, the model."""

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


def split_dataset(spec: DatasetConfig, seed: int) -> tuple[Dataset, Split, Split]:
    """Load the dataset and cut it into (dataset, candidate pool, test split): the official test
    split where there is one, else a stratified held-out share; pool and test capped as configured."""
    dataset = load_dataset(spec.name, spec.root, spec.options)
    labels = dataset.train.labels.numpy()
    if dataset.test is not None:
        pool, test = dataset.train, dataset.test
    else:
        held_out = stratified_choice(labels, spec.test_fraction, numpy_rng(seed, "task", "test-split"))
        rest = np.setdiff1d(np.arange(len(labels)), held_out)
        pool, test = dataset.train.subset(rest), dataset.train.subset(held_out)
    if spec.max_pool is not None and spec.max_pool < len(pool):
        pool_labels = pool.labels.numpy()
        pool = pool.subset(stratified_choice(pool_labels, spec.max_pool / len(pool), numpy_rng(seed, "task", "pool-cap")))
    if spec.max_test is not None and spec.max_test < len(test):
        test = test.subset(stratified_choice(test.labels.numpy(), spec.max_test / len(test), numpy_rng(seed, "task", "test-cap")))
    if len(test) == 0:
        raise UserInputError("dataset.test_fraction: the test split is empty; raise test_fraction")
    return dataset, pool, test


def build_task(config: AuditConfig) -> Task:
    """Load the dataset, cut pool and test split, and check the model builds."""
    dataset, pool, test = split_dataset(config.dataset, config.seed)
    factory = partial(build_model, config.model.name, dataset.input_shape, dataset.num_classes, config.model.options)
    factory()  # fail now, before anything is written, if the model does not fit the data
    return Task(dataset, pool, test, factory)


def keep_matrix(pool_size: int, membership: MembershipConfig, seed: int) -> np.ndarray:
    """keep[r, i]: run r trains on pool record i; independent Bernoulli(inclusion) entries."""
    rng = numpy_rng(seed, "membership", "keep")
    return rng.random((membership.runs, pool_size)) < membership.inclusion


RELATIONS = (Relation.ADD_REMOVE, Relation.REPLACE_ONE, Relation.ZERO_OUT)


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy: a design shared by every run and stage cannot be changed by one of them."""
    out = np.array(array)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class Membership:
    """Who trains in which membership run: a value, read-only all the way down (its arrays too).

    ``parts`` are the fixed clients (record unit) or candidate clients (client unit), as pool
    indices; a run's clients follow from its coins by :meth:`run_clients`.
    """

    unit: str  # "record" or "client"
    relation: str  # "add-remove", "replace-one" or "zero-out": what one coin changes
    keep: np.ndarray  # bool [runs, pool records]
    parts: tuple[np.ndarray, ...]
    owners: np.ndarray  # the part of each pool record
    client_keep: np.ndarray | None = None  # bool [runs, candidate clients] (client unit)
    #: per run, the pool indices of each of its clients
    clients: tuple[tuple[np.ndarray, ...], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", _frozen(self.keep))
        object.__setattr__(self, "owners", _frozen(self.owners))
        object.__setattr__(self, "parts", tuple(_frozen(p) for p in self.parts))
        if self.client_keep is not None:
            object.__setattr__(self, "client_keep", _frozen(self.client_keep))
        clients = self.clients or [self.run_clients(r) for r in range(self.keep.shape[0])]
        object.__setattr__(self, "clients", tuple(tuple(_frozen(c) for c in run) for run in clients))

    def coins(self, run: int) -> np.ndarray:
        """Run ``run``'s inclusion coins: one per record (record unit) or candidate client."""
        return self.keep[run] if self.unit == Unit.RECORD else self.client_keep[run]

    def run_clients(self, run: int, coins: np.ndarray | None = None) -> list[np.ndarray]:
        """The clients (pool indices) of the run whose coins are ``coins`` (default: run ``run``'s)."""
        coins = self.coins(run) if coins is None else np.asarray(coins, dtype=bool)
        if self.unit == Unit.RECORD:  # every fixed client keeps its included records
            return [part[coins[part]] for part in self.parts]
        if self.relation == Relation.ZERO_OUT:  # every candidate takes part; one whose coin is off has no data
            return [part if coin else part[:0] for part, coin in zip(self.parts, coins)]
        return [self.parts[c] for c in np.flatnonzero(coins)]

    def truth(self, unit: str) -> np.ndarray:
        """Membership of every unit in every run: bool [runs, records or candidate clients]."""
        return self.keep if unit == Unit.RECORD else self.client_keep


def _resolved(membership: MembershipConfig, unit: str) -> MembershipConfig:
    """``membership`` with its relation checked; "auto" left unresolved by the caller (the planner
    resolves it from the claims) is add/remove."""
    if membership.relation == "auto":
        membership = replace(membership, relation=Relation.ADD_REMOVE.value)
    if membership.relation != Relation.ADD_REMOVE and unit == Unit.RECORD:
        raise UserInputError(f"membership.relation: '{membership.relation}' is available for membership.unit: client; "
                             "records are audited with add-remove")
    if membership.relation == Relation.REPLACE_ONE and membership.inclusion != 0.5:
        raise UserInputError("membership.inclusion: replace-one pairs need 0.5 (one client of each pair), got "
                             f"{membership.inclusion}")
    return membership


def client_membership(pool_labels: np.ndarray, membership: MembershipConfig, spec: PartitionConfig, seed: int) -> Membership:
    """Candidate clients fixed once; each run includes each candidate by an independent coin
    (add/remove) or one client of each fixed pair (replace-one)."""
    membership = _resolved(membership, Unit.CLIENT)
    paired = membership.relation == Relation.REPLACE_ONE
    if membership.relation == Relation.ZERO_OUT:  # the N clients of every run; a coin says whether one has its data
        candidates = spec.clients
    else:
        candidates = 2 * spec.clients if paired else max(spec.clients + 1, int(round(spec.clients / membership.inclusion)))
    parts = partition(pool_labels, spec.name, candidates, seed, alpha=spec.alpha, classes_per_client=spec.classes_per_client,
                      min_client_size=spec.min_client_size, stream=("candidates",))
    owners = np.empty(len(pool_labels), dtype=np.int64)
    for c, part in enumerate(parts):
        owners[part] = c
    rng = numpy_rng(seed, "membership", "clients", membership.relation)
    if paired:  # pair i = candidates (2i, 2i + 1); a fair coin picks which one trains
        first = rng.random((membership.runs, spec.clients)) < 0.5
        client_keep = np.stack([first, ~first], axis=2).reshape(membership.runs, candidates)
    else:
        client_keep = rng.random((membership.runs, candidates)) < membership.inclusion
    empty = np.flatnonzero(~client_keep.any(1))
    if len(empty) and membership.relation != Relation.ZERO_OUT:
        raise UserInputError(f"partition.clients: membership run {int(empty[0])} drew none of the {candidates} candidate "
                             "clients; raise partition.clients or membership.inclusion")
    return Membership(Unit.CLIENT, membership.relation, client_keep[:, owners], parts, owners, client_keep)


def record_membership(pool_labels: np.ndarray, membership: MembershipConfig, spec: PartitionConfig, seed: int) -> Membership:
    """Fixed clients; each run includes each record by an independent coin (add/remove)."""
    membership = _resolved(membership, Unit.RECORD)
    keep = keep_matrix(len(pool_labels), membership, seed)
    parts = partition(pool_labels, spec.name, spec.clients, seed, alpha=spec.alpha, classes_per_client=spec.classes_per_client,
                      min_client_size=spec.min_client_size, stream=("owners",))
    owners = np.empty(len(pool_labels), dtype=np.int64)
    for c, part in enumerate(parts):
        owners[part] = c
    return Membership(Unit.RECORD, Relation.ADD_REMOVE, keep, parts, owners)


def run_clients(pool_labels: np.ndarray, keep_row: np.ndarray, spec: PartitionConfig, seed: int,
                run_index: int) -> list[np.ndarray]:
    """Partition the records ``keep_row`` includes into clients afresh (the reproduction runs'
    data, where no membership is audited); returns pool indices per client."""
    members = np.flatnonzero(keep_row)
    parts = partition(pool_labels[members], spec.name, spec.clients, seed, alpha=spec.alpha,
                      classes_per_client=spec.classes_per_client, min_client_size=spec.min_client_size,
                      stream=("run", run_index))
    return [members[p] for p in parts]
