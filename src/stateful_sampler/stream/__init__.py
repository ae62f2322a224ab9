"""Streamed, sharded datasets: an exactly resumable shard-and-window shuffle with bounded memory and IO."""

from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.stream.dataset import ShardedStream
from stateful_sampler.stream.cache import CacheStats, ShardCache
from stateful_sampler.stream.readers import JsonlReader, ParquetReader, ReadStats, ShardReader, ShardReadError
from stateful_sampler.stream.state import StreamState

__all__ = [
    "CacheStats",
    "JsonlReader",
    "ParquetReader",
    "ReadStats",
    "ShardReadError",
    "ShardCache",
    "ShardReader",
    "ShardedShuffle",
    "ShardedStream",
    "StreamState",
]
