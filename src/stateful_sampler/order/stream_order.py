"""A sharded stream's epoch order as a ``Strategy``: what packing draws when it packs a stream.

Pass p of this strategy is epoch p of a ``ShardedShuffle``: position i holds the global record index (shards
concatenated in the order given) that the stream delivers at epoch position i. Row packing (``order.rows``)
takes any strategy's passes, so a stream's records are packed in exactly the stream's epoch order.
"""

from __future__ import annotations

from typing import Any

from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.order.strategy import PassOrder, Strategy


class StreamOrder(Strategy):
    """Every pass is the shard-and-window order of ``shuffle`` at that epoch; ``source`` is the stream's own
    identity (its saved order field), so the fingerprint changes with the stream's shards and settings.

    Example:
        >>> import numpy as np
        >>> order = StreamOrder(ShardedShuffle([3, 2], window=1, seed=0), source="demo")
        >>> sorted(order.pass_order(5, 0, 0)(np.arange(5)).tolist())
        [0, 1, 2, 3, 4]
    """

    name = "sharded-stream"

    def __init__(self, shuffle: ShardedShuffle, source: str) -> None:
        self.shuffle = shuffle
        self.source = source

    def __repr__(self) -> str:
        return f"StreamOrder(<{len(self.shuffle.counts)} shards>, window={self.shuffle.window})"

    def check(self, size: int) -> None:
        if size != self.shuffle.size:
            raise ValueError(f"lengths must give one length per record of the stream ({self.shuffle.size}), got {size}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.shuffle.size

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        return self.shuffle.epoch(pass_index).records

    def _identity(self) -> tuple[Any, ...]:
        return (self.shuffle.counts, self.shuffle.window, self.shuffle.seed, self.source)
