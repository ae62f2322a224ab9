"""Records grouped by class, and per-class permutations evaluated for a block of (class, permutation, rank) at once.

``Stratified`` decides which class and which of its draws sits at each position; this module turns a
class's draw into a record: draw ``r`` of permutation ``q`` of class ``c`` is the record at rank
``perm_{c,q}(r)`` among class c's records in index order. The permutation is a Feistel network over
Z_m x Z_n sized from the class (as ``FeistelPermutation``), with every element carrying its own moduli and
round keys, so a block that touches thousands of small classes or per-class passes costs one vectorised
walk, not one cipher object each.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stateful_sampler.order.mixing import mix64_array
from stateful_sampler.order.permutation import feistel_rounds

_ROUNDS = 12  # as FeistelPermutation: 12 rounds for domains up to 1024, 6 above; even, so (m, n) come back
_LARGE_ROUNDS = 6
_SMALL_DOMAIN = 1024
_ROUND_KEYS = tuple(np.uint64(r * 0x9E3779B97F4A7C15 & (2**64 - 1)) for r in range(_ROUNDS))  # keys + r * golden


class ClassTable:
    """The records of each class in index order: ``records[starts[c]:starts[c] + sizes[c]]``.

    Classes are the distinct label values, ascending; ``ids[c]`` is class c's label. One stable sort at
    construction, O(N log N); one int per record (int32 below 2**31 records).
    """

    def __init__(self, labels: np.ndarray) -> None:
        self.ids, self.sizes = np.unique(labels, return_counts=True)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self.records = np.argsort(labels, kind="stable").astype(np.int32 if len(labels) < 2**31 else np.int64)

    def __len__(self) -> int:
        return len(self.sizes)

    def draws(self, classes: np.ndarray, permutations: np.ndarray, ranks: np.ndarray, key: int) -> np.ndarray:
        """The records of draw ``ranks`` of permutation ``permutations`` of class ``classes`` (integer arrays of
        one shape; ranks below the class's size; permutation numbers as 64-bit words), for a pass key ``key``."""
        sizes = self.sizes[classes].astype(np.uint64)
        base = mix64_array(classes.astype(np.uint64), key, np.empty(classes.shape, dtype=np.uint64))
        base = mix64_array(base ^ permutations.astype(np.uint64), 0, base)
        shuffled = _permute(ranks.astype(np.uint64), sizes, base)
        return self.records[self.starts[classes] + shuffled.astype(np.int64)].astype(np.int64)


def _permute(values: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``values[i]`` through the Feistel bijection on [0, sizes[i]) keyed by ``keys[i]``, cycle-walking the
    values that land in [size, m*n) as ``FeistelPermutation`` does (and with its rounds: 12 up to 1024, else 6)."""
    left_mod = _isqrt(np.maximum(sizes, np.uint64(1)) - np.uint64(1)) + np.uint64(1)
    right_mod = np.maximum((sizes + left_mod - np.uint64(1)) // left_mod, np.uint64(1))
    out = _encrypt(values, sizes, left_mod, right_mod, keys)
    outside = np.flatnonzero(out >= sizes)
    while outside.size:
        walked = _encrypt(out[outside], sizes[outside], left_mod[outside], right_mod[outside], keys[outside])
        out[outside] = walked
        outside = outside[walked >= sizes[outside]]
    return out


def _encrypt(values: np.ndarray, sizes: np.ndarray, mod_left: np.ndarray, mod_right: np.ndarray,
             keys: np.ndarray) -> np.ndarray:  # fmt: skip
    """One walk of the cipher over [0, m*n): six rounds for every value, six more for the small domains."""
    left = values // mod_right
    right = values - left * mod_right
    left, right = feistel_rounds(left, right, mod_left, mod_right, _round_keys(keys, _ROUND_KEYS[:_LARGE_ROUNDS]))
    small = np.flatnonzero(sizes <= _SMALL_DOMAIN)
    if small.size:
        left[small], right[small] = feistel_rounds(left[small], right[small], mod_left[small], mod_right[small],
                                                   _round_keys(keys[small], _ROUND_KEYS[_LARGE_ROUNDS:]))  # fmt: skip
    left *= mod_right
    left += right
    return left


def _round_keys(keys: np.ndarray, offsets: tuple[np.uint64, ...]) -> Iterator[np.ndarray]:
    """Each value's key for each round: its own key plus the round's offset (an even number of rounds, so the
    moduli come back to (m, n)). One buffer serves every round: a round is done with its key before the next."""
    key = np.empty_like(keys)
    for offset in offsets:
        np.add(keys, offset, out=key)
        yield key


def _isqrt(values: np.ndarray) -> np.ndarray:
    """Floor square roots of uint64 values below 2**62, exact (a float root corrected by one either way)."""
    roots = np.floor(np.sqrt(values.astype(np.float64))).astype(np.uint64)
    roots = np.where(roots * roots > values, roots - np.uint64(1), roots)
    return np.where((roots + np.uint64(1)) * (roots + np.uint64(1)) <= values, roots + np.uint64(1), roots)
