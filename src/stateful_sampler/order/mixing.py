"""Seed derivation: turn structured words (seed, epoch, index, ...) into independent 64-bit keys.

Each word is folded in through a bijective 64-bit mixer (SplitMix64's finaliser), so for a fixed
prefix distinct words always give distinct outputs, and shifted inputs do not line up the way
``seed + index`` does (Grain's per-record seeds collide exactly like that). A per-purpose domain
tag keeps the permutation keys, worker seeds and sample seeds apart even for equal words.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


class Domain(IntEnum):
    """What a derived seed is for; equal words in different domains give unrelated seeds."""

    PERMUTATION = 0x5045524D  # "PERM"
    WORKER = 0x574F524B  # "WORK"
    SAMPLE = 0x53414D50  # "SAMP"


def mix64(value: int) -> int:
    """SplitMix64 finaliser: a bijection on 64-bit ints with full avalanche."""
    z = (value + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def derive_seed(domain: Domain, *words: int) -> int:
    """A 64-bit seed that depends on every word; each word must lie in [0, 2**64)."""
    state = mix64(int(domain))
    for word in words:
        if not 0 <= word <= MASK64:
            raise ValueError(f"seed words must lie in [0, 2**64), got {word}")
        state = mix64(state ^ word)
    return state


def mix64_array(values: np.ndarray, key: int, out: np.ndarray) -> np.ndarray:
    """Vectorised ``mix64(value ^ key)`` over a uint64 array, written into ``out``."""
    np.bitwise_xor(values, np.uint64(key), out=out)
    out += np.uint64(_GOLDEN)
    out ^= out >> np.uint64(30)
    out *= np.uint64(_MUL1)
    out ^= out >> np.uint64(27)
    out *= np.uint64(_MUL2)
    out ^= out >> np.uint64(31)
    return out


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one record's randomness in one pass: the same wherever and whenever it loads."""
    return derive_seed(Domain.SAMPLE, seed, epoch, index)


def worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """The seed of one DataLoader worker's randomness in one epoch on one rank."""
    return derive_seed(Domain.WORKER, seed, epoch, rank, worker_id)


def seed_words(seed: int, start: int, stop: int) -> np.ndarray:
    """Words [start, stop) (both even) of a 64-bit seed's endless stream of 32-bit words.

    Counter mode over the mixed seed, so a whole MT19937 state (624 words) depends on all 64 bits:
    ``torch.manual_seed`` keeps only 32 of them, and 10^6 samples seeded that way would share ~100
    streams (birthday bound). Two seeds share a word only if their mixed keys XOR to less than the
    counter range, a chance of about 2**-53 per pair for a few thousand words.
    """
    counters = np.arange(start // 2, stop // 2, dtype=np.uint64)
    return mix64_array(counters, mix64(seed), np.empty_like(counters)).view(np.uint32)


def sample_seeds(seeds: np.ndarray, epochs: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``sample_seed`` over uint64 arrays at once: a batch's seeds for the price of a few NumPy calls."""
    state = np.full(np.broadcast(seeds, epochs, indices).shape, mix64(int(Domain.SAMPLE)), dtype=np.uint64)
    for words in (seeds, epochs, indices):
        state = mix64_array(state ^ words, 0, state)
    return state


def derive_seeds(domain: Domain, *words: np.ndarray | int) -> np.ndarray:
    """``derive_seed`` over uint64 arrays (or ints) of words at once, broadcast: many seeds in a few NumPy calls.

    Example:
        >>> int(derive_seeds(Domain.PERMUTATION, np.array([7], dtype=np.uint64), 3)[0]) == derive_seed(Domain.PERMUTATION, 7, 3)
        True
    """
    arrays = [np.asarray(word, dtype=np.uint64) for word in words]
    state = np.full(np.broadcast(*arrays).shape, mix64(int(domain)), dtype=np.uint64)
    for word in arrays:
        state = mix64_array(state ^ word, 0, state)
    return state


def seed_word_rows(seeds: np.ndarray, start: int, stop: int) -> np.ndarray:
    """``seed_words`` for a uint64 array of seeds: row ``i`` holds ``seed_words(seeds[i], start, stop)``."""
    rows = np.arange(start // 2, stop // 2, dtype=np.uint64) ^ mix64_array(seeds, 0, np.empty_like(seeds))[:, None]
    return mix64_array(rows, 0, rows).view(np.uint32)


def extend_seed(prefix: int, word: int) -> int:
    """``derive_seed(domain, *words, word)`` given ``prefix = derive_seed(domain, *words)``: one more word folded in
    (``word`` in [0, 2**64)), so a caller deriving many seeds that share their first words derives those once."""
    return mix64(prefix ^ word)
