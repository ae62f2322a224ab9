"""Per-record token lengths, checked without copying the user's array (it may hold 10^8 records).

The bound: a pass's tokens, T, add up to at most ``MAX_TOKENS`` = 2**62 - 1 (and so does every length,
``seq_len`` and ``max_tokens``). Every token offset, window sum and ``row * seq_len`` of a pass then stays
below 2**63 (int64) with room to spare, whatever the window: nothing in the packing arithmetic can wrap.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from stateful_sampler.order.strategy import integer_array

MAX_TOKENS = (1 << 62) - 1  # a pass's tokens: offsets and row * seq_len stay within int64
_CHUNK = 1 << 20  # records per pass over the array: temporaries of a few MB whatever N is
_LOW_BITS = 31  # a length below 2**62 splits into two halves whose sums over a chunk fit int64 exactly


def token_lengths(values: Any) -> np.ndarray:
    """A 1-D integer array of lengths, each at least 1, adding up to at most ``MAX_TOKENS``; the user's
    NumPy integer array is used as it is. A length or a running total that does not fit is refused naming
    its record (a uint64 ``-1`` marker, 2**64 - 1, would otherwise wrap the total round)."""
    array = integer_array("lengths", values, "integer token counts", "for record", maximum=MAX_TOKENS)
    if not array.size:
        raise ValueError("lengths must hold at least one record, got an empty array")
    shortest = int(np.argmin(array))
    if array[shortest] < 1:
        raise ValueError(
            f"lengths must be at least 1 token each, got {int(array[shortest])} for record {shortest}: "
            f"leave empty records out of the dataset"
        )
    longest = int(np.argmax(array))
    if int(array[longest]) * len(array) > MAX_TOKENS:  # only then can the total pass the bound
        _refuse_total_beyond_bound(array)
    return np.ascontiguousarray(array)


def _refuse_total_beyond_bound(lengths: np.ndarray) -> None:
    """Add the lengths exactly (each below 2**62: its two 31-bit halves sum over a chunk within int64) and
    refuse, naming the record where the running total passes ``MAX_TOKENS``."""
    total = 0
    for at in range(0, len(lengths), _CHUNK):
        chunk = lengths[at : at + _CHUNK].astype(np.int64)
        high, low = chunk >> _LOW_BITS, chunk & ((1 << _LOW_BITS) - 1)
        added = (int(high.sum()) << _LOW_BITS) + int(low.sum())
        if total + added > MAX_TOKENS:
            for offset, length in enumerate(chunk.tolist()):
                total += length
                if total > MAX_TOKENS:
                    raise ValueError(
                        f"lengths must add up to at most 2**62 - 1 tokens (a pass's token offsets are int64), got "
                        f"more: the running total passes it at record {at + offset} ({length} tokens)"
                    )
        total += added


def refuse_longer(lengths: np.ndarray, limit: int, limit_name: str, advice: str) -> None:
    """Refuse records longer than ``limit``, naming the longest, how many there are, and ``advice``."""
    longest = int(np.argmax(lengths))
    if lengths[longest] <= limit:
        return
    count = sum(int(np.count_nonzero(lengths[at : at + _CHUNK] > limit)) for at in range(0, len(lengths), _CHUNK))
    raise ValueError(
        f"record {longest} has {int(lengths[longest])} tokens, more than {limit_name}={limit} "
        f"({count} record{'s' if count > 1 else ''} longer): {advice}"
    )


def lengths_digest(lengths: np.ndarray) -> str:
    """A hash of the values (not of their dtype: int32 and int64 copies of the same lengths agree), at memory
    speed: the lengths, as rows of ``_FOLD_WIDTH``, are folded by multiply-add modulo 2**64 with two fixed rows of
    odd constants, and blake2b hashes the two lanes of every row, in order, and the count. A length changed by
    any amount changes its row's lanes (an odd constant times a nonzero difference below 2**63 is never 0 modulo
    2**64), and a moved row moves its lanes: only contrived changes that cancel in both lanes go unseen.

    Example:
        >>> lengths_digest(np.array([5, 3, 8])) == lengths_digest(np.array([5, 3, 8], dtype=np.int32))
        True
        >>> lengths_digest(np.array([5, 3, 8])) == lengths_digest(np.array([5, 8, 3]))
        False
    """
    digest = hashlib.blake2b(f"fold/{len(lengths)}/".encode(), digest_size=16)
    for at in range(0, len(lengths), _CHUNK):
        chunk = lengths[at : at + _CHUNK]
        rows = -(-len(chunk) // _FOLD_WIDTH)
        values = np.zeros(rows * _FOLD_WIDTH, dtype=np.uint64)  # zeros past the end: no length is 0
        values[: len(chunk)] = chunk
        lanes = np.einsum("ij,kj->ik", values.reshape(rows, _FOLD_WIDTH), _FOLD_CONSTANTS)  # wraps modulo 2**64
        digest.update(np.ascontiguousarray(lanes, dtype="<u8").data)
    return digest.hexdigest()


def legacy_lengths_digest(lengths: np.ndarray) -> str:
    """The digest of packing states before version 3 (blake2b of the int64 values), computed only to load one."""
    digest = hashlib.blake2b(digest_size=16)
    for at in range(0, len(lengths), _CHUNK):
        digest.update(np.ascontiguousarray(lengths[at : at + _CHUNK], dtype=np.int64).data)
    return digest.hexdigest()


def _fold_constants(lanes: int, width: int) -> np.ndarray:
    """Fixed odd 64-bit constants, SplitMix64 of 1, 2, 3, ... (pure integer arithmetic: the same everywhere)."""
    state = (np.arange(1, lanes * width + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).reshape(lanes, width)
    state = (state ^ (state >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    state = (state ^ (state >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (state ^ (state >> np.uint64(31))) | np.uint64(1)


_FOLD_WIDTH = 4096  # lengths per folded row: a 10^8 digest hashes 24,415 rows of two lanes (390 KB)
_FOLD_CONSTANTS = _fold_constants(2, _FOLD_WIDTH)
