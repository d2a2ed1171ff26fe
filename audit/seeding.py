"""Deterministic randomness: every random choice derives from one root seed.

A random stream is addressed by a path of keys, e.g. ``(seed, "run", 3, "round", 7, "client", 12)``.
Keys are folded into a :class:`numpy.random.SeedSequence` spawn key, so streams for different
paths are statistically independent and the same path always gives the same stream, whatever
order the streams are created in. That is what makes the batched and the per-client engine
paths, and any executor, produce identical results.

:func:`philox_rng` addresses streams the same way but keys a counter-based Philox generator
(Salmon et al. 2011) with a 128-bit BLAKE2b hash of the path: about half the cost of creating a
SeedSequence-seeded generator, for the streams the engine creates by the thousand every round
(each client's mini-batch order).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch


def _key_to_int(key: int | str) -> int:
    if isinstance(key, (int, np.integer)):
        if key < 0:
            raise ValueError(f"seed path keys must be non-negative, got {key}")
        return int(key)
    return _string_key(str(key))


@functools.lru_cache(maxsize=4096)
def _string_key(key: str) -> int:
    """A string key's integer (cached: the engine derives thousands of streams per round from a few names)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "little")


def seed_sequence(root: int, *path: int | str) -> np.random.SeedSequence:
    """The SeedSequence of the stream at ``path`` under ``root``."""
    return np.random.SeedSequence(entropy=int(root), spawn_key=tuple(_key_to_int(k) for k in path))


def derive_seed(root: int, *path: int | str) -> int:
    """A 63-bit integer seed for the stream at ``path`` (fits torch.manual_seed)."""
    state = seed_sequence(root, *path).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def numpy_rng(root: int, *path: int | str) -> np.random.Generator:
    """A numpy Generator (PCG64) for the stream at ``path``."""
    return np.random.default_rng(seed_sequence(root, *path))


def torch_generator(root: int, *path: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator for the stream at ``path``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(root, *path))
    return generator


def philox_rng(root: int, *path: int | str) -> np.random.Generator:
    """A numpy Generator (Philox4x64, keyed by a 128-bit hash of ``(root, *path)``) for the stream at ``path``.

    Distinct keys give independent Philox streams; the key is a BLAKE2b digest of an injective
    encoding of the path (integers and strings tagged apart, so ``3`` and ``"3"`` differ).
    """
    parts = [f"i{_key_to_int(k)}" if isinstance(k, (int, np.integer)) else f"s{k}" for k in (root, *path)]
    digest = hashlib.blake2b("\x1f".join(parts).encode("utf-8"), digest_size=16).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest, "little")))
