"""NumPy's legacy seeding of MT19937, computed by CPython's ``random`` in half the time.

``np.random.seed(key)`` with a key of two 32-bit words and ``random.seed(n)`` with the 64-bit int of the same
words run the same algorithm, MT19937's ``init_by_array``; NumPy spends longer checking its argument (about
3.5 µs) than running it. So a private ``random.Random`` computes the state in C, and its 624 words are copied
into a NumPy ``MT19937`` through the bit generator's documented ``ctypes.state_address``.

Reading those words without ``getstate()`` (625 Python ints, 6 µs) needs CPython's layout of a ``Random``
(``PyObject_HEAD; int index; uint32_t state[624]``, unchanged since Python 2). The words are located once by
their value, and the whole path is checked once against NumPy's own seeding; where either fails, for example
on another interpreter, ``LegacyMT.seed`` takes NumPy's path: slower, never different.
"""

from __future__ import annotations

# private: CPython's Mersenne Twister type, whose C state seeds NumPy's in one step
import _random
import ctypes
import random
from collections.abc import Iterator
from functools import cache

import numpy as np

_MT_WORDS = 624
_MASK32 = 0xFFFFFFFF
_PROBE_KEY = 0x9E3779B97F4A7C15  # both words non-zero, as the fast path needs
c_seed = _random.Random.seed  # what random.seed(n) runs, without random.py's checks of n's type


class LegacyMT:
    """A NumPy ``MT19937`` reseeded as ``np.random.seed(np.array([key & 0xFFFFFFFF, key >> 32], np.uint32))``."""

    def __init__(self) -> None:
        self.bit_generator = np.random.MT19937()
        self._state = _state_view(self.bit_generator)
        self._computer = _computer()

    def seed(self, key: int) -> None:
        computer = self._computer
        if computer is not None and key >> 32:  # a high word of 0 would make Python's key one word long
            generator, words = computer
            c_seed(generator, key)
            self._state[:_MT_WORDS] = words
            self._state[_MT_WORDS] = _MT_WORDS  # pos: the first draw twists, as after init_by_array
        else:
            # private: NumPy's own seeding of MT19937 from a key, the slow path's reference
            self.bit_generator._legacy_seeding(np.array([key & _MASK32, key >> 32], dtype=np.uint32))


def _state_view(bit_generator: np.random.MT19937) -> np.ndarray:
    """NumPy's ``mt19937_state`` (``uint32_t key[624]; int pos``) as 625 writable words."""
    address = bit_generator.ctypes.state_address
    return np.ctypeslib.as_array((ctypes.c_uint32 * (_MT_WORDS + 1)).from_address(address))


def _word_views(generator: random.Random) -> Iterator[np.ndarray]:
    """Every 4-byte-aligned run of 624 words inside the object's fixed-size part."""
    address, size = id(generator), type(generator).__basicsize__
    for offset in range(0, size - 4 * _MT_WORDS + 1, 4):
        yield np.ctypeslib.as_array((ctypes.c_uint32 * _MT_WORDS).from_address(address + offset))


@cache
def _computer() -> tuple[random.Random, np.ndarray] | None:
    """A private ``Random`` and the view of its state words, if they reproduce NumPy's seeding of a probe key."""
    generator = random.Random(_PROBE_KEY)
    expected = np.array(generator.getstate()[1][:_MT_WORDS], dtype=np.uint32)
    words = next((view for view in _word_views(generator) if np.array_equal(view, expected)), None)
    if words is None:
        return None
    reference, fast = np.random.MT19937(), np.random.MT19937()
    # private: NumPy's own seeding, the reference the fast path is checked against
    reference._legacy_seeding(np.array([_PROBE_KEY & _MASK32, _PROBE_KEY >> 32], dtype=np.uint32))
    c_seed(generator, _PROBE_KEY)
    state = _state_view(fast)
    state[:_MT_WORDS], state[_MT_WORDS] = words, _MT_WORDS
    expected_state, fast_state = reference.state["state"], fast.state["state"]
    same = fast_state["pos"] == expected_state["pos"] and np.array_equal(fast_state["key"], expected_state["key"])
    return (generator, words) if same else None
