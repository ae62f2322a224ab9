"""Streamed, sharded datasets: an exactly resumable shard-and-window shuffle with bounded memory and IO."""

from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.stream.dataset import ShardedStream
from stateful_sampler.stream.readers import ParquetReader, ReadStats, ShardReader, ShardReadError
from stateful_sampler.stream.state import StreamState

__all__ = [
    "ParquetReader",
    "ReadStats",
    "ShardReadError",
    "ShardReader",
    "ShardedShuffle",
    "ShardedStream",
    "StreamState",
]
