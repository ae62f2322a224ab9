"""A stream's epoch order as a ``Strategy``: what packing draws when it packs a stream.

Pass p of this strategy is epoch p of the stream's order: position i holds the index of the record the
stream delivers at epoch position i (a ``ShardedShuffle``: shards concatenated in the order given; a mixed
stream: its sources concatenated, a record drawn twice sitting at two positions). Row packing
(``order.rows``) takes any strategy's passes, so a stream's records are packed in exactly the stream's order.

A mixed stream's order may change at a resume (``on_change="continue"``): it is a ``ChangingOrder``, whose
``state_at`` / ``resume_from`` this strategy passes on, so packed rows splice the new order in as they do
over a ``Mixture`` (``RowOrder.resume_from``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.order.strategy import PassOrder, SavedOrder, Strategy


class EpochRecords(Protocol):
    def records(self, positions: np.ndarray) -> np.ndarray:
        """The record indices at positions of one epoch."""


class EpochOrder(Protocol):
    """A stream's order, epoch by epoch (``ShardedShuffle`` is one)."""

    def epoch(self, epoch: int) -> EpochRecords:
        """Epoch ``epoch``'s order; its set-up cost is paid here, once per epoch."""


class ChangingOrder(EpochOrder, Protocol):
    """An order that a resume may continue under another order (a mixed stream's draws, its mixture changed)."""

    def identity(self) -> str:
        """What shapes the order now (a changed one's differs from the order it was built as)."""

    def state_at(self, epoch: int, position: int, kept_from: int | None) -> dict[str, Any] | None:
        """``Strategy.state_at``'s slot for this order at ``position`` of ``epoch``."""

    def resume_from(self, saved: SavedOrder) -> ChangingOrder | None:
        """``Strategy.resume_from``: the order continuing ``saved``, None when it is this order's own."""


class StreamOrder(Strategy):
    """Every pass is ``shuffle``'s order at that epoch; ``source`` is the stream's own identity (its saved
    state at epoch 0), so the fingerprint changes with the stream's sources and settings.

    ``records`` (the record count the lengths give) and ``pass_length`` (positions an epoch) are
    ``shuffle.size`` for a ``ShardedShuffle``, where each record sits once an epoch; a mixed stream's epoch
    draws ``pass_length`` times from its ``records``, and its order is a ``ChangingOrder``.

    Example:
        >>> import numpy as np
        >>> order = StreamOrder(ShardedShuffle([3, 2], window=1, seed=0), source="demo")
        >>> sorted(order.pass_order(5, 0, 0)(np.arange(5)).tolist())
        [0, 1, 2, 3, 4]
    """

    name = "sharded-stream"

    def __init__(
        self,
        shuffle: ShardedShuffle | ChangingOrder,
        source: str,
        *,
        records: int | None = None,
        pass_length: int | None = None,
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

    def state_at(self, pass_index: int, offset: int, kept_from: int | None = None) -> dict[str, Any] | None:
        if isinstance(self.shuffle, ShardedShuffle):
            return None  # a sharded stream's order never changes at a resume: its fingerprint says it all
        return self.shuffle.state_at(pass_index, offset, kept_from)

    def resume_from(self, saved: SavedOrder) -> StreamOrder | None:
        if isinstance(self.shuffle, ShardedShuffle) or saved.state is None:
            return None
        continued = self.shuffle.resume_from(saved)
        if continued is None:
            return None
        return StreamOrder(continued, self.source, records=self.records, pass_length=self.length)

    def _identity(self) -> tuple[Any, ...]:
        if isinstance(self.shuffle, ShardedShuffle):  # the identity packed sharded streams have been saved with
            return (self.shuffle.counts, self.shuffle.window, self.shuffle.seed, self.source)
        return (self.records, self.length, self.source, self.shuffle.identity())
