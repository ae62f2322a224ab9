"""Which record sits at each stream position: the ``fast`` bijection or torch's ``randperm``."""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum
from typing import Callable

import numpy as np
import torch

from stateful_sampler.order.permutation import FeistelPermutation

Permute = Callable[[np.ndarray], np.ndarray]

# order="torch" holds randperm(N) as int64, 8 bytes a record: 2**31 records is already 16 GiB.
MAX_TORCH_SIZE = 1 << 31


class Order(str, Enum):
    FAST = "fast"  # O(block) bijection, no O(N) array
    TORCH = "torch"  # exactly DistributedSampler's randperm(generator seeded with seed + epoch)


class StreamRecords:
    """Maps stream positions to records, pass by pass, keeping the last two passes' permutations
    (``carry`` reads across one pass boundary at a time)."""

    def __init__(self, order: Order, shuffle: bool, seed: int, size: int) -> None:
        self._order = order
        self._shuffle = shuffle
        self._seed = seed
        self._size = size
        self._cache: OrderedDict[int, Permute] = OrderedDict()

    def __call__(self, base_pass: int, offsets: np.ndarray) -> np.ndarray:
        """Records at stream positions ``base_pass * N + offsets`` (offsets may be negative or pass
        N: carry reads across pass boundaries); the absolute position is never formed, so it may
        exceed int64."""
        if not self._shuffle or offsets.size == 0:
            return offsets % max(self._size, 1)
        first = int(offsets.min()) // self._size
        last = int(offsets.max()) // self._size
        if first == last:
            # The usual block lies inside one pass: a subtraction instead of a per-element divmod.
            local = offsets - first * self._size if first else offsets
            return self._permutation(base_pass + first)(local)
        passes, local = np.divmod(offsets, self._size)
        records = np.empty_like(local)
        for relative_pass in range(first, last + 1):
            in_pass = passes == relative_pass
            records[in_pass] = self._permutation(base_pass + relative_pass)(local[in_pass])
        return records

    def _permutation(self, pass_index: int) -> Permute:
        permute = self._cache.get(pass_index)
        if permute is None:
            permute = self._build(pass_index)
            self._cache[pass_index] = permute
            if len(self._cache) > 2:
                self._cache.popitem(last=False)
        return permute

    def _build(self, pass_index: int) -> Permute:
        if self._order is Order.FAST:
            return FeistelPermutation(self._size, self._seed, pass_index)
        generator = torch.Generator()
        generator.manual_seed(self._seed + pass_index)
        table = torch.randperm(self._size, generator=generator).numpy()
        return table.__getitem__
