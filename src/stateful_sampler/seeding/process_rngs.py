"""Seeding the process-wide RNGs for one sample after another, and putting the caller's states back.

Python ``random``, NumPy's legacy global RNG and torch's CPU RNG belong to the whole process: while a sample
has them seeded, any other thread drawing from them takes the sample's draws, and the sample another thread's.
So they are seeded only for loads on the process's main thread, where a ``DataLoader`` (in its worker
processes, or with ``num_workers=0``) loads; other threads get ``GlobalRNGThreadError``.

What keeps this at a few µs a sample:
- The caller's states are saved once per batch of samples, not once per sample.
- NumPy's legacy ``RandomState`` is pointed at a bit generator of ours (``np.random.set_bit_generator``) and
  back, instead of copying its 624 words out and in (``get_state``/``set_state`` copy them one by one, 45 µs).
  Only its cached Gaussian has to be carried over, through a stand-in bit generator.
- Each seed is computed ahead, for the whole batch (``global_seeds``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stateful_sampler.errors import GlobalRNGThreadError
from stateful_sampler.order.mixing import seed_word_rows, seed_words
from stateful_sampler.seeding.generators import NUMPY_WORDS, TORCH_WORDS, torch_states
from stateful_sampler.seeding.legacy_mt import LegacyMT, c_seed

GLOBAL_RNGS = ("random", "numpy", "torch")
# private: the instance behind random.random, random.seed, ...
_python = random._inst  # type: ignore[attr-defined]
# private: the RandomState behind np.random.random, np.random.seed, ...
_legacy = np.random.mtrand._rand
_spares: list[LegacyMT] = []  # the bit generator of each level of nested seeded loads
_depth = 0


@dataclass(frozen=True)
class GlobalSeeds:
    """What each sample of a batch seeds the global RNGs with."""

    python: list[int]  # random.seed(python[i])
    numpy: list[int]  # np.random.seed of the two 32-bit words of numpy[i], low word first
    torch: np.ndarray | None  # row i: torch's CPU RNG state; None when torch is not seeded


def global_seeds(seeds: np.ndarray, torch_seeded: bool) -> GlobalSeeds:
    """The seeds ``seed_globals`` derives from each of ``seeds`` (uint64), for a batch at once."""
    stop = TORCH_WORDS.stop if torch_seeded else NUMPY_WORDS.stop
    words = seed_words(int(seeds[0]), 0, stop)[None, :] if len(seeds) == 1 else seed_word_rows(seeds, 0, stop)
    pairs = words[:, : NUMPY_WORDS.stop].astype(np.uint64)
    python = (pairs[:, 0] | pairs[:, 1] << np.uint64(32)).tolist()
    numpy = (pairs[:, 2] | pairs[:, 3] << np.uint64(32)).tolist()
    return GlobalSeeds(python, numpy, torch_states(seeds, words[:, TORCH_WORDS]) if torch_seeded else None)


def check_main_thread() -> None:
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        raise GlobalRNGThreadError(
            f"SeededDataset seeds the process-wide random, NumPy and torch RNGs, so it loads only on the main "
            f"thread, got a load on thread {thread.name!r}: another thread's draws would take this sample's "
            f"streams. For thread-based loading, draw from the sample's own generators: define "
            f"load_sample(index, rng) on the dataset, use rng.numpy and rng.torch, and wrap it as "
            f"SeededDataset(dataset, global_rngs=())"
        )


@contextmanager
def seeded_globals(names: frozenset[str], seeds: GlobalSeeds) -> Iterator[Callable[[int], None]]:
    """``with seeded_globals(names, seeds) as seed:`` call ``seed(i)`` before loading sample ``i``; afterwards,
    even after an error, the named RNGs hold the states they held before."""
    global _depth
    check_main_thread()
    python, numpy, torch_seeded = ("random" in names), ("numpy" in names), ("torch" in names)
    python_state = random.getstate() if python else None
    torch_state = torch.get_rng_state() if torch_seeded else None
    if numpy and _depth == len(_spares):
        _spares.append(LegacyMT())
    spare = _spares[_depth] if numpy else None
    outside = np.random.get_bit_generator() if numpy else None  # type: ignore[attr-defined]  # not in the stubs
    gaussian = _cached_gaussian() if numpy else None

    def seed(i: int) -> None:
        if python:
            c_seed(_python, seeds.python[i])
            _python.gauss_next = None  # type: ignore[attr-defined]  # Random's C attribute, not in typeshed
        if spare is not None:
            spare.seed(seeds.numpy[i])
            np.random.set_bit_generator(spare.bit_generator)  # type: ignore[attr-defined]  # clears the cached Gaussian
        if torch_state is not None:
            torch.set_rng_state(torch.from_numpy(seeds.torch[i]))  # type: ignore[index]

    _depth += 1
    try:
        yield seed
    finally:
        _depth -= 1
        if python_state is not None:
            random.setstate(python_state)
        if outside is not None:
            np.random.set_bit_generator(outside)  # type: ignore[attr-defined]
            _restore_cached_gaussian(*gaussian)  # type: ignore[misc]
        if torch_state is not None:
            torch.set_rng_state(torch_state)


class _GaussianOnly:
    """Stands in for the legacy RandomState's bit generator during one ``get_state``/``set_state``, so that
    these read or write its cached Gaussian and not the 624 words behind it."""

    @property
    def state(self) -> dict[str, Any]:
        return {"bit_generator": "MT19937", "state": None}

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        pass


_GAUSSIAN_ONLY = _GaussianOnly()


def _cached_gaussian() -> tuple[int, float]:
    """NumPy's legacy RandomState draws normals in pairs and keeps the second for the next call."""
    # private: RandomState's bit generator, swapped for a moment to read or set only the cached normal
    real, _legacy._bit_generator = _legacy._bit_generator, _GAUSSIAN_ONLY  # type: ignore[assignment]
    try:
        state = _legacy.get_state(legacy=False)
    finally:
        # private: the swap above, undone
        _legacy._bit_generator = real
    return state["has_gauss"], state["gauss"]


def _restore_cached_gaussian(has_gauss: int, gauss: float) -> None:
    if not has_gauss:  # set_bit_generator left none
        return
    # private: RandomState's bit generator, swapped for a moment to read or set only the cached normal
    real, _legacy._bit_generator = _legacy._bit_generator, _GAUSSIAN_ONLY  # type: ignore[assignment]
    try:
        _legacy.set_state({"bit_generator": "MT19937", "state": None, "has_gauss": has_gauss, "gauss": gauss})
    finally:
        # private: the swap above, undone
        _legacy._bit_generator = real
