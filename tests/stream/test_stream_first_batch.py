"""The first batch after a resume reads its own records (``read_rows``: parquet's row groups they lie in),
not its window's shards, and is the batch the uninterrupted run delivers there."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.stream import ParquetReader, ShardedStream, ShardReadError
from tests.stream.test_stream_remote import write_parquet

ROWS, GROUP, SHARDS = 64, 4, 6  # per shard, rows per row group


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("first")
    return [write_parquet(root / f"{i}.parquet", list(range(i * ROWS, (i + 1) * ROWS)), GROUP) for i in range(SHARDS)]


def stream_of(shards: list[str], reader: ParquetReader, **kwargs: object) -> ShardedStream:
    return ShardedStream(shards, reader, counts=[ROWS] * len(shards), **{"batch_size": 5, "window": 3, **kwargs})


def batches(stream: ShardedStream, workers: int = 0) -> list[list[int]]:
    return [batch["x"].tolist() for batch in stream.loader(num_workers=workers)]


def test_a_resumes_first_batch_decodes_only_the_row_groups_of_its_records(shards: list[str]) -> None:
    uninterrupted = batches(stream_of(shards, ParquetReader()))
    reader = ParquetReader()
    resumed = stream_of(shards, reader)
    resumed.load_state_dict(stream_of(shards, ParquetReader()).state_dict(consumed_batches=7))
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    assert first == uninterrupted[7]
    assert reader.stats.converted == 5
    groups = {(record // ROWS, record % ROWS // GROUP) for record in first}
    assert reader.stats.rows == GROUP * len(groups)  # the window would be 3 * ROWS = 192 rows
    assert reader.stats.opened == len({record // ROWS for record in first})


def test_a_first_batch_across_two_windows_reads_only_its_records(shards: list[str]) -> None:
    reader = ParquetReader()
    resumed = stream_of(shards, reader, batch_size=8)
    window_end = int(resumed.order.epoch(0).window_starts[1])
    resumed.load_state_dict(resumed.state_dict(consumed_batches=0) | {"position": window_end - 3})
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    expected = [record for batch in batches(stream_of(shards, ParquetReader(), batch_size=1)) for record in batch]
    assert first == expected[window_end - 3 : window_end + 5]
    assert reader.stats.rows <= GROUP * 8 and reader.stats.converted == 8


def test_a_first_batch_across_two_windows_opens_each_shard_once(shards: list[str]) -> None:
    reader = ParquetReader()
    resumed = stream_of(shards, reader, batch_size=12)
    windows = resumed.order.epoch(0)
    window_end = int(windows.window_starts[1])
    before = set(windows.locate(np.arange(window_end - 6, window_end))[0].tolist())
    after = set(windows.locate(np.arange(window_end, window_end + 6))[0].tolist())
    assert before & after  # shards both windows' shares of the batch draw from: a read per window reads them twice
    resumed.load_state_dict(resumed.state_dict(consumed_batches=0) | {"position": window_end - 6})
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    expected = [record for batch in batches(stream_of(shards, ParquetReader(), batch_size=1)) for record in batch]
    assert first == expected[window_end - 6 : window_end + 6]
    assert reader.stats.opened == len(before | after) and reader.stats.converted == 12


@settings(max_examples=30, deadline=None)
@given(consumed=st.integers(0, 75), batch_size=st.integers(1, 13))
def test_resumed_epochs_are_the_uninterrupted_epochs(shards: list[str], consumed: int, batch_size: int) -> None:
    uninterrupted = [r for b in batches(stream_of(shards, ParquetReader(), batch_size=batch_size)) for r in b]
    consumed = min(consumed, len(uninterrupted) // batch_size)
    resumed = stream_of(shards, ParquetReader(), batch_size=batch_size)
    resumed.load_state_dict(stream_of(shards, ParquetReader(), batch_size=batch_size).state_dict(consumed))
    assert [r for b in batches(resumed) for r in b] == uninterrupted[consumed * batch_size :]


@pytest.mark.slow
def test_a_resume_at_two_workers_is_the_uninterrupted_epoch(shards: list[str]) -> None:
    uninterrupted = batches(stream_of(shards, ParquetReader()))
    resumed = stream_of(shards, ParquetReader())
    resumed.load_state_dict(stream_of(shards, ParquetReader()).state_dict(consumed_batches=11))
    assert batches(resumed, workers=2) == uninterrupted[11:]


def test_read_rows_gives_the_records_at_the_rows_in_their_order(shards: list[str]) -> None:
    reader = ParquetReader()
    rows = [17, 3, 63, 16, 3]
    assert reader.read_rows(shards[1], rows) == [{"x": ROWS + row} for row in rows]
    assert reader.stats.rows == 3 * GROUP  # row groups 4, 0 and 15: rows 17 and 16 share one


def test_a_shard_that_shrank_is_named_at_the_first_batch(tmp_path: Path, shards: list[str]) -> None:
    short = write_parquet(tmp_path / "short.parquet", list(range(ROWS)), GROUP)
    reader = ParquetReader()
    stream = ShardedStream([short, *shards[1:]], reader, counts=[ROWS] * SHARDS, batch_size=64, window=SHARDS)
    write_parquet(Path(short), list(range(10)), GROUP)  # rewritten after the stream counted it
    with pytest.raises(ShardReadError, match=r"short\.parquet.* holds 10 records"):
        reader.read_rows(short, [2, 40])
    stream.load_state_dict(stream.state_dict() | {"position": 1})
    with pytest.raises(ShardReadError, match=r"short\.parquet"):
        next(iter(stream.loader(num_workers=0)))


class LoggedRows(ParquetReader):
    """A ``read_rows`` of the user's own: the first batch reads through it, not through ``read_rows_span``."""

    def read_rows(self, shard: str, rows: object) -> list[dict[str, object]]:
        self.asked.append(shard)
        return super().read_rows(shard, rows)  # type: ignore[arg-type]


def test_a_read_rows_of_your_own_is_what_the_first_batch_reads(shards: list[str]) -> None:
    uninterrupted = batches(stream_of(shards, ParquetReader()))
    reader = LoggedRows()
    reader.asked = []  # type: ignore[attr-defined]
    resumed = stream_of(shards, reader)
    resumed.load_state_dict(resumed.state_dict(consumed_batches=7))
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    assert first == uninterrupted[7]
    assert sorted(reader.asked) == sorted({shards[record // ROWS] for record in first})  # type: ignore[attr-defined]


def test_a_first_batch_over_shards_of_other_schemas_is_built_shard_by_shard(tmp_path: Path, shards: list[str]) -> None:
    narrow = tmp_path / "narrow.parquet"  # int32 where the other shards hold int64: their spans do not join
    pq.write_table(pa.table({"x": pa.array(range(ROWS), pa.int32())}), narrow, row_group_size=GROUP)
    mixed = [str(narrow), *shards[1:]]
    uninterrupted = batches(stream_of(mixed, ParquetReader(), window=SHARDS))
    resumed = stream_of(mixed, ParquetReader(), window=SHARDS)
    resumed.load_state_dict(resumed.state_dict(consumed_batches=1))
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    assert first == uninterrupted[1] and min(first) < ROWS  # a record of the narrow shard among the others


class ThreadsLogged(ParquetReader):
    """Notes the thread of each of the first batch's shard reads."""

    def read_rows_span(self, shard: str, rows: object) -> object:  # type: ignore[override]
        self.threads.append(threading.get_ident())
        return super().read_rows_span(shard, rows)  # type: ignore[arg-type]


@settings(max_examples=15, deadline=None)
@given(consumed=st.integers(1, SHARDS * ROWS // 5 - 1), urls=st.booleans())  # 0: no resume, the window is read
def test_a_first_batch_reads_local_shards_in_its_own_thread_and_urls_side_by_side(
    shards: list[str], consumed: int, urls: bool
) -> None:
    named = [Path(shard).as_uri() for shard in shards] if urls else shards
    uninterrupted = batches(stream_of(shards, ParquetReader()))
    reader = ThreadsLogged()
    reader.threads = []  # type: ignore[attr-defined]
    resumed = stream_of(named, reader)
    resumed.load_state_dict(resumed.state_dict(consumed_batches=consumed))
    first = next(iter(resumed.loader(num_workers=0)))["x"].tolist()
    assert first == uninterrupted[consumed]
    threads = set(reader.threads)  # type: ignore[attr-defined]
    read = len({record // ROWS for record in first})
    assert len(reader.threads) == read  # type: ignore[attr-defined]
    if read > 1:  # one shard is read in the caller's thread either way
        assert (threading.get_ident() not in threads) if urls else (threads == {threading.get_ident()})
