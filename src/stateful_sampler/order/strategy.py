"""Strategies: which record sits at each position of a pass, as a pure function of (seed, pass, position).

A strategy defines every pass's global order and its length, independently of the world size;
tails, rank sharding, elastic resume and state apply to that order the same way for every
strategy (``layout.py``). A pass is what an epoch draws from: epoch e draws pass e, and ``carry``
reads on into the next passes, so it needs passes of one length.

Each strategy answers three questions: how long pass p is, which records sit at a block of its
positions (vectorised, O(block) after a per-pass set-up), and a fingerprint of everything that
shapes the order (its arrays and parameters), so a saved state is refused by a sampler whose
strategy would place other records.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from stateful_sampler.order.permutation import FeistelPermutation

PassOrder = Callable[[np.ndarray], np.ndarray]  # positions of one pass -> records (int64 arrays)


class Strategy(ABC):
    """The order of each pass over N records; subclasses are small frozen value objects."""

    name: ClassVar[str]
    passes_vary: bool = False  # pass lengths differ by pass (then ``carry`` is refused); may be per instance

    def check(self, size: int) -> None:
        """Raise ``ValueError`` naming the argument if this strategy cannot order N = ``size`` records."""
        return  # a default hook, not abstract: most strategies can order every N >= 0

    @abstractmethod
    def pass_length(self, size: int, pass_index: int) -> int:
        """How many positions pass ``pass_index`` has."""

    def known_passes(self) -> range:
        """Passes whose lengths are known up front: every later pass is as long as the last of them,
        so a sampler can refuse an impossible epoch at construction, not when it starts."""
        return range(1)

    @abstractmethod
    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        """The records at positions of one pass; set-up cost is paid here, once per pass."""

    def for_sampler(self, batch_size: int | None, world_size: int) -> Strategy:
        """This strategy as the sampler that orders with it uses it: a strategy that needs a value the
        sampler holds (the global batch) takes it here instead of asking the user twice."""
        return self

    def mismatch_hint(self) -> str:
        """Advice appended when a state of this strategy is refused for another size or fingerprint."""
        return ""

    def fingerprint(self) -> str:
        """A short hash of everything that shapes the order, for the saved state's identity; computed
        once (strategies are values, and a state is saved often)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = self.__dict__["_fingerprint"] = self._hash()
        return cached

    def _hash(self) -> str:
        digest = hashlib.blake2b(self.name.encode(), digest_size=8)
        for part in self._identity():
            if isinstance(part, np.ndarray):
                digest.update(str(part.dtype).encode() + repr(part.shape).encode())
                digest.update(np.ascontiguousarray(part).tobytes())
            else:
                digest.update(repr(part).encode())
            digest.update(b"|")
        return digest.hexdigest()

    def _identity(self) -> tuple[Any, ...]:
        return ()


class Uniform(Strategy):
    """A uniform shuffle of all N records each pass (``shuffle=False``: 0..N-1): the default.

    The sampler's ``order`` picks the permutation: ``"fast"`` is this Feistel bijection, ``"torch"``
    is torch's ``randperm`` (built in the torch glue, not here). The sampler's ``shuffle`` sets
    ``shuffle`` here, and the state's own ``shuffle`` field carries it, so the fingerprint does not.
    """

    name = "uniform"

    def __init__(self, shuffle: bool = True) -> None:
        self.shuffle = shuffle

    def __repr__(self) -> str:
        return "Uniform()" if self.shuffle else "Uniform(shuffle=False)"

    def pass_length(self, size: int, pass_index: int) -> int:
        return size

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        if not self.shuffle:
            return _identity_order
        return FeistelPermutation(size, seed, pass_index)


def _identity_order(positions: np.ndarray) -> np.ndarray:
    return positions


def id_array(name: str, values: Any) -> np.ndarray:
    """A 1-D array of non-negative integer ids (labels, groups, bands) from a list, a NumPy array or a
    1-D tensor, as int64; anything else is refused naming ``name``."""
    array = _one_dimensional(name, values)
    if array.dtype.kind not in "iu":
        if array.dtype.kind == "f" and array.size and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            array = array.astype(np.int64)
        elif array.size:
            raise TypeError(f"{name} must hold integer ids, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.size and int(array.min()) < 0:
        raise ValueError(f"{name} must hold non-negative ids, got {int(array.min())} at position {int(array.argmin())}")
    return array


def weight_array(name: str, values: Any) -> np.ndarray:
    """A 1-D array of finite, non-negative weights that are not all zero, as float64."""
    array = _one_dimensional(name, values)
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        raise ValueError(f"{name} must be finite and non-negative, got {array[bad[0]]} at position {int(bad[0])}")
    if not array.size or not array.any():
        raise ValueError(f"{name} must have a positive sum, got all zeros ({array.size} weights)")
    return array


def check_length(name: str, array: np.ndarray, size: int) -> None:
    """Per-record arrays must have one entry per record of the dataset."""
    if len(array) != size:
        raise ValueError(f"{name} must have one entry per record: length {size}, got {len(array)}")


def _one_dimensional(name: str, values: Any) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a list, a NumPy array or a 1-D tensor, got {type(values).__name__}")
    array = np.asarray(values)  # a CPU tensor converts without importing torch here
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    return array
