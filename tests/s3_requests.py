"""The S3 requests this process sends, by kind, counted where botocore sends them (each attempt once): for the
tests and the benchmark that count the stream's metadata requests against the moto server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
