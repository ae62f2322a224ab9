"""Shared drivers for the stream tests: an in-memory reader that logs its reads, and a loop that
takes a rank's batches from its workers in DataLoader's order without starting processes."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Any

import torch

from stateful_sampler.stream import ShardedStream


class MemoryReader:
    """Shard ``name`` holds records ``(name, row)``; every read is logged as (shard, start, stop)."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.sizes = {f"shard-{i:03d}": count for i, count in enumerate(counts)}
        self.reads: list[tuple[str, int, int]] = []

    @property
    def names(self) -> list[str]:
        return list(self.sizes)

    def count(self, shard: str) -> int:
        return self.sizes[shard]

    def read(self, shard: str, start: int, stop: int) -> list[tuple[str, int]]:
        self.reads.append((shard, start, stop))
        return [(shard, row) for row in range(start, min(stop, self.sizes[shard]))]


def make_stream(counts: Sequence[int], **kwargs: Any) -> ShardedStream:
    reader = MemoryReader(counts)
    return ShardedStream(reader.names, reader, **kwargs)


def loop_batches(stream: ShardedStream, workers: int, limit: int | None = None) -> list[list[Any]]:
    """The batches a ``DataLoader(stream, batch_size=stream.batch_size, num_workers=workers)`` hands
    the loop: one batch from each worker in turn, skipping exhausted workers (in-order delivery)."""
    streams = [stream.iter_worker(worker, max(workers, 1)) for worker in range(max(workers, 1))]
    batches: list[list[Any]] = []
    live = list(range(len(streams)))
    turn = 0
    while live and (limit is None or len(batches) < limit):
        worker = live[turn % len(live)]
        batch = list(islice(streams[worker], stream.batch_size))
        if batch:
            batches.append(batch)
            turn += 1
        else:
            live.remove(worker)
    return batches


class Rows:
    """Shard i holds records 100*i + row, ``counts[i]`` of them: what the subprocess runs stream. Kept
    here, where a DataLoader worker unpickles it without importing Lightning."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = list(counts)

    def count(self, shard: str) -> int:
        return self.counts[int(shard)]

    def read(self, shard: str, start: int, stop: int) -> list[int]:
        return [100 * int(shard) + row for row in range(start, stop)]

    def identity(self, shard: str) -> str:
        return f"v1-{shard}"


def as_tensor(record: int) -> torch.Tensor:
    return torch.tensor([float(record)])
