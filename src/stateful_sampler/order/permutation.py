"""A seeded bijection on [0, size) that evaluates any block of positions in O(block).

A Feistel network over Z_m x Z_n with m = ceil(sqrt(size)) and n = ceil(size / m) is a bijection on
[0, m*n) by construction, whatever the round function. Values that land in [size, m*n) are walked
through the cipher again (cycle walking), which keeps it a bijection on [0, size). Because
m*n - size < m, fewer than 1 in sqrt(size) values ever needs a second walk. Sizing the domain from
``size`` itself (not from a power of 4) avoids Grain's failure at 4^k + 1, where the cipher block
was too narrow for the index range.
"""

from __future__ import annotations

from math import isqrt

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed, mix64_array

MAX_SIZE = 1 << 62  # keeps m below 2**31, so the 32x32-bit multiply-shift reduction stays exact

_U32 = np.uint64(32)


def rounds_for(size: int) -> int:
    """Feistel rounds for a domain: tiny domains need more rounds before every record is
    equally likely at every position (measured by the chi-square test in tests/test_permutation.py)."""
    return 12 if size <= 1024 else 6


class FeistelPermutation:
    """The permutation of one pass: ``perm(positions)`` gives the records at those positions."""

    __slots__ = ("size", "_m", "_n", "_round_keys")

    def __init__(self, size: int, seed: int, pass_index: int) -> None:
        if not 0 <= size < MAX_SIZE:
            raise ValueError(f"size must lie in [0, 2**62), got {size}")
        self.size = size
        self._m = isqrt(size - 1) + 1 if size > 1 else 1
        self._n = -(-size // self._m) if size > 0 else 1
        self._round_keys = tuple(
            derive_seed(Domain.PERMUTATION, seed, pass_index, size, round_index)
            for round_index in range(rounds_for(size))
        )

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Records at ``positions`` (int64 array of values in [0, size)), as an int64 array."""
        values = self._encrypt(positions.astype(np.uint64))
        outside = np.flatnonzero(values >= np.uint64(self.size))
        while outside.size:
            walked = self._encrypt(values[outside])
            values[outside] = walked
            outside = outside[walked >= np.uint64(self.size)]
        return values.view(np.int64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        modulus_left, modulus_right = self._m, self._n
        left = values // np.uint64(modulus_right)
        right = values - left * np.uint64(modulus_right)
        scratch = np.empty_like(values)
        for key in self._round_keys:
            # F(right) in [0, modulus_left): top 32 hash bits scaled by the modulus (Lemire's reduction).
            mix64_array(right, key, out=scratch)
            scratch >>= _U32
            scratch *= np.uint64(modulus_left)
            scratch >>= _U32
            scratch += left
            scratch[scratch >= np.uint64(modulus_left)] -= np.uint64(modulus_left)
            left, right, scratch = right, scratch, left
            modulus_left, modulus_right = modulus_right, modulus_left
        # An even number of rounds (rounds_for is always even) brings the moduli back to (m, n).
        left *= np.uint64(modulus_right)
        left += right
        return left
