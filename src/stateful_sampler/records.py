"""Which record sits at each stream position: a strategy's pass orders, or torch's ``randperm``.

A stream position is a place in the passes laid end to end (``order/layout.py``: pass p holds positions
[p*N, (p+1)*N)), which ``carry`` reads across; ``PassRecords`` answers for it pass by pass.

The only torch here is ``order="torch"``: the uniform strategy's exact ``DistributedSampler``
sequence. Everything else comes from the pure strategies in ``order/``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from stateful_sampler.order.policies import Order
from stateful_sampler.order.strategy import PassOrder, Strategy, Uniform

# order="torch" holds randperm(N) as int64, 8 bytes a record: 2**31 records is already 16 GiB.
MAX_TORCH_SIZE = 1 << 31


class PassRecords:
    """Maps stream positions to records, pass by pass, keeping the last two passes' orders (``carry``
    reads across one pass boundary at a time, and a pass's set-up is paid once)."""

    def __init__(self, strategy: Strategy, order: Order, seed: int, size: int) -> None:
        self._strategy = strategy
        self._torch = order is Order.TORCH and isinstance(strategy, Uniform) and strategy.shuffle
        self._seed = seed
        self._size = size
        self._cache: OrderedDict[int, PassOrder] = OrderedDict()

    def pass_length(self, pass_index: int) -> int:
        return self._strategy.pass_length(self._size, pass_index)

    def _within_floor(self, base_pass: int, low: int, high: int) -> bool:
        """Whether offsets from ``low`` to ``high`` lie in pass ``base_pass`` below the floor of a length still
        being counted (``Strategy.counting_floor``): such a pass answers for its first positions without it."""
        floor = self._strategy.counting_floor(self._size, base_pass)
        return floor is not None and low >= 0 and high < floor

    def counting_floor(self, pass_index: int) -> int | None:
        return self._strategy.counting_floor(self._size, pass_index)

    def __call__(self, base_pass: int, offsets: np.ndarray) -> np.ndarray:
        """Records at stream positions ``offsets`` counted from the start of pass ``base_pass`` (negative
        or past its end: carry reads across pass boundaries, whose passes all have one length); the
        absolute position is never formed, so it may exceed int64."""
        if offsets.size == 0:
            return offsets
        low, high = int(offsets.min()), int(offsets.max())
        if self._within_floor(base_pass, low, high):
            return self._pass_order(base_pass)(offsets)
        length = self.pass_length(base_pass)
        first = low // length
        last = high // length
        if first == last:
            # The usual block lies inside one pass: a subtraction instead of a per-element divmod.
            local = offsets - first * length if first else offsets
            return self._pass_order(base_pass + first)(local)
        passes, local = np.divmod(offsets, length)
        records = np.empty_like(local)
        for relative_pass in range(first, last + 1):
            in_pass = passes == relative_pass
            records[in_pass] = self._pass_order(base_pass + relative_pass)(local[in_pass])
        return records

    def repeats(self, base_pass: int, offsets: np.ndarray) -> np.ndarray:
        """Which stream positions repeat a record within its pass only to even out the ranks (a
        strategy's pass order says so through an optional ``repeats(positions)``)."""
        marked = np.zeros(offsets.shape, dtype=bool)
        if offsets.size == 0:
            return marked
        if self._within_floor(base_pass, int(offsets.min()), int(offsets.max())):
            repeats = getattr(self._pass_order(base_pass), "repeats", None)
            return repeats(offsets) if repeats is not None else marked
        length = self.pass_length(base_pass)
        if length:
            first, last = int(offsets.min()) // length, int(offsets.max()) // length
            repeats = getattr(self._pass_order(base_pass + first), "repeats", None)
            if first == last:  # the usual block lies inside one pass: no per-element divmod
                return repeats(offsets - first * length if first else offsets) if repeats is not None else marked
        passes, local = np.divmod(offsets, length) if length else (np.zeros_like(offsets), offsets)
        for relative_pass in range(int(passes.min()), int(passes.max()) + 1):  # np.unique would import numpy.ma
            repeats = getattr(self._pass_order(base_pass + relative_pass), "repeats", None)
            in_pass = passes == relative_pass
            if repeats is not None and in_pass.any():
                marked[in_pass] = repeats(local[in_pass])
        return marked

    def marks_repeats(self, base_pass: int) -> bool:
        """Whether the strategy's pass orders mark repeats at all (``repeats`` is then worth its arrays): a
        property of the strategy, so one pass's order answers for all."""
        return getattr(self._pass_order(base_pass), "repeats", None) is not None

    def _pass_order(self, pass_index: int) -> PassOrder:
        order = self._cache.get(pass_index)
        if order is None:
            order = self._build(pass_index)
            self._cache[pass_index] = order
            if len(self._cache) > 2:
                self._cache.popitem(last=False)
        return order

    def _build(self, pass_index: int) -> PassOrder:
        if not self._torch:
            return self._strategy.pass_order(self._size, self._seed, pass_index)
        generator = torch.Generator()
        generator.manual_seed(self._seed + pass_index)
        return torch.randperm(self._size, generator=generator).numpy().__getitem__
