"""The stream behind a real DataLoader, reading real parquet shards: exact resume with 0 and 2
workers and a changed worker count, one window of at most k shards read at a time, and a missing
shard named without losing what was delivered."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from stateful_sampler.stream import ParquetReader, ShardedStream, ShardReadError
from tests.stream_helpers import MemoryReader

COUNTS = [23, 0, 17, 31, 9, 40, 12, 26, 5, 19]  # 182 records
BATCH = 8


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Parquet shards whose column ``id`` is the record's global index, in row groups of 6 rows."""
    root = tmp_path_factory.mktemp("shards")
    paths, first = [], 0
    for index, count in enumerate(COUNTS):
        ids = np.arange(first, first + count)
        table = pa.table({"id": ids, "label": ids % 10})
        path = root / f"part-{index:02d}.parquet"
        pq.write_table(table, path, row_group_size=6)
        paths.append(str(path))
        first += count
    return paths


def to_tensors(record: dict) -> tuple[torch.Tensor, int]:
    return torch.tensor(record["id"]), record["label"]


def stream(shards: list[str], **kwargs) -> ShardedStream:
    return ShardedStream(shards, ParquetReader(), batch_size=BATCH, window=3, seed=11, transform=to_tensors, **kwargs)


def run(data: ShardedStream, workers: int, epochs: range, stop_after: int | None = None) -> tuple[list, dict | None]:
    """A training loop: per epoch, the ids of each batch; stops (like a crash) after ``stop_after``
    batches, returning the state saved at that point."""
    seen: list[list[int]] = []
    loader = data.loader(num_workers=workers)
    for epoch in epochs:
        data.set_epoch(epoch)
        for consumed, (ids, _labels) in enumerate(loader, 1):
            seen.append(ids.tolist())
            if len(seen) == stop_after:
                return seen, data.state_dict(consumed_batches=consumed)
    return seen, None


def test_parquet_counts_come_from_the_footer_and_rows_from_row_groups(shards: list[str]) -> None:
    data = stream(shards)
    assert data.counts == COUNTS
    ids = sorted(int(record[0]) for record in data)
    assert ids == list(range(sum(COUNTS)))
    keyed = ShardedStream(shards, ParquetReader(), batch_size=BATCH, window=3, seed=11, yield_keys=True)
    assert all(record["id"] == key.index for record, key in keyed)  # the reader maps rows exactly


@pytest.mark.slow
def test_two_workers_deliver_the_batches_of_zero_workers(shards: list[str]) -> None:
    assert run(stream(shards), 2, range(2))[0] == run(stream(shards), 0, range(2))[0]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "resumed_workers"), [(0, 0), (2, 2), (2, 1), (0, 2)])
def test_a_run_stopped_mid_epoch_resumes_exactly_with_the_same_or_another_worker_count(
    shards: list[str], workers: int, resumed_workers: int
) -> None:
    uninterrupted, _ = run(stream(shards), workers, range(2))
    before, state = run(stream(shards), workers, range(2), stop_after=30)  # epoch 1, batch 7 of 23
    assert state is not None and (state["epoch"], state["position"]) == (1, 56)
    resumed = stream(shards)
    resumed.load_state_dict(state)
    after, _ = run(resumed, resumed_workers, range(resumed.epoch, 2))
    assert before + after == uninterrupted


class CountingParquet(ParquetReader):
    """Logs which shard each read opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def read(self, shard: str, start: int, stop: int) -> list[dict]:
        self.opened.append(shard)
        return super().read(shard, start, stop)


@pytest.mark.parametrize(
    ("window", "world_size", "workers", "spread"),
    [(1, 1, 1, 1), (3, 2, 2, 1), (4, 3, 2, 1), (1, 1, 1, 3), (2, 2, 2, 2)],
)
def test_a_reader_reads_each_shard_spread_times_per_epoch_one_group_of_k_times_spread_shards_at_a_time(
    shards: list[str], window: int, world_size: int, workers: int, spread: int
) -> None:
    for epoch in range(2):
        for rank in range(world_size):
            for worker in range(workers):
                reader = CountingParquet()
                data = ShardedStream(shards, reader, batch_size=4, window=window, counts=COUNTS, spread=spread,
                                     num_replicas=world_size, rank=rank, tail="drop")  # fmt: skip
                data.set_epoch(epoch)
                delivered = len(list(data.iter_worker(worker, workers)))
                windows = data.order.epoch(epoch)
                slot = {shards[s]: i for i, s in enumerate(windows.shard_order.tolist())}
                read_groups = [slot[name] // (window * spread) for name in reader.opened]
                assert max(Counter(reader.opened).values()) <= spread  # each shard at most once a window
                assert read_groups == sorted(read_groups)  # group after group, never back
                assert max(np.bincount(read_groups)) <= window * spread * spread  # its shards, once per window
                assert reader.stats.opened == len(reader.opened)
                assert reader.stats.rows >= delivered


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_missing_shard_is_named_and_the_batches_delivered_before_it_resume_exactly(
    shards: list[str], tmp_path: Path, workers: int
) -> None:
    copies = [shutil.copy(path, tmp_path) for path in shards]
    uninterrupted, _ = run(stream(copies, spread=1), 0, range(1))
    windows = stream(copies, spread=1).order.epoch(0)
    lost = copies[int(windows.window_shards(2)[0])]  # a shard of the third window (whole shards: read there first)
    data = stream(copies, spread=1)  # counted and identified before the file went missing
    os.rename(lost, lost + ".away")
    delivered: list[list[int]] = []
    with pytest.raises(ShardReadError, match=rf"could not open shard '{lost}'"):
        for ids, _labels in data.loader(num_workers=workers):
            delivered.append(ids.tolist())
    assert 0 < len(delivered) < len(uninterrupted)
    state = data.state_dict(consumed_batches=len(delivered))
    os.rename(lost + ".away", lost)
    resumed = stream(copies, spread=1)
    resumed.load_state_dict(state)
    assert delivered + run(resumed, workers, range(1))[0] == uninterrupted


def test_a_reader_that_fails_or_returns_too_few_rows_is_reported_naming_the_shard() -> None:
    class Broken(MemoryReader):
        def read(self, shard: str, start: int, stop: int) -> list:
            if shard == "shard-001":
                raise RuntimeError("disk on fire")
            return super().read(shard, start, stop)[:-1] if shard == "shard-002" else super().read(shard, start, stop)

    for counts, match in (
        ([4, 4], r"could not read rows \d\.\.\d of shard 'shard-001': disk on fire"),
        ([4, 0, 4], r"shard 'shard-002' returned \d records for rows \d\.\.3, expected \d: it holds fewer than the 4"),
    ):
        reader = Broken(counts)
        with pytest.raises(ShardReadError, match=match):
            list(ShardedStream(reader.names, reader, batch_size=2, window=1, seed=3, spread=1))
