"""Shards by URL: ``s3://``, ``gs://``, ``https://``, ``file://`` through fsspec, local paths as they are.

One place opens a shard and says what identifies its content, so every reader (and the node-local
cache) reads and identifies local and remote shards the same way, and counts the bytes it moved.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

from stateful_sampler.errors import ShardReadError

#: Bytes read from remote storage by this process (all readers and the cache), for accounting.
transferred = [0]

# What fsspec's ``info`` reports that changes when an object's content changes, by backend:
# S3 and HTTP ETag, GCS generation and hashes, Azure etag; the time of the last write only when
# none of those is there (a re-upload of the same bytes keeps its ETag, not its time).
_CONTENT_KEYS = ("ETag", "etag", "generation", "md5Hash", "crc32c", "content_md5")
_TIME_KEYS = ("mtime", "LastModified", "last_modified", "created")


def is_url(shard: str) -> bool:
    """True for ``scheme://...`` (``file://`` included); a plain path is read with the OS."""
    return "://" in shard


def filesystem(shard: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a URL. fsspec caches filesystems per process (and
    drops the cache in a forked worker), so this is cheap per call."""
    try:
        import fsspec  # the `remote` extra: local shards do not need it
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ShardReadError(f"shard {shard!r} is a URL: pip install 'stateful-sampler[remote]' (fsspec)") from error
    try:
        return fsspec.core.url_to_fs(shard, **dict(storage_options or {}))
    except (ImportError, ValueError) as error:  # an unknown scheme, or its package (s3fs, gcsfs) missing
        raise ShardReadError(f"no filesystem for shard {shard!r}: {error}") from error


class _Counted(io.RawIOBase):
    """A remote file that adds what it reads to ``transferred``."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        transferred[0] += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def open_shard(shard: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """A binary, seekable file for a path or URL; ``ShardReadError`` naming the shard if it cannot be opened."""
    try:
        if not is_url(shard):
            return open(shard, "rb")
        fs, path = filesystem(shard, storage_options)
        return _Counted(fs.open(path, "rb", cache_type="none"))  # exact ranges: a footer read is the footer
    except ShardReadError:
        raise
    except Exception as error:  # FileNotFoundError, PermissionError, botocore's ClientError, ...
        raise ShardReadError(f"could not open shard {shard!r}: {error}") from error


def file_identity(shard: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """What the storage says about the shard's bytes: size plus modification time (a path), or size
    plus ETag / generation / hash (object storage), without reading the content."""
    try:
        if not is_url(shard):
            stat = os.stat(shard)
            return f"size={stat.st_size};mtime_ns={stat.st_mtime_ns}"
        fs, path = filesystem(shard, storage_options)
        info = fs.info(path)
    except ShardReadError:
        raise
    except Exception as error:
        raise ShardReadError(f"could not stat shard {shard!r}: {error}") from error
    parts = [f"size={info.get('size')}"]
    content = [f"{key}={info[key]}" for key in _CONTENT_KEYS if info.get(key) not in (None, "")]
    parts += content or [f"{key}={info[key]}" for key in _TIME_KEYS if info.get(key) not in (None, "")]
    return ";".join(parts)
