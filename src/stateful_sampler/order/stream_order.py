"""A stream's epoch order as a ``Strategy``: what packing draws when it packs a stream.

Pass p of this strategy is epoch p of the stream's order: position i holds the index of the record the
stream delivers at epoch position i (a ``ShardedShuffle``: shards concatenated in the order given; a mixed
stream: its sources concatenated, a record drawn twice sitting at two positions). Row packing
(``order.rows``) takes any strategy's passes, so a stream's records are packed in exactly the stream's order.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.order.strategy import PassOrder, Strategy


class EpochRecords(Protocol):
    def records(self, positions: np.ndarray) -> np.ndarray:
        """The record indices at positions of one epoch."""


class EpochOrder(Protocol):
    """A stream's order, epoch by epoch (``ShardedShuffle`` is one)."""

    def epoch(self, epoch: int) -> EpochRecords:
        """Epoch ``epoch``'s order; its set-up cost is paid here, once per epoch."""


class StreamOrder(Strategy):
    """Every pass is ``shuffle``'s order at that epoch; ``source`` is the stream's own identity (its saved
    state at epoch 0), so the fingerprint changes with the stream's sources and settings.

    ``records`` (the record count the lengths give) and ``pass_length`` (positions an epoch) are
    ``shuffle.size`` for a ``ShardedShuffle``, where each record sits once an epoch; a mixed stream's epoch
    draws ``pass_length`` times from its ``records``.

    Example:
        >>> import numpy as np
        >>> order = StreamOrder(ShardedShuffle([3, 2], window=1, seed=0), source="demo")
        >>> sorted(order.pass_order(5, 0, 0)(np.arange(5)).tolist())
        [0, 1, 2, 3, 4]
    """

    name = "sharded-stream"

    def __init__(
        self, shuffle: EpochOrder, source: str, *, records: int | None = None, pass_length: int | None = None
    ) -> None:
        if isinstance(shuffle, ShardedShuffle):
            records = shuffle.size if records is None else records
            pass_length = shuffle.size if pass_length is None else pass_length
        if records is None or pass_length is None:
            raise TypeError("records and pass_length: give both for an order that is not a ShardedShuffle")
        self.shuffle = shuffle
        self.source = source
        self.records = records
        self.length = pass_length

    def __repr__(self) -> str:
        if isinstance(self.shuffle, ShardedShuffle):
            return f"StreamOrder(<{len(self.shuffle.counts)} shards>, window={self.shuffle.window})"
        return f"StreamOrder(<{self.records} records>, pass_length={self.length})"

    def check(self, size: int) -> None:
        if size != self.records:
            raise ValueError(f"lengths must give one length per record of the stream ({self.records}), got {size}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.length

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        return self.shuffle.epoch(pass_index).records

    def _identity(self) -> tuple[Any, ...]:
        if isinstance(self.shuffle, ShardedShuffle):  # the identity packed sharded streams have been saved with
            return (self.shuffle.counts, self.shuffle.window, self.shuffle.seed, self.source)
        return (self.records, self.length, self.source)
