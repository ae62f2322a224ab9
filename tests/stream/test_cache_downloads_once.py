"""A cold node reads each shard from storage once through ``ShardCache``, whatever the reader: the S3 requests
of building the stream and reading an epoch, counted where botocore sends them (tests/s3_requests.py) against a
real S3-compatible server on 127.0.0.1. A tar's index, an Arrow stream's batches and JSON Lines' count are read
from the node's copy, not from the object first and the copy after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler.stream import ArrowReader, JsonlReader, ShardCache, ShardedStream, TarReader
from tests.s3_requests import counted_requests
from tests.s3_server import s3_server
from tests.stream_helpers import loop_batches
from tests.stream_readers import COUNTS, arrow_shards, tar_shards


def jsonl_shards(root: Path) -> None:
    for shard, count in enumerate(COUNTS):
        lines = [json.dumps({"id": 100 * shard + row}) for row in range(count)]
        (root / f"part-{shard:03d}.jsonl").write_text("\n".join(lines) + "\n")


FORMATS = {"tar": (tar_shards, TarReader), "arrow": (arrow_shards, ArrowReader), "jsonl": (jsonl_shards, JsonlReader)}


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


def uploaded(s3: Any, tmp_path: Path, name: str) -> list[str]:
    root = tmp_path / "shards"
    root.mkdir()
    FORMATS[name][0](root)
    bucket = s3.bucket(f"once-{name}")
    paths = sorted(root.iterdir())
    for path in paths:
        s3.filesystem().put(str(path), f"{bucket.removeprefix('s3://')}/{path.name}")
    return [f"{bucket}/{path.name}" for path in paths]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_cold_node_gets_each_shard_once_to_count_identify_and_read_it(
    name: str, s3: Any, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no tar index of another test's run
    urls = uploaded(s3, tmp_path, name)
    reader = FORMATS[name][1](storage_options=s3.storage_options)
    with counted_requests(urls[0], s3.storage_options) as sent:
        cache = ShardCache(reader, tmp_path / "cache", max_bytes=1 << 30, prefetch=False)
        stream = ShardedStream(urls, cache, batch_size=4, window=2, seed=3)
        built = dict(sent)
        batches = loop_batches(stream, 0)
    assert sum(map(len, batches)) == sum(COUNTS)
    # Per shard: a HEAD for its version (which names the copy), the download's HEAD (it refuses another
    # version) and one GET of its bytes (a small object: one range), all while the stream is built.
    assert dict(sent) == {"HEAD": 2 * len(urls), "GET range": len(urls)}
    assert built == dict(sent)  # the epoch read the copies: no further request
    size = sum(s3.filesystem().size(url) for url in urls)
    assert cache.stats().bytes == size  # fetched.log: the node moved each shard's bytes once
    # Another process of the node (a rank) starts on the manifest: no read of the shards at all.
    with counted_requests(urls[0], s3.storage_options) as again:
        other = ShardedStream(urls, ShardCache(reader, tmp_path / "cache", max_bytes=1 << 30), batch_size=4, window=2,
                              seed=3)  # fmt: skip
        assert loop_batches(other, 0) == batches
    assert dict(again) == {} and cache.stats().bytes == size
