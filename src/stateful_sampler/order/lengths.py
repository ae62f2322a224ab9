"""Per-record token lengths, checked without copying the user's array (it may hold 10^8 records)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

_CHUNK = 1 << 20  # records per pass over the array: temporaries of a few MB whatever N is


def token_lengths(values: Any) -> np.ndarray:
    """A 1-D integer array of lengths, each at least 1; the user's NumPy array is used as it is."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"lengths must be a list, a NumPy array or a 1-D tensor, got {type(values).__name__}")
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.dtype.kind == "f" and array.size and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            array = array.astype(np.int64)
        elif array.size:
            raise TypeError(f"lengths must hold integer token counts, got dtype {array.dtype}")
        else:
            array = array.astype(np.int64)
    if not array.size:
        raise ValueError("lengths must hold at least one record, got an empty array")
    shortest = int(np.argmin(array))
    if array[shortest] < 1:
        raise ValueError(
            f"lengths must be at least 1 token each, got {int(array[shortest])} for record {shortest}: "
            f"leave empty records out of the dataset"
        )
    return np.ascontiguousarray(array)


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
    """A hash of the values (not of their dtype: int32 and int64 copies of the same lengths agree)."""
    digest = hashlib.blake2b(digest_size=16)
    for at in range(0, len(lengths), _CHUNK):
        digest.update(np.ascontiguousarray(lengths[at : at + _CHUNK], dtype=np.int64).tobytes())
    return digest.hexdigest()
