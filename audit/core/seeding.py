"""Deterministic randomness: every random choice derives from one root seed, keyed in full.

A random stream is addressed by a path of keys, e.g. ``(seed, "run", 3, "round", 7, "client", 12)``.
Integer keys enter as they are (any size); a string key enters as a 128-bit BLAKE2b digest. No
stream is keyed by fewer bits than that: two different paths share a stream only if 128-bit
digests collide (about 2⁻⁶⁴ for a billion streams), so the noise of distinct (run, round, client,
purpose) keys is independent, as the accountants assume.

* :func:`numpy_rng` — a PCG64 generator seeded by a :class:`numpy.random.SeedSequence` whose
  entropy is the root and whose spawn key is the path (a 128-bit pool);
* :func:`philox_rng` — a counter-based Philox generator (Salmon et al. 2011) keyed by a 128-bit
  hash of the path: cheaper to create, for the streams the engine creates by the thousand;
* :func:`torch_generator` and :func:`seed_torch` — torch's CPU generator is a Mersenne Twister
  whose ``manual_seed`` keeps only the low 32 bits of the seed (``mt19937(seed)`` initialises
  from a uint32), so ``manual_seed(k)`` and ``manual_seed(k + 2³²)`` give the same stream and
  about 2³² seeds exist in all. Instead the whole 624-word state is filled from the path's
  128-bit key (:func:`_mt_state`), so a torch stream is keyed by the full path too.

The same path always gives the same stream, whatever order streams are created in: that is
what makes the batched and per-client engine paths, and every executor, agree bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: words of the Mersenne Twister state (MT19937: 624 × 32 bits)
_MT_WORDS = 624


def _key_to_int(key: int | str) -> int:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise ValueError(f"seed path keys must be non-negative, got {key}")
        return int(key)
    return _string_key(str(key))


@functools.lru_cache(maxsize=4096)
def _string_key(key: str) -> int:
    """A string key's 128-bit integer (cached: the engine derives thousands of streams per round from
    a few names). The top bit is set so that no string maps onto a small integer key."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16, person=b"dpfl-audit-key").digest()
    return int.from_bytes(digest, "little") | (1 << 128)


def seed_sequence(root: int, *path: int | str) -> np.random.SeedSequence:
    """The SeedSequence of the stream at ``path`` under ``root`` (arbitrary-size integers)."""
    return np.random.SeedSequence(entropy=_key_to_int(root), spawn_key=tuple(_key_to_int(k) for k in path))


def derive_seed(root: int, *path: int | str) -> int:
    """A 128-bit integer seed for the stream at ``path`` (a root for further paths)."""
    state = seed_sequence(root, *path).generate_state(4, np.uint32)
    return int.from_bytes(state.astype("<u4").tobytes(), "little")


def numpy_rng(root: int, *path: int | str) -> np.random.Generator:
    """A numpy Generator (PCG64) for the stream at ``path``."""
    return np.random.default_rng(seed_sequence(root, *path))


def _path_digest(root: int, path: tuple, person: bytes) -> bytes:
    # an injective encoding: integers and strings are tagged apart, so 3 and "3" differ
    parts = [f"i{_key_to_int(int(k))}" if isinstance(k, (int, np.integer)) else f"s{k}" for k in (root, *path)]
    return hashlib.blake2b("\x1f".join(parts).encode("utf-8"), digest_size=16, person=person).digest()


def philox_rng(root: int, *path: int | str) -> np.random.Generator:
    """A numpy Generator (Philox4x64, keyed by a 128-bit hash of ``(root, *path)``) for the stream at ``path``."""
    digest = _path_digest(root, path, b"")
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest, "little")))


def sklearn_random_state(root: int, *path: int | str) -> np.random.RandomState:
    """A legacy RandomState (what scikit-learn's ``random_state`` takes) on the stream at ``path``:
    built from a SeedSequence-seeded MT19937 rather than from a 32-bit integer seed."""
    return np.random.RandomState(np.random.MT19937(seed_sequence(root, *path)))


# --------------------------------------------------------------------------- torch


@functools.lru_cache(maxsize=1)
def _mt_template() -> np.ndarray:
    """The byte layout of torch's CPU generator state, checked on a known seed.

    ``Generator.get_state()`` is a ``CPUGeneratorImplState``: the legacy THGeneratorState (initial
    seed u64, ``left`` i32, ``seeded`` i32, ``next`` u64, the 624 state words each stored as u64,
    the cached normal sample of the double path) followed by the cached float normal sample.
    After ``manual_seed(s)`` word 0 is s and word 1 is 1812433253·(s ⊕ (s ≫ 30)) + 1 (the MT19937
    initialisation), which is how the offsets are verified before any state is written.
    """
    seed = 12345
    generator = torch.Generator()
    generator.manual_seed(seed)
    state = generator.get_state().numpy().copy()
    words = np.frombuffer(state[24:24 + 8 * _MT_WORDS].tobytes(), dtype="<u8")
    second = (1812433253 * (seed ^ (seed >> 30)) + 1) & 0xFFFFFFFF
    layout_ok = (len(state) >= 24 + 8 * _MT_WORDS and int(np.frombuffer(state[:8].tobytes(), "<u8")[0]) == seed
                 and int(words[0]) == seed and int(words[1]) == second)
    if not layout_ok:  # pragma: no cover - a torch release with a new generator layout
        raise RuntimeError(f"torch {torch.__version__}: unexpected CPU generator state layout; "
                           "audit.core.seeding cannot key torch streams in full")
    return state


def _mt_state(root: int, path: tuple) -> torch.Tensor:
    """A torch CPU generator state whose 624 Mersenne Twister words are the SHAKE-256 expansion
    (an extendable-output function, FIPS 202) of the path's 128-bit key."""
    digest = _path_digest(root, path, b"torch-mt19937")
    words = np.frombuffer(hashlib.shake_256(digest).digest(4 * _MT_WORDS), dtype="<u4").astype("<u8")
    words[0] |= 0x80000000  # as MT19937's init_by_array: the state can never be all zero
    state = _mt_template().copy()
    state[:8] = np.frombuffer(digest[:8], dtype=np.uint8)  # initial_seed(): the low 64 bits of the key
    state[8:12] = np.frombuffer(np.int32(1).astype("<i4").tobytes(), dtype=np.uint8)  # left = 1: twist first
    state[16:24] = 0  # next
    state[24:24 + 8 * _MT_WORDS] = np.frombuffer(words.tobytes(), dtype=np.uint8)
    state[24 + 8 * _MT_WORDS:] = 0  # no cached normal samples
    return torch.from_numpy(state)


def torch_generator(root: int, *path: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator for the stream at ``path``, keyed by all of it.

    On CPU the Mersenne Twister's whole state is set from the key; a CUDA generator (Philox, a
    64-bit seed) takes 64 bits of the 128-bit key.
    """
    generator = torch.Generator(device=device)
    if generator.device.type == "cpu":
        generator.set_state(_mt_state(root, path))
    else:
        generator.manual_seed(int.from_bytes(_path_digest(root, path, b"torch-device")[:8], "little"))
    return generator


def seed_torch(root: int, *path: int | str) -> None:
    """Seed torch's global generators (model initialisation, dropout) from the stream at ``path``."""
    torch.default_generator.set_state(_mt_state(root, path))
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(int.from_bytes(_path_digest(root, path, b"torch-device")[:8], "little"))
