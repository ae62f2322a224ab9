"""Streamed, sharded datasets: an exactly resumable shard-and-window shuffle with bounded memory and IO."""

from stateful_sampler.errors import StreamSetupError
from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.seeding.stream_transform import KeyedTransform, SeededTransform
from stateful_sampler.stream.arrow import ArrowReader, saved_dataset_shards
from stateful_sampler.stream.cache import CacheStats, ShardCache
from stateful_sampler.stream.dataset import ShardedStream, StreamLoader
from stateful_sampler.stream.litdata import LitDataReader
from stateful_sampler.stream.mds import MDSReader
from stateful_sampler.stream.mixed import MixedStream
from stateful_sampler.stream.packed import PackedStream
from stateful_sampler.stream.readers import JsonlReader, ParquetReader, ReadStats, ShardReader, ShardReadError
from stateful_sampler.stream.state import StreamState
from stateful_sampler.stream.tar import TarReader

__all__ = [
    "ArrowReader",
    "CacheStats",
    "JsonlReader",
    "KeyedTransform",
    "LitDataReader",
    "MDSReader",
    "MixedStream",
    "PackedStream",
    "ParquetReader",
    "ReadStats",
    "SeededTransform",
    "ShardCache",
    "ShardReadError",
    "ShardReader",
    "ShardedShuffle",
    "ShardedStream",
    "StreamLoader",
    "StreamSetupError",
    "StreamState",
    "TarReader",
    "saved_dataset_shards",
]
