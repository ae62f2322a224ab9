"""Chunked delivery: a worker reads each shard of a window once, then builds the window's records a
batch at a time (``read_span``), so the first batch converts one batch's records, not the window's.
The records, their order and their keys are those of a reader that builds every record at read time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.stream import JsonlReader, ParquetReader, ShardCache, ShardedStream, ShardReadError
from stateful_sampler.stream.readers import ParquetSpan, fixed_size_lists, span_reader
from tests.stream.test_stream_remote import write_jsonl, write_parquet
from tests.stream_helpers import MemoryReader, loop_batches

ROWS = 24  # per shard, row groups of 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("shards")
    return [write_parquet(root / f"{i}.parquet", list(range(i * ROWS, (i + 1) * ROWS))) for i in range(6)]


class EagerParquet(ParquetReader):
    """A subclass with its own ``read``: the stream must call it, not ``read_span``."""

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        return super().read(shard, start, stop)


class LazyRows(Sequence[Any]):
    """Records built when indexed, counted; ``records_at`` only when ``bulk``."""

    def __init__(self, shard: str, start: int, stop: int, built: list[int]) -> None:
        self.shard, self.start, self.stop, self.built = shard, start, stop, built

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, row: Any) -> Any:
        if not 0 <= row < len(self):
            raise IndexError(row)
        self.built[0] += 1
        return (self.shard, self.start + row)


class BulkRows(LazyRows):
    def records_at(self, rows: Sequence[int]) -> list[Any]:
        return [self[int(row)] for row in rows]


class LazyMemoryReader(MemoryReader):
    """``MemoryReader``'s records, from ``read_span`` as a sequence that builds them when taken."""

    def __init__(self, counts: Sequence[int], bulk: bool = False) -> None:
        super().__init__(counts)
        self.built = [0]
        self.bulk = bulk

    def read_span(self, shard: str, start: int, stop: int) -> LazyRows:
        self.reads.append((shard, start, stop))
        return (BulkRows if self.bulk else LazyRows)(shard, start, stop, self.built)


def parquet_stream(shards: list[str], reader: Any, **kwargs: Any) -> ShardedStream:
    return ShardedStream(
        shards, reader, counts=[ROWS] * len(shards), **{"batch_size": 4, "window": 3, "spread": 1, **kwargs}
    )


def test_the_first_batch_converts_one_batch_and_decodes_the_window_once(shards: list[str]) -> None:
    reader = ParquetReader()
    stream = parquet_stream(shards, reader)
    first = list(islice(stream.iter_worker(0, 1), 4))
    assert len(first) == 4
    assert reader.stats.converted == 4  # one batch built, of the window's 72 records
    assert reader.stats.opened == 3 and reader.stats.rows == 3 * ROWS  # each shard of the window read once


def test_a_loaders_first_batch_converts_one_batch(shards: list[str]) -> None:
    reader = ParquetReader()
    stream = parquet_stream(shards, reader, batch_size=5)
    state = parquet_stream(shards, ParquetReader(), batch_size=5).state_dict(consumed_batches=9)
    stream.load_state_dict(state)
    batch = next(iter(stream.loader(num_workers=0)))
    assert len(batch["x"]) == 5 and reader.stats.converted == 5


def test_an_epoch_converts_each_delivered_record_once_padding_included(shards: list[str]) -> None:
    for world_size, tail in ((1, "pad"), (5, "pad"), (5, "drop")):
        reader = ParquetReader()
        stream = parquet_stream(shards, reader, num_replicas=world_size, rank=world_size - 1, tail=tail)
        delivered = sum(1 for _ in stream.iter_worker(0, 1))
        assert reader.stats.converted == delivered


@settings(max_examples=40, deadline=None)
@given(
    world_size=st.integers(1, 3),
    workers=st.integers(1, 3),
    batch_size=st.integers(1, 40),
    window=st.integers(1, 4),
    epoch=st.integers(0, 3),
    consumed=st.integers(0, 30),
    tail=st.sampled_from(["pad", "drop"]),
)
def test_chunked_delivery_yields_the_records_and_keys_of_eager_reads(
    shards: list[str], world_size: int, workers: int, batch_size: int, window: int, epoch: int, consumed: int, tail: str
) -> None:
    def batches(reader: Any, rank: int) -> list[list[Any]]:
        stream = parquet_stream(shards, reader, batch_size=batch_size, window=window, num_replicas=world_size,
                                rank=rank, tail=tail, seed=7, yield_keys=True)  # fmt: skip
        stream.set_epoch(epoch)
        start = stream.state_dict(consumed_batches=min(consumed, -(-stream.remaining_length() // batch_size)))
        stream.load_state_dict(start)  # resumed mid-epoch: the first window is entered part way
        return loop_batches(stream, workers)

    for rank in range(world_size):
        chunked = batches(ParquetReader(), rank)
        assert chunked == batches(EagerParquet(), rank)
        # Shard i holds x = i*ROWS .. (i+1)*ROWS - 1: each record is the one its key (from the slot) names.
        assert all(record["x"] == key.index for batch in chunked for record, key in batch)


@pytest.mark.parametrize("bulk", [False, True])
def test_a_readers_own_lazy_span_is_read_once_and_built_a_batch_at_a_time(bulk: bool) -> None:
    lazy, eager = LazyMemoryReader([7, 9, 5, 8], bulk), MemoryReader([7, 9, 5, 8])
    stream = ShardedStream(lazy.names, lazy, batch_size=3, window=2, seed=1, spread=1)
    assert list(islice(stream.iter_worker(0, 1), 3)) == list(islice(
        ShardedStream(eager.names, eager, batch_size=3, window=2, seed=1, spread=1).iter_worker(0, 1), 3))  # fmt: skip
    assert lazy.built[0] == 3 and len(lazy.reads) == 2  # the window's two shards, one read each
    keyed = ShardedStream(lazy.names, lazy, batch_size=3, window=2, seed=1, spread=1, yield_keys=True)
    pairs = list(keyed.iter_worker(0, 1))
    assert [record for record, _ in pairs] == list(
        ShardedStream(eager.names, eager, batch_size=3, window=2, seed=1, spread=1).iter_worker(0, 1)
    )
    assert [keyed.order.offsets[lazy.names.index(shard)] + row for (shard, row), _ in pairs] == [
        key.index for _, key in pairs
    ]


def test_a_subclass_that_overrides_read_is_read_through_its_read(shards: list[str]) -> None:
    class Doubled(ParquetReader):
        def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
            return [{"x": 2 * record["x"]} for record in super().read(shard, start, stop)]

    reader = Doubled()
    assert span_reader(reader) == reader.read
    assert span_reader(ParquetReader()).__name__ == "read_span"
    patched = ParquetReader()
    patched.read = lambda shard, start, stop: []  # type: ignore[method-assign]
    assert span_reader(patched) is patched.read  # a read set on the instance wins too
    memory = MemoryReader([3])
    memory.read_span = memory.read  # type: ignore[attr-defined]
    assert span_reader(memory) is memory.read_span  # type: ignore[attr-defined]
    through_cache = ShardCache(Doubled(), Path(shards[0]).parent / "cache", max_bytes=1 << 30)
    plain = sorted(record["x"] for record in parquet_stream(shards, ParquetReader()))
    assert sorted(record["x"] for record in parquet_stream(shards, reader)) == [2 * x for x in plain]
    assert sorted(record["x"] for record in parquet_stream(shards, through_cache)) == [2 * x for x in plain]


def test_the_cache_reads_spans_through_the_inner_reader(shards: list[str], tmp_path: Path) -> None:
    inner = ParquetReader()
    cache = ShardCache(inner, tmp_path / "cache", max_bytes=1 << 30)
    assert isinstance(cache.read_span(shards[0], 2, 6), ParquetSpan) and inner.stats.converted == 0
    assert cache.read_span(shards[0], 2, 6)[1] == {"x": 3}
    eager = ShardCache(EagerParquet(), tmp_path / "cache", max_bytes=1 << 30)
    assert eager.read_span(shards[0], 2, 6) == [{"x": x} for x in range(2, 6)]  # its own read, a list


def test_a_window_is_pinned_before_its_reads_and_the_next_pin_is_written_behind_them(
    shards: list[str], tmp_path: Path
) -> None:
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 30)
    stream = parquet_stream(shards, cache, window=2)
    windows = stream.order.epoch(0)
    keys = [sorted(cache._key(shards[s])[0] for s in windows.window_shards(w).tolist()) for w in range(3)]
    records = stream.iter_worker(0, 1)
    next(records)  # in window 0: its pin was written before its first read
    pins = list((tmp_path / "cache" / "pins").glob("*.json"))
    assert len(pins) == 1 and sorted(json.loads(pins[0].read_text())) == sorted(keys[0] + keys[1])
    list(islice(records, 2 * ROWS))  # into window 1, pinned by window 0's pin as its next window
    cache.wait()
    assert sorted(json.loads(pins[0].read_text())) == sorted(keys[1] + keys[2])
    transfers = cache.stats().transfers
    assert list(records) and cache.stats().transfers == transfers  # all here: nothing fetched again


def test_a_span_indexes_like_the_list_read_returns(shards: list[str]) -> None:
    span, listed = ParquetReader().read_span(shards[1], 3, 11), ParquetReader().read(shards[1], 3, 11)
    assert len(span) == len(listed) == 8
    assert [span[i] for i in range(-8, 8)] == listed + listed
    assert span[2:7:2] == listed[2:7:2] and list(span) == listed and span.records_at([]) == []
    with pytest.raises(IndexError, match="row 8 is outside this span of 8 rows"):
        span[8]


def test_a_span_that_fails_to_build_its_records_names_the_shard_and_rows() -> None:
    class Failing(BulkRows):
        def records_at(self, rows: Sequence[int]) -> list[Any]:
            raise RuntimeError("bad column")

    class Reader(LazyMemoryReader):
        def read_span(self, shard: str, start: int, stop: int) -> LazyRows:
            return Failing(shard, start, stop, self.built)

    reader = Reader([4])
    with pytest.raises(ShardReadError, match=r"could not build the records of rows [0-3]\.\.[0-3] of shard 'shard-000': "
                                             r"bad column"):  # fmt: skip
        list(ShardedStream(reader.names, reader, batch_size=2, window=1))


def test_a_span_that_builds_too_few_records_is_refused_naming_the_shard() -> None:
    class Short(BulkRows):
        def records_at(self, rows: Sequence[int]) -> list[Any]:
            return super().records_at(rows)[:-1]

    class Reader(LazyMemoryReader):
        def read_span(self, shard: str, start: int, stop: int) -> LazyRows:
            return Short(shard, start, stop, self.built)

    for counts in ([4], [4, 4]):  # one shard in the window, and two
        reader = Reader(counts)
        with pytest.raises(ShardReadError, match=r"Short.records_at returned \d records for \d of rows \d\.\.\d of "
                                                 r"shard 'shard-00\d'"):  # fmt: skip
            list(ShardedStream(reader.names, reader, batch_size=2, window=len(counts)))


def test_a_read_span_returning_a_generator_is_refused_naming_the_method_shard_and_rows() -> None:
    class Generating(MemoryReader):
        def read_span(self, shard: str, start: int, stop: int):  # type: ignore[no-untyped-def]
            return (record for record in self.read(shard, start, stop))

    reader = Generating([4])
    with pytest.raises(TypeError, match=r"Generating.read_span\('shard-000', 0, 4\) returned a generator, not a "
                                        r"sequence: read_span must return the 4 records of rows 0..3"):  # fmt: skip
        list(ShardedStream(reader.names, reader, batch_size=2, window=1, spread=1))


def test_jsonl_counts_the_records_it_converts(tmp_path: Path) -> None:
    reader = JsonlReader()
    assert reader.read(write_jsonl(tmp_path / "a.jsonl", list(range(9))), 2, 7) == [{"x": x} for x in range(2, 7)]
    assert reader.stats.converted == 5


def test_a_windows_parquet_spans_are_joined_and_taken_from_in_one_call_per_chunk(shards: list[str]) -> None:
    calls: list[int] = []

    class Counting(ParquetSpan):
        def records_at(self, rows: Sequence[int]) -> list[dict[str, Any]]:
            calls.append(len(rows))
            return super().records_at(rows)

    class Reader(ParquetReader):
        def read_span(self, shard: str, start: int, stop: int) -> ParquetSpan:
            return Counting(super().read_span(shard, start, stop).table, self.stats)

    stream = parquet_stream(shards, Reader(), batch_size=4, window=3)
    records = [record["x"] for record in stream.iter_worker(0, 1)]
    assert records == [record["x"] for record in parquet_stream(shards, EagerParquet(), window=3).iter_worker(0, 1)]
    # Two windows of 3 shards (72 records each): chunks of 4, 8, 16, 32 and the last 12, one call each.
    assert calls == [4, 8, 16, 32, 12] * 2


def test_shards_of_other_schemas_are_gathered_shard_by_shard(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for i in range(4):  # odd shards carry an extra column: their spans do not join
        columns = {"x": list(range(i * ROWS, (i + 1) * ROWS))} | ({"y": [0.5] * ROWS} if i % 2 else {})
        paths.append(str(tmp_path / f"{i}.parquet"))
        pq.write_table(pa.table(columns), paths[-1], row_group_size=4)
    stream = parquet_stream(paths, ParquetReader(), window=2, yield_keys=True)
    delivered = list(stream.iter_worker(0, 1))
    assert sorted(record["x"] for record, _ in delivered) == list(range(4 * ROWS))
    assert all(record["x"] == key.index for record, key in delivered)
    assert [record["x"] for record, _ in delivered] == [
        record["x"] for record, _ in parquet_stream(paths, EagerParquet(), window=2, yield_keys=True).iter_worker(0, 1)
    ]


LISTS = st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=0, max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 6).flatmap(lambda n: st.lists(st.tuples(LISTS, st.none() | LISTS, st.lists(LISTS, max_size=2)),
                                                      min_size=n, max_size=n)),
    same_length=st.booleans(), data=st.data(),
)  # fmt: skip
def test_list_columns_of_one_length_are_taken_as_fixed_size_lists_with_the_same_records(
    rows: list[tuple[list[int | None], list[int | None] | None, list[list[int | None]]]],
    same_length: bool,
    data: st.DataObject,
) -> None:
    import pyarrow as pa

    if same_length and rows:  # every row's first column as long as the first row's: the column is cast
        rows = [((a + [0] * len(rows[0][0]))[: len(rows[0][0])], b, c) for a, b, c in rows]
    table = pa.table({"a": pa.array([r[0] for r in rows], pa.list_(pa.int64())),
                      "b": pa.array([r[1] for r in rows], pa.large_list(pa.int64())),
                      "c": pa.array([r[2] for r in rows], pa.list_(pa.list_(pa.int64())))})  # fmt: skip
    fixed = fixed_size_lists(table)
    order = pa.array(data.draw(st.permutations(range(len(rows)))), pa.int64())
    assert fixed.take(order).to_pylist() == table.take(order).to_pylist()
    assert fixed.to_pylist() == table.to_pylist() and fixed.schema.names == table.schema.names
    if same_length and rows:
        assert fixed.schema.field("a").type == pa.list_(pa.int64(), len(rows[0][0]))


def test_a_list_column_of_mixed_lengths_or_nulls_stays_as_it_is() -> None:
    import pyarrow as pa

    table = pa.table({"mixed": [[1], [2, 3]], "null": [[1, 2], None], "same": [[1, 2], [3, 4]]})
    fixed = fixed_size_lists(table)
    assert fixed.schema.field("mixed").type == table.schema.field("mixed").type
    assert fixed.schema.field("null").type == table.schema.field("null").type
    assert fixed.schema.field("same").type == pa.list_(pa.int64(), 2)


def test_a_stream_of_embeddings_delivers_the_records_of_eager_reads(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for i in range(4):  # shard 2's vectors are not all one length: its window is joined and not cast
        ids = list(range(i * ROWS, (i + 1) * ROWS))
        vectors = [[float(x)] * (3 if i != 2 or x % 5 else 2) for x in ids]
        paths.append(str(tmp_path / f"{i}.parquet"))
        pq.write_table(pa.table({"x": ids, "v": vectors}), paths[-1], row_group_size=4)
    for window in (1, 2, 4):
        delivered = list(parquet_stream(paths, ParquetReader(), window=window).iter_worker(0, 1))
        assert delivered == list(parquet_stream(paths, EagerParquet(), window=window).iter_worker(0, 1))
        assert sorted(record["x"] for record in delivered) == list(range(4 * ROWS))
        assert all(record["v"] == [float(record["x"])] * len(record["v"]) for record in delivered)
