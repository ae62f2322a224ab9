"""ShardCache's node manifest: a URL's identity is looked up once per node per start, whatever the reader count
(HEADs counted at a real S3 server, moto on 127.0.0.1), and the footers once per node per object version. A
job that starts while another on the node uses the manifest takes that job's view, whole or refused."""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream, ShardReadError
from tests.s3_requests import node_start
from tests.s3_server import s3_server
from tests.stream.test_stream_remote import write_parquet

KWARGS = {"batch_size": 4, "window": 2, "seed": 3}
WHOLE_SHARDS = {**KWARGS, "spread": 1}  # windows of 2 whole shards evict each other from a small cache


def write_shards(tmp_path: Path, offset: int = 0, shards: int = 4) -> list[str]:
    (tmp_path / "src").mkdir(exist_ok=True)
    return [write_parquet(tmp_path / "src" / f"{i}.parquet", [offset + 20 * i + x for x in range(20)])
            for i in range(shards)]  # fmt: skip


def values(stream: ShardedStream) -> list[int]:
    """The epoch's records, sorted; iterated in a frame of its own (``iter(stream)`` looks at its caller's
    locals, which would keep the test's streams alive past their ``del``)."""
    return sorted(record["x"] for record in stream)


def test_a_job_started_beside_a_live_one_takes_its_view_and_the_next_start_looks_again(tmp_path: Path) -> None:
    paths = write_shards(tmp_path)
    urls = [f"file://{path}" for path in paths]
    caches = [ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20) for _ in range(2)]
    live = ShardedStream(urls, caches[0], **KWARGS)
    assert values(live) == list(range(80))
    write_shards(tmp_path, offset=1000)  # the data set rewritten while the live job runs
    beside = ShardedStream(urls, caches[1], **KWARGS)
    assert beside.identities == live.identities  # the node's view of this start
    assert values(beside) == list(range(80))  # the copies of that view, whole
    for cache in caches:
        cache.wait()  # a prefetch still running holds its cache, and so the node's view, until it ends
    del live, beside, caches, cache
    gc.collect()  # every job of the node has stopped: the next one is a start
    fresh = ShardedStream(urls, ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20), **KWARGS)
    assert values(fresh) == list(range(1000, 1080))


# -- against a real S3 server


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


def upload(s3: Any, tmp_path: Path, bucket: str, offset: int = 0, shards: int = 8) -> list[str]:
    fs = s3.filesystem()
    if not fs.exists(bucket):
        s3.bucket(bucket)
    for i, path in enumerate(write_shards(tmp_path, offset, shards)):
        fs.put(path, f"{bucket}/{i}.parquet")
    return [f"s3://{bucket}/{i}.parquet" for i in range(shards)]


@pytest.mark.slow
@pytest.mark.parametrize("counts", [None, [20] * 8])
def test_metadata_is_read_once_per_node_per_start_whatever_the_reader_count(s3, tmp_path: Path, counts) -> None:
    urls = upload(s3, tmp_path, "starts")
    for readers in (1, 6):
        directory = tmp_path / f"cache-{readers}"
        # A cold node: per shard one HEAD (opening its footer) and the footer's two exact ranged reads.
        assert node_start(urls, s3.storage_options, directory, readers, counts, **KWARGS) == {
            "HEAD": 8,
            "GET range": 16,
        }
        # A restart (every process of the start before has exited): one HEAD per shard, nothing else.
        assert node_start(urls, s3.storage_options, directory, readers, counts, **KWARGS) == {"HEAD": 8}


def _live_run(urls: list[str], options: dict[str, Any], directory: str, size: int, done: Any, uploaded: Any,
              results: Any) -> None:  # fmt: skip
    """A run reading epoch 0, then (once the test rewrote the objects) epoch 1, through 2 DataLoader workers."""
    try:
        cache = ShardCache(ParquetReader(storage_options=options), directory, max_bytes=3 * size)  # 3 of 8 shards
        loader = ShardedStream(urls, cache, **WHOLE_SHARDS).loader(num_workers=2)
        assert sorted(x for batch in loader for x in batch["x"].tolist()) == list(range(160))  # epoch 0
        done.set()
        assert uploaded.wait(timeout=120)
        delivered = []
        try:
            for batch in loader:  # epoch 1
                delivered += batch["x"].tolist()
        except ShardReadError as error:
            assert all(x < 1000 for x in delivered), delivered  # only the version the run identified
            results.put(str(error))
            return
        results.put(f"no error; delivered {sorted(delivered)}")
    except Exception as error:  # noqa: BLE001 - any failure of the run goes to the test, which reports it
        results.put(f"the run failed: {error!r}")


@pytest.mark.slow
def test_an_object_rewritten_inside_a_live_run_is_refused_and_the_next_start_reads_the_new_version(
    s3, tmp_path: Path
) -> None:
    urls = upload(s3, tmp_path, "rewrite-live")
    size = max(s3.filesystem().size(url) for url in urls)
    context = multiprocessing.get_context("fork")
    done, uploaded, results = context.Event(), context.Event(), context.Queue()
    run = context.Process(
        target=_live_run, args=(urls, s3.storage_options, str(tmp_path / "cache"), size, done, uploaded, results)
    )
    run.start()
    try:
        assert done.wait(timeout=120)
        upload(s3, tmp_path, "rewrite-live", offset=1000)  # same names, same counts, other records
        uploaded.set()
        message = results.get(timeout=300)
    finally:
        run.join(timeout=120)
    assert "changed on storage during this run: the run identified it as 'size=" in message, message
    assert ";ETag=" in message and "s3://rewrite-live/" in message
    # Every process of that run has stopped: the next start looks the objects up anew, and reads them whole.
    cache = ShardCache(ParquetReader(storage_options=s3.storage_options), tmp_path / "cache", max_bytes=3 * size)
    assert values(ShardedStream(urls, cache, **WHOLE_SHARDS)) == list(range(1000, 1160))


@pytest.mark.slow
def test_a_missing_object_is_not_found_naming_its_url(s3, tmp_path: Path) -> None:
    upload(s3, tmp_path, "missing", shards=1)
    url = "s3://missing/absent.parquet"
    reader = ParquetReader(storage_options=s3.storage_options)
    with pytest.raises(ShardReadError, match=r"could not open shard 's3://missing/absent\.parquet': not found"):
        ShardedStream([url], reader, batch_size=4)
    with pytest.raises(ShardReadError, match=r"could not open shard 's3://missing/absent\.parquet': not found"):
        ShardedStream([url], ShardCache(reader, tmp_path / "cache", max_bytes=1 << 20), batch_size=4)
    with pytest.raises(ShardReadError, match=r"could not stat shard 's3://missing/absent\.parquet': not found"):
        ShardCache(reader, tmp_path / "cache", max_bytes=1 << 20).fetch(url)
