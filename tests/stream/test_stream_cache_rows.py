"""Through the node cache, a resume's first batch reads only its own records too: ``ShardCache`` has the inner
reader's ``read_rows`` (and ``read_rows_span``) of the local copy, and only where the inner reader has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stateful_sampler.stream import JsonlReader, ParquetReader, ShardCache, ShardReadError
from stateful_sampler.stream.readers import rows_reader, rows_span_reader
from tests.stream.test_stream_first_batch import GROUP, ROWS, SHARDS, batches, stream_of
from tests.stream.test_stream_remote import write_parquet
from tests.stream_helpers import MemoryReader


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("cached-rows")
    return [write_parquet(root / f"{i}.parquet", list(range(i * ROWS, (i + 1) * ROWS)), GROUP) for i in range(SHARDS)]


def test_a_resumes_first_batch_through_the_cache_decodes_only_the_row_groups_of_its_records(
    shards: list[str], tmp_path: Path
) -> None:
    uninterrupted = batches(stream_of(shards, ParquetReader()))
    inner = ParquetReader()
    resumed = stream_of(shards, ShardCache(inner, tmp_path / "cache", max_bytes=1 << 30))  # type: ignore[arg-type]
    resumed.load_state_dict(stream_of(shards, ParquetReader()).state_dict(consumed_batches=7))
    delivered = iter(resumed.loader(num_workers=0))
    first = next(delivered)["x"].tolist()
    assert first == uninterrupted[7]
    groups = {(record // ROWS, record % ROWS // GROUP) for record in first}
    assert inner.stats.rows == GROUP * len(groups)  # a span of each shard would be most of its 64 rows
    assert [batch["x"].tolist() for batch in delivered] == uninterrupted[8:]


def test_the_cache_reads_rows_as_the_inner_reader_does(shards: list[str], tmp_path: Path) -> None:
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 30)
    rows = [17, 3, 3, 60]
    assert cache.read_rows(shards[1], rows) == ParquetReader().read_rows(shards[1], rows)
    assert list(cache.read_rows_span(shards[1], rows)) == ParquetReader().read_rows(shards[1], rows)
    assert rows_reader(cache) is not None and rows_span_reader(cache) is not None


def test_without_rows_in_the_inner_reader_the_cache_has_none(tmp_path: Path) -> None:
    cache = ShardCache(MemoryReader([4]), tmp_path / "cache", max_bytes=1 << 30)  # type: ignore[arg-type]
    assert rows_reader(cache) is None and rows_span_reader(cache) is None
    with pytest.raises(AttributeError, match=r"MemoryReader reads no rows by index \(read_rows\)"):
        cache.read_rows  # noqa: B018
    assert rows_reader(ShardCache(JsonlReader(), tmp_path / "jsonl", max_bytes=1 << 30)) is not None


def test_a_row_past_the_copys_end_is_named_by_the_shards_url(shards: list[str], tmp_path: Path) -> None:
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(ShardReadError, match=repr(shards[2])):
        cache.read_rows(shards[2], [ROWS])
