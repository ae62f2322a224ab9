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
    """A hash of the values (not of their dtype: int32 and int64 copies of the same lengths agree); each chunk's
    int64 buffer is hashed as it is, without a bytes copy (a resume's construction at 10^8 hashes 800 MB)."""
    digest = hashlib.blake2b(digest_size=16)
    for at in range(0, len(lengths), _CHUNK):
        digest.update(np.ascontiguousarray(lengths[at : at + _CHUNK], dtype=np.int64).data)
    return digest.hexdigest()
