"""The S3 requests a node's processes send, by kind, counted where botocore sends them (each attempt once): for
the tests and the benchmark that count the stream's metadata requests against the moto server."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def counted_requests(url: str, storage_options: Mapping[str, Any]) -> Iterator[Counter[str]]:
    """Counts, by kind (``HEAD``, ``GET`` of a byte range, ``GET``, ``LIST``, ...), the requests sent inside the
    block by the s3fs filesystem fsspec gives this process for ``url`` and ``storage_options`` (the one the
    readers use: fsspec caches filesystems per process)."""
    import fsspec

    fs, _ = fsspec.core.url_to_fs(url, **dict(storage_options))
    client = fs.connect()  # the aiobotocore client of this process's filesystem
    counts: Counter[str] = Counter()

    def on_send(request: Any, **_: Any) -> None:
        if request.method == "GET" and "Range" in request.headers:
            counts["GET range"] += 1
        elif request.method == "GET" and "list-type" in request.url:
            counts["LIST"] += 1
        else:
            counts[request.method] += 1

    client.meta.events.register("before-send.s3", on_send)
    try:
        yield counts
    finally:
        client.meta.events.unregister("before-send.s3", on_send)


def _start(args: tuple[Any, ...]) -> dict[str, int]:
    """One rank process's start: its stream built over the node's cache, and the S3 requests that took. The
    stream lives until every rank has built its own, as a training's does."""
    from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream

    urls, options, directory, readers, rank, barrier, counts, kwargs = args
    with counted_requests(urls[0], options) as sent:
        barrier.wait()
        cache = ShardCache(ParquetReader(storage_options=options), directory, max_bytes=1 << 40)
        stream = ShardedStream(urls, cache, num_replicas=readers, rank=rank, counts=counts, **kwargs)
        barrier.wait()
    del stream
    return dict(sent)


def node_start(
    urls: Sequence[str], options: Mapping[str, Any], directory: Path, readers: int, counts: Any, **kwargs: Any
) -> Counter[str]:
    """``readers`` rank processes of one node starting at once over one cache directory (each builds its own
    ``ShardedStream``, as torchrun's ranks do); the requests of them all, by kind."""
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager, context.Pool(readers) as pool:
        barrier = manager.Barrier(readers)
        jobs = [(list(urls), dict(options), str(directory), readers, rank, barrier, counts, kwargs)
                for rank in range(readers)]  # fmt: skip
        sent = pool.map(_start, jobs)
    return sum((Counter(each) for each in sent), Counter())
