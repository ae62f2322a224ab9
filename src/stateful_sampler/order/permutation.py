"""A seeded bijection on [0, size) that evaluates any block of positions in O(block).

A Feistel network over Z_m x Z_n with m = ceil(sqrt(size)) and n = ceil(size / m) is a bijection on
[0, m*n) by construction, whatever the round function. Values that land in [size, m*n) are walked
through the cipher again (cycle walking), which keeps it a bijection on [0, size). Because
m*n - size < m, fewer than 1 in sqrt(size) values ever needs a second walk. Sizing the domain from
``size`` itself (not from a power of 4) avoids Grain's failure at 4^k + 1, where the cipher block
was too narrow for the index range.

Speed: every step is an in-place NumPy ufunc over the block (two scratch arrays, no temporaries),
the round function is two multiplies around one xorshift, and the modular addition is a subtract
and a minimum instead of a masked write (see docs/performance.md). A block of a few positions (a resume locating
one batch in each of many sources) goes through the same rounds in Python ints, 10-20x faster than NumPy's cost
per call. A large block of a domain whose halves are small (m up to 2**14: up to 2**28 records) reads each round's
F from a table of its m or n values instead (``round_tables``), built once per permutation: a gather and the
modular addition a round, 4 ufuncs instead of 10, bit for bit the same values.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import isqrt

import numpy as np

from stateful_sampler.order.mixing import MASK64, Domain, derive_seed, derive_seeds, extend_seed, mix64_array

MAX_SIZE = 1 << 62  # keeps m below 2**31, so the 32x32-bit multiply-shift reduction stays exact

_ROUND_MUL1 = np.uint64(0xBF58476D1CE4E5B9)  # SplitMix64's multipliers: odd, with good bit spread
_ROUND_MUL2 = np.uint64(0x94D049BB133111EB)
_ROUND_SHIFT = np.uint64(29)
_U32 = np.uint64(32)
_SMALL_DOMAIN = 1024  # domains up to this size take 12 rounds, larger ones 6
_MUL1, _MUL2 = int(_ROUND_MUL1), int(_ROUND_MUL2)
# Positions times rounds up to which a block goes through the cipher in Python ints (``_walk``): below it, NumPy's
# fixed cost per call (about 10 ufuncs a round) is more than the work (a resume locates a few positions per source).
_SMALL_BLOCK = 96
# Halves up to which a permutation keeps its rounds' F as tables (``round_tables``): 6 x m int64 values, 0.8 MB at
# 2**14, read by a gather that stays in the L2 cache. CPU ns a position in blocks of 2**14, tables / hashed rounds:
# 17.9 / 26.8 at m = 3163 (N = 10**7), 10.3 / 25.2 at 8192, 10.2 / 24.2 at 16384, 23.4 / 24.4 at 24000, 25.1 / 25.2
# at 32768 (larger tables leave the cache: no gain). A table is built at the first block of at least m positions, so
# its cost (about m positions' hashing per round) never exceeds that block's own.
_TABLE_HALF = 1 << 14


def rounds_for(size: int) -> int:
    """Feistel rounds for a domain: tiny domains need more rounds before every record is
    equally likely at every position (measured by the chi-square test in tests/order/test_permutation.py)."""
    return 12 if size <= _SMALL_DOMAIN else 6


class FeistelPermutation:
    """The permutation of one pass: ``perm(positions)`` gives the records at those positions."""

    __slots__ = ("_keys", "_m", "_n", "_round_keys", "_tables", "size")

    def __init__(self, size: int, seed: int, pass_index: int) -> None:
        if not 0 <= size < MAX_SIZE:
            raise ValueError(f"size must lie in [0, 2**62), got {size}")
        self.size = size
        self._m = isqrt(size - 1) + 1 if size > 1 else 1
        self._n = -(-size // self._m) if size > 0 else 1
        # Round r's key is derive_seed(PERMUTATION, seed, pass_index, size, r): the shared words folded in once.
        prefix = derive_seed(Domain.PERMUTATION, seed, pass_index, size)
        self._keys = tuple(extend_seed(prefix, round_index) for round_index in range(rounds_for(size)))
        self._round_keys = tuple(np.uint64(key) for key in self._keys)
        self._tables: tuple[np.ndarray, ...] | None = None  # built at the first large block (``_TABLE_HALF``)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Records at ``positions`` (int64 array of values in [0, size)), as an int64 array."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size * len(self._keys) <= _SMALL_BLOCK:
            return np.array([self._walk(int(value)) for value in positions.reshape(-1)], dtype=np.int64).reshape(
                positions.shape
            )
        values = self._encrypt(positions.view(np.uint64))
        size = np.uint64(self.size)
        outside = np.flatnonzero(values >= size)
        while outside.size:
            walked = self._encrypt(values[outside])
            values[outside] = walked
            outside = outside[walked >= size]
        return values.view(np.int64)

    def _walk(self, value: int) -> int:
        """One position through the cipher, cycle walking included, in Python ints: the same rounds as
        ``feistel_rounds``, bit for bit, without NumPy's cost per call, which a few positions cannot repay."""
        size, modulus_right = self.size, self._n
        while True:
            left, right = divmod(value, modulus_right)
            modulus_left = self._m
            for key in self._keys:
                hashed = ((right ^ key) * _MUL1) & MASK64
                hashed ^= hashed >> 29
                hashed = ((((hashed * _MUL2) & MASK64) >> 32) * modulus_left >> 32) + left
                if hashed >= modulus_left:
                    hashed -= modulus_left
                left, right = right, hashed
                modulus_left, modulus_right = modulus_right, modulus_left
            value = left * modulus_right + right
            if value < size:
                return value

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        """One pass of the cipher over [0, m*n); ``values`` is left untouched."""
        modulus_left, modulus_right = np.uint64(self._m), np.uint64(self._n)
        left = values // modulus_right
        right = values - left * modulus_right
        # An even number of rounds (rounds_for is always even) brings the moduli back to (m, n).
        if self._tables is None and self._m <= _TABLE_HALF and len(values) >= self._m:
            self._tables = round_tables(modulus_left, modulus_right, self._round_keys)
        if self._tables is not None:
            left, right = table_rounds(left, right, modulus_left, modulus_right, self._tables)
        else:
            left, right = feistel_rounds(left, right, modulus_left, modulus_right, self._round_keys)
        left *= modulus_right
        left += right
        return left


def permute_many(sizes: np.ndarray, seeds: np.ndarray, pass_indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``FeistelPermutation(sizes[i], seeds[i], pass_indices[i])(values[i])`` for every i at once, bit for bit (int64
    arrays, sizes below 2**62, seeds and passes in [0, 2**63)): values under many permutations (one batch's
    positions in many sources' windows) in a few NumPy calls, not a cipher set up per permutation.

    Example:
        >>> sizes, seeds, passes = np.array([5, 2000]), np.array([1, 2]), np.array([0, 9])
        >>> permute_many(sizes, seeds, passes, np.array([3, 1234])).tolist() == [
        ...     int(FeistelPermutation(5, 1, 0)(np.array([3]))[0]), int(FeistelPermutation(2000, 2, 9)(np.array([1234]))[0])]
        True
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    result = np.asarray(values, dtype=np.int64).astype(np.uint64)
    below = np.maximum(sizes - 1, 0)
    root = np.floor(np.sqrt(below.astype(np.float64))).astype(np.int64)
    root -= root * root > below  # float sqrt is off by at most one either way: isqrt exactly
    root += (root + 1) * (root + 1) <= below
    m = np.where(sizes > 1, root + 1, 1).astype(np.uint64)
    n = (-(-np.maximum(sizes, 1) // m.astype(np.int64))).astype(np.uint64)
    prefixes = derive_seeds(Domain.PERMUTATION, np.asarray(seeds), np.asarray(pass_indices), sizes)
    bounds = sizes.astype(np.uint64)
    small = sizes <= _SMALL_DOMAIN
    for rounds, at in ((rounds_for(0), np.flatnonzero(small)), (rounds_for(MAX_SIZE - 1), np.flatnonzero(~small))):
        if not at.size:
            continue
        # Round r's key of each value, extend_seed(prefix, r), all in one call: row i holds value at[i]'s keys.
        words = prefixes[at, None] ^ np.arange(rounds, dtype=np.uint64)[None, :]
        keys = mix64_array(words, 0, words)
        while at.size:
            moduli_left, moduli_right = m[at], n[at]
            left = result[at] // moduli_right
            right = result[at] - left * moduli_right
            left, right = feistel_rounds(left, right, moduli_left, moduli_right, keys.T)  # even: moduli back
            walked = left * moduli_right + right
            result[at] = walked
            outside = walked >= bounds[at]  # cycle walking onto [0, size)
            at, keys = at[outside], keys[outside]
    return result.view(np.int64)


def feistel_rounds(
    left: np.ndarray,
    right: np.ndarray,
    modulus_left: np.uint64 | np.ndarray,
    modulus_right: np.uint64 | np.ndarray,
    round_keys: Iterable[np.uint64 | np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Feistel rounds over (left, right) in Z_m x Z_n, one per round key; both inputs are overwritten. Moduli and
    keys are one word for the whole block (``FeistelPermutation``) or one per value (``RaggedPermutation``, the
    per-class permutations of ``classes.py``), so every cipher of the library shares this round function."""
    hashed = np.empty_like(left)
    scratch = np.empty_like(left)
    for key in round_keys:
        _round_function(right, key, modulus_left, hashed, scratch)
        _add_modulo(hashed, left, modulus_left, scratch)
        left, right, hashed = right, hashed, left
        modulus_left, modulus_right = modulus_right, modulus_left
    return left, right


def round_tables(
    modulus_left: np.uint64, modulus_right: np.uint64, round_keys: Iterable[np.uint64]
) -> tuple[np.ndarray, ...]:
    """Each round's F over every value its right half can take (round r's right half lies in Z_n for even r, Z_m
    for odd r), as int64 arrays: ``feistel_rounds``' round function itself, over ``arange``, so a round can read
    F instead of hashing (``table_rounds``)."""
    tables = []
    for key in round_keys:
        right = np.arange(int(modulus_right), dtype=np.uint64)
        hashed = np.empty_like(right)
        _round_function(right, key, modulus_left, hashed, np.empty_like(right))
        tables.append(hashed.view(np.int64))
        modulus_left, modulus_right = modulus_right, modulus_left
    return tuple(tables)


def table_rounds(
    left: np.ndarray,
    right: np.ndarray,
    modulus_left: np.uint64,
    modulus_right: np.uint64,
    tables: Iterable[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """``feistel_rounds`` with each round's F read from its table (``round_tables``), bit for bit: a gather and
    the modular addition a round. Both inputs (uint64) are overwritten."""
    hashed = np.empty_like(left)
    scratch = np.empty_like(left)
    for table in tables:
        # right < 2**31 is an index as it is, and in the table: "clip" never clips (and is not buffered as "raise" is)
        np.take(table, right.view(np.int64), out=hashed.view(np.int64), mode="clip")
        _add_modulo(hashed, left, modulus_left, scratch)
        left, right, hashed = right, hashed, left
        modulus_left, modulus_right = modulus_right, modulus_left
    return left, right


def _round_function(
    right: np.ndarray, key: np.uint64 | np.ndarray, modulus_left: np.uint64 | np.ndarray, hashed: np.ndarray,
    scratch: np.ndarray,
) -> None:  # fmt: skip
    """F(right) into ``hashed``: a multiply-xorshift-multiply hash of right ^ key, whose top 32 bits are scaled
    into [0, modulus_left) by a multiply-shift (Lemire's reduction, no division)."""
    np.bitwise_xor(right, key, out=hashed)
    hashed *= _ROUND_MUL1
    np.right_shift(hashed, _ROUND_SHIFT, out=scratch)
    hashed ^= scratch
    hashed *= _ROUND_MUL2
    hashed >>= _U32
    hashed *= modulus_left
    hashed >>= _U32


def _add_modulo(
    hashed: np.ndarray, left: np.ndarray, modulus_left: np.uint64 | np.ndarray, scratch: np.ndarray
) -> None:
    """(left + F) mod modulus_left into ``hashed`` (F in it) without a mask: when the sum is below the modulus,
    the subtraction wraps to a huge uint64 and the minimum keeps the sum."""
    hashed += left
    np.subtract(hashed, modulus_left, out=scratch)
    np.minimum(hashed, scratch, out=hashed)
