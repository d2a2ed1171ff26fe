"""Random streams are keyed by the whole path: distinct keys never share a stream.

torch's CPU generator keeps only 32 bits of a ``manual_seed`` — ``manual_seed(k)`` and
``manual_seed(k + 2³²)`` draw the same numbers — so among a million streams seeded that way about
10¹²/2³³ ≈ 116 pairs would collide. These tests fail on such a scheme.
"""

from __future__ import annotations

import numpy as np
import torch

from audit.core.seeding import (
    _mt_state,
    _path_digest,
    derive_seed,
    numpy_rng,
    philox_rng,
    seed_torch,
    sklearn_random_state,
    torch_generator,
)


def _keys(count: int):
    """(run, round, client, purpose) keys, as the engine and the pipeline build them."""
    purposes = ("noise", "mask", "rounding", "dpsgd")
    for i in range(count):
        yield (i % 64, "round", (i // 64) % 100, "client", i // 6400, purposes[i % 4])


def test_torch_manual_seed_truncates_to_32_bits():
    """The premise: a plain manual_seed stream is keyed by the low 32 bits only."""
    first, second = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5 + 2 ** 32)
    assert torch.equal(torch.randn(4, generator=first), torch.randn(4, generator=second))
    assert not torch.equal(torch.randn(4, generator=torch_generator(5, "x")),
                           torch.randn(4, generator=torch_generator(5 + 2 ** 32, "x")))


def test_a_million_keys_give_a_million_stream_keys():
    """10⁶ distinct (run, round, client, purpose) paths get 10⁶ distinct 128-bit keys, from which a torch
    stream's whole Mersenne Twister state is expanded; the state of a few is checked to differ too."""
    digests = {_path_digest(7, key, b"torch-mt19937") for key in _keys(10 ** 6)}
    assert len(digests) == 10 ** 6
    states = {_mt_state(7, key).numpy()[24:40].tobytes() for key in _keys(10_000)}
    assert len(states) == 10_000


def test_generators_draw_distinct_noise_end_to_end():
    """2·10⁵ real generators: their first normal draws are all distinct (with 32-bit seeds, collisions
    among 2·10⁵ streams occur with probability 1 − e^{−4.7} ≈ 99 %)."""
    draws = np.array([float(torch.randn(1, generator=torch_generator(3, *key), dtype=torch.float64))
                      for key in _keys(200_000)])
    assert len(np.unique(draws)) == len(draws)


def test_same_key_same_stream_and_string_keys_are_full_width():
    key = (11, "round", 3, "client", 5, "noise")
    assert torch.equal(torch.randn(8, generator=torch_generator(*key)), torch.randn(8, generator=torch_generator(*key)))
    assert numpy_rng(*key).integers(0, 2 ** 63) == numpy_rng(*key).integers(0, 2 ** 63)
    # strings differing anywhere give different streams, and "3" is not the integer 3
    assert numpy_rng(1, "noise").random() != numpy_rng(1, "noisf").random()
    assert philox_rng(1, 3).random() != philox_rng(1, "3").random()
    assert not torch.equal(torch.randn(3, generator=torch_generator(1, 3)), torch.randn(3, generator=torch_generator(1, "3")))


def test_numpy_streams_of_many_keys_are_distinct():
    heads = {int(numpy_rng(7, *key).integers(0, 2 ** 63)) for key in _keys(100_000)}
    assert len(heads) == 100_000


def test_derived_seeds_keep_128_bits():
    """Child roots are 128-bit: they never collide where a 32-bit or 63-bit seed would start to."""
    seeds = {derive_seed(0, "run", r) for r in range(100_000)}
    assert len(seeds) == 100_000
    assert max(s.bit_length() for s in seeds) > 100


def test_global_torch_seed_and_sklearn_state():
    seed_torch(2 ** 40 + 1, "torch")
    first = torch.rand(3)
    seed_torch(2 ** 40 + 1, "torch")
    assert torch.equal(first, torch.rand(3))
    seed_torch(1, "torch")
    assert not torch.equal(first, torch.rand(3))
    a, b = sklearn_random_state(5, "classifier"), sklearn_random_state(5 + 2 ** 32, "classifier")
    assert a.randint(0, 2 ** 31) != b.randint(0, 2 ** 31)

