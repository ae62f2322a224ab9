"""``ShardedStream(shard_manifest=path)``: a restart stats its shards instead of reading them (no footer, no
count), saves and resumes to the same state as a stream that read every shard, and still refuses a shard
changed since the save, naming it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler import IncompatibleStateError
from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream
from tests.stream.test_stream_remote import write_parquet
from tests.stream_helpers import loop_batches
from tests.stream_readers import FORMATS

ROWS = 12


def parquet_shards(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    return [write_parquet(root / f"{i}.parquet", list(range(i * ROWS, (i + 1) * ROWS)), 4) for i in range(4)]


def no_shard_reads(monkeypatch: pytest.MonkeyPatch, reader: Any) -> None:
    """Reading a shard's count or metadata fails from here on: the stream must take them from the manifest."""

    def refuse(*args: Any) -> None:
        raise AssertionError(f"read a shard's count or metadata: {args}")

    for name in ("count", "metadata"):
        if hasattr(type(reader), name):
            monkeypatch.setattr(type(reader), name, refuse)


@pytest.mark.parametrize("name", ["parquet", *FORMATS])
def test_a_restart_reads_no_shard_and_resumes_the_state_of_a_stream_that_read_them(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "parquet":
        shards, open_reader = parquet_shards(tmp_path / "shards"), ParquetReader
    else:
        (tmp_path / "shards").mkdir()
        FORMATS[name].write(tmp_path / "shards")
        shards, _ = FORMATS[name].open(tmp_path / "shards")

        def open_reader() -> Any:
            return FORMATS[name].open(tmp_path / "shards")[1]

    config: dict[str, Any] = {"batch_size": 3, "window": 2, "seed": 5}
    manifest = tmp_path / "node" / "manifest.json"
    read = ShardedStream(shards, open_reader(), **config)
    first = ShardedStream(shards, open_reader(), shard_manifest=manifest, **config)
    assert manifest.exists() and first.counts == read.counts
    saved = read.state_dict(consumed_batches=2)
    assert first.state_dict(consumed_batches=2) == saved  # the same digest: states move between the two
    reader = open_reader()
    no_shard_reads(monkeypatch, reader)
    restarted = ShardedStream(shards, reader, shard_manifest=manifest, **config)
    restarted.load_state_dict(saved)
    monkeypatch.undo()
    read.load_state_dict(saved)
    assert repr(loop_batches(restarted, 0)) == repr(loop_batches(read, 0))


def test_a_shard_changed_since_the_manifest_is_read_again_and_refused_naming_it(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    manifest = tmp_path / "manifest.json"
    saved = ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest).state_dict()
    write_parquet(Path(shards[2]), [-row for row in range(ROWS)], 4)  # same name and count, other records
    stat = os.stat(shards[2])
    os.utime(shards[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest)
    with pytest.raises(IncompatibleStateError, match=re.escape(f"shard {shards[2]!r} changed since the save")):
        changed.load_state_dict(saved)
    assert ShardedStream(shards, ParquetReader(), batch_size=2).state_dict() == changed.state_dict()


def test_given_counts_are_checked_against_the_manifests(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    manifest = tmp_path / "manifest.json"
    ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest)
    with pytest.raises(ValueError, match=re.escape(f"counts[1] ({shards[1]!r}) is 11, but the shard holds 12")):
        ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest, counts=[12, 11, 12, 12])


def test_a_damaged_manifest_or_one_of_another_reader_is_read_again_from_the_shards(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    manifest = tmp_path / "manifest.json"
    expected = ShardedStream(shards, ParquetReader(), batch_size=2).state_dict()
    for text in ("{not json", json.dumps({"version": 1, "reader": "other.Reader", "shards": {}}),
                 json.dumps({"version": 1, "reader": "stateful_sampler.stream.readers.ParquetReader",
                             "shards": {shards[0]: {"stored": [1, "x"], "count": "many"}}})):  # fmt: skip
        manifest.write_text(text)
        assert ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest).state_dict() == expected
        kept = json.loads(manifest.read_text())
        assert sorted(kept["shards"]) == sorted(shards) and kept["shards"][shards[0]]["count"] == ROWS


def test_a_reader_settings_change_the_identity_the_manifest_gives(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    manifest = tmp_path / "manifest.json"
    ShardedStream(shards, ParquetReader(), batch_size=2, shard_manifest=manifest)
    versioned = ShardedStream(shards, ParquetReader(version="v2"), batch_size=2, shard_manifest=manifest)
    assert versioned.state_dict() == ShardedStream(shards, ParquetReader(version="v2"), batch_size=2).state_dict()


def test_a_shard_cache_keeps_its_own_manifest(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    with pytest.raises(ValueError, match="shard_manifest: ShardCache keeps a manifest of its own"):
        ShardedStream(shards, cache, batch_size=2, shard_manifest=tmp_path / "manifest.json")


def test_a_manifest_that_cannot_be_written_is_warned_about_and_the_stream_reads_its_shards(tmp_path: Path) -> None:
    shards = parquet_shards(tmp_path / "shards")
    (tmp_path / "a-file").write_text("")
    unwritable = tmp_path / "a-file" / "manifest.json"  # its folder is a file: no process can write it
    with pytest.warns(RuntimeWarning, match=r"shard_manifest: could not write .*a-file/manifest.json"):
        stream = ShardedStream(shards, ParquetReader(), batch_size=4, seed=3, shard_manifest=unwritable)
    reference = ShardedStream(shards, ParquetReader(), batch_size=4, seed=3)
    assert loop_batches(stream, 0) == loop_batches(reference, 0) and stream.state_dict() == reference.state_dict()
