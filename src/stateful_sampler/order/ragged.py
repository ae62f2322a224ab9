"""Many small seeded bijections at once: one on [0, size_d) for every domain d, evaluated for a block of
(domain, value) pairs in a few NumPy calls.

``FeistelPermutation`` permutes one domain; shuffling inside thousands of groups with it would cost a
Python call per group in every block. Here each element carries its own moduli (m, n) and its own
key (its domain mixed into the pass's seed), so one vectorised Feistel network over Z_m x Z_n serves
every domain of the block, with the same cycle walking onto [0, size_d). Moduli stay below 2**31
(sizes below 2**62), so the multiply-shift reduction is exact, as in ``permutation.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed, mix64, mix64_array
from stateful_sampler.order.permutation import feistel_rounds

ROUNDS = 12  # the small-domain count of ``permutation.rounds_for``: groups are mostly small


class RaggedPermutation:
    """Per-domain bijections for given domain sizes (all positive); the moduli are set up once, O(domains)."""

    __slots__ = ("_m", "_n", "sizes")

    def __init__(self, sizes: np.ndarray) -> None:
        sizes = np.asarray(sizes, dtype=np.int64)
        below = np.maximum(sizes - 1, 0)
        root = np.floor(np.sqrt(below.astype(np.float64))).astype(np.int64)
        root -= root * root > below  # float sqrt is off by at most one either way
        root += (root + 1) * (root + 1) <= below
        m = np.where(sizes > 1, root + 1, 1)
        self.sizes = sizes.view(np.uint64)
        self._m = m.view(np.uint64)
        self._n = (-(-np.maximum(sizes, 1) // m)).view(np.uint64)

    def __call__(self, seed: int, domains: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The images of ``values`` (int64, each in [0, sizes[domain])) under the bijection of their
        ``domains`` for this ``seed``."""
        keys = np.empty(len(domains), dtype=np.uint64)
        mix64_array(domains.astype(np.uint64), derive_seed(Domain.PERMUTATION, seed), keys)
        rounds = tuple(np.uint64(derive_seed(Domain.PERMUTATION, seed, index)) for index in range(ROUNDS))
        return self._images(values, domains, keys, rounds)

    def at_seeds(self, seeds: np.ndarray, domains: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``self(seeds[i], domains[i:i+1], values[i:i+1])`` for every i at once (``seeds`` uint64): a block whose
        values fall under many seeds (a mixture's small sources, each on its own pass) in one cipher, not one a seed.
        """
        if seeds.size and (seeds == seeds[0]).all():  # one seed (large sources, one pass each): its round keys once
            return self(int(seeds[0]), domains, values)
        bases = mix64_array(seeds, mix64(int(Domain.PERMUTATION)), np.empty_like(seeds))  # derive_seed(PERM, seed)
        keys = mix64_array(domains.astype(np.uint64) ^ bases, 0, np.empty_like(seeds))
        rounds = tuple(mix64_array(bases, index, np.empty_like(seeds)) for index in range(ROUNDS))
        return self._images(values, domains, keys, rounds)

    def _images(
        self, values: np.ndarray, domains: np.ndarray, keys: np.ndarray, rounds: tuple[np.uint64 | np.ndarray, ...]
    ) -> np.ndarray:
        """The cipher, cycle-walked onto each domain; a round key is one word, or one per value."""
        m, n, sizes = self._m[domains], self._n[domains], self.sizes[domains]
        result = self._encrypt(values.astype(np.uint64), keys, rounds, m, n)
        outside = np.flatnonzero(result >= sizes)
        while outside.size:
            walking = tuple(key[outside] if isinstance(key, np.ndarray) else key for key in rounds)
            walked = self._encrypt(result[outside], keys[outside], walking, m[outside], n[outside])
            result[outside] = walked
            outside = outside[walked >= sizes[outside]]
        return result.view(np.int64)

    @staticmethod
    def _encrypt(
        values: np.ndarray, keys: np.ndarray, rounds: tuple[np.uint64 | np.ndarray, ...], m: np.ndarray, n: np.ndarray
    ) -> np.ndarray:
        """One pass of the per-element cipher over [0, m*n); the round function hashes right ^ key ^ round."""
        left = values // n
        right = values - left * n
        left, right = feistel_rounds(left, right, m, n, _round_keys(keys, rounds))  # ROUNDS is even
        return left * n + right


def _round_keys(keys: np.ndarray, rounds: tuple[np.uint64 | np.ndarray, ...]) -> Iterator[np.ndarray]:
    """Each element's key for each round, its own key ^ the round's; one buffer serves every round (a round is
    done with its key before the next)."""
    key = np.empty_like(keys)
    for round_key in rounds:
        np.bitwise_xor(keys, round_key, out=key)
        yield key
