"""Partition a labelled pool into federated clients.

* ``iid``: a random permutation cut into N nearly equal parts.
* ``dirichlet``: per class c, proportions p_c ~ Dir(α·1_N) and class c's records split by them
  (Hsu, Qi, Brown 2019, "Measuring the effects of non-identical data distribution"). Small α
  gives skewed clients. Draws that leave a client below ``min_client_size`` are redrawn (up to
  ``max_attempts`` times, each attempt a fresh deterministic stream), then rejected with an error.
* ``shards``: records sorted by label, cut into N·k shards, k random shards per client (McMahan
  et al. 2017's pathological non-IID split), so each client sees about k classes.

Every partition is a deterministic function of the labels, the parameters and the seed.
"""

from __future__ import annotations

import numpy as np

from audit.core.errors import UserInputError
from audit.core.seeding import numpy_rng

PARTITIONS = ("iid", "dirichlet", "shards")


def _check_sizes(clients: list[np.ndarray], min_client_size: int) -> int | None:
    """Index of the first client smaller than the minimum, or None."""
    for index, members in enumerate(clients):
        if len(members) < min_client_size:
            return index
    return None


def iid(num_records: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(num_records)
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    assigned: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for client, part in enumerate(np.split(members, cuts)):
            assigned[client].append(part)
    return [np.sort(np.concatenate(parts)) for parts in assigned]


def shards(labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Stable sort by label with a random tie order, so records of one class are shuffled within it.
    order = np.lexsort((rng.permutation(len(labels)), labels))
    pieces = np.array_split(order, num_clients * per_client)
    owner = rng.permutation(num_clients * per_client)
    return [np.sort(np.concatenate([pieces[s] for s in owner[c * per_client:(c + 1) * per_client]]))
            for c in range(num_clients)]


def partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    min_client_size: int = 1,
    max_attempts: int = 100,
    stream: tuple = (),
) -> list[np.ndarray]:
    """Split record indices 0..len(labels)-1 into ``num_clients`` clients (sorted index arrays).

    ``stream`` extends the seed path, so different membership runs get different partitions.
    """
    labels = np.asarray(labels)
    if scheme not in PARTITIONS:
        raise UserInputError(f"partition.name: '{scheme}' is not allowed; allowed: {', '.join(PARTITIONS)}")
    if num_clients < 1:
        raise UserInputError(f"partition.clients: must be >= 1, got {num_clients}")
    if num_clients * min_client_size > len(labels):
        raise UserInputError(
            f"partition.clients: {num_clients} clients of at least {min_client_size} records need "
            f"{num_clients * min_client_size} records, the pool has {len(labels)}; use fewer clients"
        )
    attempts = max_attempts if scheme == "dirichlet" else 1
    for attempt in range(attempts):
        rng = numpy_rng(seed, "partition", scheme, *stream, attempt)
        if scheme == "iid":
            clients = iid(len(labels), num_clients, rng)
        elif scheme == "dirichlet":
            if alpha <= 0:
                raise UserInputError(f"partition.alpha: must be > 0, got {alpha}")
            clients = dirichlet(labels, num_clients, alpha, rng)
        else:
            if classes_per_client < 1:
                raise UserInputError(f"partition.classes_per_client: must be >= 1, got {classes_per_client}")
            clients = shards(labels, num_clients, classes_per_client, rng)
        small = _check_sizes(clients, min_client_size)
        if small is None:
            return clients
    raise UserInputError(
        f"partition: client {small} got {len(clients[small])} records, fewer than "
        f"partition.min_client_size={min_client_size} (after {attempts} draw(s) of '{scheme}'); "
        f"use fewer clients, a larger alpha or a smaller min_client_size"
    )
