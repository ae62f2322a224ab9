"""Readers by path and URL, and each reader's content identity: what changes it and what does not.

The S3 tests run a real S3-compatible server (moto, its own process) on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.stream import JsonlReader, ParquetReader, ShardCache, ShardedStream, ShardReadError
from tests.helpers import scaled_examples
from tests.s3_server import s3_server


def write_parquet(path: Path, values: list[int], row_group_size: int = 4, **metadata: str) -> str:
    table = pa.table({"x": values})
    if metadata:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def write_jsonl(path: Path, values: list[int]) -> str:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as file:
        file.write("".join(json.dumps({"x": value}) + "\n" for value in values))
    return str(path)


def same_stat(path: str, like: os.stat_result) -> None:
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))


# -- identity: what changes it


def test_parquet_identity_changes_with_rows_of_the_same_count_size_and_time(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", list(range(10)))
    reader = ParquetReader()
    before, stat = reader.identity(path), os.stat(path)
    write_parquet(tmp_path / "a.parquet", list(range(10)), row_group_size=5)  # same rows, other row groups
    same_stat(path, stat)
    assert reader.count(path) == 10
    assert reader.identity(path) != before


def test_parquet_identity_changes_with_key_value_metadata_alone(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", list(range(10)), version="1")
    reader = ParquetReader()
    before, stat = reader.identity(path), os.stat(path)
    write_parquet(tmp_path / "a.parquet", list(range(10)), version="2")
    same_stat(path, stat)
    assert os.stat(path).st_size == stat.st_size
    assert reader.identity(path) != before


def test_identity_changes_with_the_modification_time_and_is_stable_otherwise(tmp_path: Path) -> None:
    parquet = write_parquet(tmp_path / "a.parquet", list(range(10)))
    jsonl = write_jsonl(tmp_path / "a.jsonl", list(range(10)))
    for reader, path in ((ParquetReader(), parquet), (JsonlReader(), jsonl)):
        before = reader.identity(path)
        assert reader.identity(path) == before  # stable
        stat = os.stat(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
        assert reader.identity(path) != before


def test_jsonl_identity_changes_with_a_rewrite_of_the_same_size(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [1, 2, 3])
    reader = JsonlReader()
    before = reader.identity(path)
    write_jsonl(tmp_path / "a.jsonl", [4, 5, 6])  # same size, new mtime
    assert os.stat(path).st_size == Path(path).stat().st_size
    assert reader.identity(path) != before


def test_user_version_and_checksum_join_the_identity(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", list(range(10)))
    plain = ParquetReader().identity(path)
    assert ParquetReader(version="v1").identity(path) == plain + ";version=v1"
    size, mtime, footer = plain.split(";")
    assert mtime.startswith("mtime_ns=")  # a checksum identifies the bytes in place of their time
    assert ParquetReader(checksums={path: "abc"}).identity(path) == f"{size};{footer};checksum=abc"
    assert JsonlReader(version="v2").identity(write_jsonl(tmp_path / "a.jsonl", [1])).endswith(";version=v2")
    with pytest.raises(ValueError, match="checksums has no entry for shard .*b.parquet"):
        ParquetReader(checksums={path: "abc"}).identity(write_parquet(tmp_path / "b.parquet", [1]))


def test_a_rewritten_parquet_shard_is_refused_on_resume(tmp_path: Path) -> None:
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(i * 8, i * 8 + 8))) for i in range(4)]
    stream = ShardedStream(paths, ParquetReader(), batch_size=4, window=2, seed=3)
    state = stream.state_dict(consumed_batches=2)
    stat = os.stat(paths[2])
    write_parquet(tmp_path / "2.parquet", list(range(100, 108)))  # same name, count, size and time
    same_stat(paths[2], stat)
    with pytest.raises(IncompatibleStateError, match="2.parquet"):
        ShardedStream(paths, ParquetReader(), batch_size=4, window=2, seed=3).load_state_dict(state)


@pytest.mark.parametrize("cached", [False, True])
def test_a_touched_or_copied_unchanged_shard_keeps_its_identity_with_checksums(tmp_path: Path, cached: bool) -> None:
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(i * 8, i * 8 + 8))) for i in range(3)]
    sums = {path: f"sha-{i}" for i, path in enumerate(paths)}

    def stream(checksums: dict[str, str]) -> ShardedStream:
        reader = ParquetReader(checksums=checksums)
        shard_reader = ShardCache(reader, tmp_path / "cache", max_bytes=1 << 20) if cached else reader
        return ShardedStream(paths, shard_reader, batch_size=4, window=2, seed=3)

    state = stream(sums).state_dict(consumed_batches=2)
    stat = os.stat(paths[1])
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes, another time
    shutil.copy(paths[2], tmp_path / "copy")  # copied over itself: a new file, a new time
    os.replace(tmp_path / "copy", paths[2])
    resumed = stream(sums)
    resumed.load_state_dict(state)
    assert resumed.position == 8
    with pytest.raises(IncompatibleStateError, match=r"shard '.*1\.parquet' changed since the save"):
        stream({**sums, paths[1]: "sha-other"}).load_state_dict(state)


@pytest.mark.parametrize("cached", [False, True])
def test_stale_counts_for_a_parquet_shard_that_grew_are_refused_naming_both_counts(
    tmp_path: Path, cached: bool
) -> None:
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(20))) for i in range(3)]
    write_parquet(Path(paths[1]), list(range(30)))  # grew after the counts were written down
    reader = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20) if cached else ParquetReader()
    with pytest.raises(ValueError, match=r"counts\[1\] \('.*1\.parquet'\) is 20, but the shard holds 30 records \(read "
                                         r"with its identity\): pass counts\[1\]=30, or leave counts unset"):  # fmt: skip
        ShardedStream(paths, reader, batch_size=4, counts=[20, 20, 20])
    stream = ShardedStream(paths, reader, batch_size=4, counts=[20, 30, 20])  # the true counts: taken
    assert sorted(record["x"] for record in stream) == sorted(list(range(20)) * 2 + list(range(30)))


@pytest.mark.parametrize(
    "change", [{"version": "v2"}, {"checksums": "sums"}, {"version": "v2", "checksums": "sums"}]
)  # fmt: skip
def test_the_cache_identifies_a_shard_by_all_the_reader_identifies_it_by(tmp_path: Path, change: dict) -> None:
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(i * 8, i * 8 + 8))) for i in range(3)]
    sums = {path: f"sha-{i}" for i, path in enumerate(paths)}
    options = {name: sums if value == "sums" else value for name, value in change.items()}
    warm = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    state = ShardedStream(paths, warm, batch_size=4, window=2, seed=3).state_dict(consumed_batches=1)
    for path in paths:
        warm.fetch(path)
    changed = ShardCache(ParquetReader(**options), tmp_path / "cache", max_bytes=1 << 20)
    assert [changed.identity(path) for path in paths] == [ParquetReader(**options).identity(path) for path in paths]
    stream = ShardedStream(paths, changed, batch_size=4, window=2, seed=3)
    with pytest.raises(IncompatibleStateError, match=r"state field 'shards': saved 'several shards of other names"):
        stream.load_state_dict(state)  # as without the cache
    with pytest.raises(IncompatibleStateError, match=r"state field 'shards'"):
        ShardedStream(paths, ParquetReader(**options), batch_size=4, window=2, seed=3).load_state_dict(state)


class Labelled(ParquetReader):
    """A reader of your own that adds to the identity: the cache asks its identity, not the footer's alone."""

    def identity(self, shard: str) -> str:
        return super().identity(shard) + ";label=mine"


def test_an_identity_overridden_by_a_subclass_is_kept_through_the_cache(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", list(range(8)))
    cache = ShardCache(Labelled(version="v1"), tmp_path / "cache", max_bytes=1 << 20)
    assert cache.identity(path) == ParquetReader(version="v1").identity(path) + ";label=mine"


# -- JSON Lines and file:// URLs


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_jsonl_reads_rows_and_counts_non_blank_lines(tmp_path: Path, name: str) -> None:
    path = write_jsonl(tmp_path / name, list(range(10)))
    reader = JsonlReader()
    assert reader.count(path) == 10
    assert reader.read(path, 3, 6) == [{"x": 3}, {"x": 4}, {"x": 5}]
    assert reader.read(path, 8, 20) == [{"x": 8}, {"x": 9}]
    assert reader.stats.rows == 5  # only the rows asked for are decoded


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
@given(rows=st.lists(st.integers(0, 11), max_size=8), blank=st.sets(st.integers(0, 11)))
@settings(max_examples=scaled_examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_jsonl_read_rows_decodes_only_the_rows_asked_in_their_order(
    tmp_path: Path, name: str, rows: list[int], blank: set[int]
) -> None:
    path = tmp_path / name
    lines = "".join(json.dumps({"x": value}) + "\n" + (" \n" if value in blank else "") for value in range(12))
    with (gzip.open if name.endswith(".gz") else open)(path, "wt") as file:  # type: ignore[operator]
        file.write(lines)
    reader = JsonlReader()
    assert reader.read_rows(str(path), rows) == [reader.read(str(path), row, row + 1)[0] for row in rows]
    assert reader.stats.converted == len(set(rows)) + len(rows)  # read_rows's distinct rows, then one a row


def test_jsonl_read_rows_past_the_end_or_negative_is_refused_naming_the_shard(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "short.jsonl", list(range(5)))
    with pytest.raises(ShardReadError, match=r"short.jsonl' ends before row 5, which was asked: it holds fewer"):
        JsonlReader().read_rows(path, [4, 5, 1])
    with pytest.raises(ShardReadError, match=r"short.jsonl': row -1 was asked; rows start at 0"):
        JsonlReader().read_rows(path, [0, -1])
    assert JsonlReader().read_rows(path, []) == []


def test_jsonl_bad_line_names_shard_line_and_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"x": 1}\n\n{"x": \n')
    with pytest.raises(ShardReadError, match=r"bad.jsonl' line 3 \(row 1\) is not JSON"):
        JsonlReader().read(str(path), 0, 2)


def test_file_urls_read_the_same_records_as_paths(tmp_path: Path) -> None:
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(i * 6, i * 6 + 6))) for i in range(4)]
    urls = [f"file://{path}" for path in paths]
    by_path = list(ShardedStream(paths, ParquetReader(), batch_size=3, window=2, seed=1))
    by_url = list(ShardedStream(urls, ParquetReader(), batch_size=3, window=2, seed=1))
    assert by_url == by_path and sorted(r["x"] for r in by_url) == list(range(24))


def test_missing_and_unknown_urls_name_the_shard(tmp_path: Path) -> None:
    with pytest.raises(ShardReadError, match="could not open shard 'file:///nonexistent/x.parquet': not found"):
        ParquetReader().count("file:///nonexistent/x.parquet")
    with pytest.raises(ShardReadError, match="could not stat shard 'file:///nonexistent/x.jsonl': not found"):
        JsonlReader().identity("file:///nonexistent/x.jsonl")
    with pytest.raises(ShardReadError, match="could not stat shard 'file:///nonexistent/x.parquet': not found"):
        ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1).fetch("file:///nonexistent/x.parquet")
    with pytest.raises(ShardReadError, match="no filesystem for shard 'nosuchscheme://b/x.parquet'"):
        ParquetReader().count("nosuchscheme://b/x.parquet")


def test_a_missing_s3fs_names_the_remote_extra() -> None:
    script = (
        "import sys; sys.modules['s3fs'] = None\n"  # as if it were not installed
        "from stateful_sampler.stream import ParquetReader\n"
        "try:\n    ParquetReader().count('s3://bucket/x.parquet')\n"
        "except Exception as error:\n    print(type(error).__name__, error)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout.strip() == (
        "ShardReadError shard 's3://bucket/x.parquet' needs s3fs, which is not installed: "
        "pip install 'stateful-sampler[remote]'"
    ), out.stderr


def test_gzipped_json_lines_read_through_the_cache(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", list(range(10)))
    cache = ShardCache(JsonlReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert cache.count(path) == 10 and cache.read(path, 2, 4) == [{"x": 2}, {"x": 3}]


# -- S3 on a real local server


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


@pytest.mark.slow
def test_s3_shards_stream_through_the_cache_like_local_ones_with_workers(s3, tmp_path: Path) -> None:
    fs = s3.filesystem()
    base = s3.bucket("exact")
    paths = [write_parquet(tmp_path / f"{i}.parquet", list(range(i * 20, i * 20 + 20))) for i in range(6)]
    for i, path in enumerate(paths):
        fs.put(path, f"exact/{i}.parquet")
    urls = [f"{base}/{i}.parquet" for i in range(6)]
    local = ShardedStream(paths, ParquetReader(), batch_size=5, window=2, seed=9)
    cache = ShardCache(ParquetReader(storage_options=s3.storage_options), tmp_path / "cache", max_bytes=1 << 30)
    remote = ShardedStream(urls, cache, batch_size=5, window=2, seed=9)
    expected = [batch["x"].tolist() for batch in local.loader(num_workers=0)]
    got = [batch["x"].tolist() for batch in remote.loader(num_workers=2)]
    assert got == expected
    sizes = sum(os.path.getsize(path) for path in paths)
    stats = cache.stats()
    # Each shard downloaded once for both workers (and its footer read once, at construction).
    assert [line.split(" ", 1)[1] for line in (tmp_path / "cache" / "fetched.log").read_text().splitlines()].count(
        urls[0]
    ) == 2
    assert sizes <= stats.bytes <= 2 * sizes + 1


@pytest.mark.slow
def test_s3_object_rewritten_with_the_same_count_is_refused_on_resume(s3, tmp_path: Path) -> None:
    fs = s3.filesystem()
    base = s3.bucket("rewrite")
    for i in range(3):
        fs.put(write_parquet(tmp_path / f"{i}.parquet", list(range(8))), f"rewrite/{i}.parquet")
    urls = [f"{base}/{i}.parquet" for i in range(3)]
    reader = ParquetReader(storage_options=s3.storage_options)
    state = ShardedStream(urls, reader, batch_size=4, window=1).state_dict(consumed_batches=1)
    fs.put(write_parquet(tmp_path / "new.parquet", list(range(50, 58))), "rewrite/1.parquet")
    with pytest.raises(IncompatibleStateError, match="1.parquet"):
        ShardedStream(urls, ParquetReader(storage_options=s3.storage_options), batch_size=4, window=1).load_state_dict(
            state
        )
    assert reader.read(urls[1], 0, 2) == [{"x": 50}, {"x": 51}]


@pytest.mark.slow
def test_s3_jsonl_reads_by_url(s3, tmp_path: Path) -> None:
    fs = s3.filesystem()
    base = s3.bucket("lines")
    fs.put(write_jsonl(tmp_path / "a.jsonl", list(range(7))), "lines/a.jsonl")
    reader = JsonlReader(storage_options=s3.storage_options)
    assert reader.count(f"{base}/a.jsonl") == 7
    assert reader.read(f"{base}/a.jsonl", 5, 7) == [{"x": 5}, {"x": 6}]
    assert "ETag=" in reader.identity(f"{base}/a.jsonl")
