"""Shards by URL: ``s3://``, ``gs://``, ``https://``, ``file://`` through fsspec, local paths as they are.

One place opens a shard and says what identifies its content, so every reader (and the node-local
cache) reads and identifies local and remote shards the same way, and counts the bytes it moved.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stateful_sampler.errors import ShardReadError

#: Bytes read from remote storage by this process (all readers and the cache), for accounting.
transferred = [0]
_transferred_lock = threading.Lock()
_this_thread = threading.local()

# What fsspec's ``info`` reports that changes when an object's content changes, by backend:
# S3 and HTTP ETag, GCS generation and hashes, Azure etag; the time of the last write only when
# none of those is there (a re-upload of the same bytes keeps its ETag, not its time).
_CONTENT_KEYS = ("ETag", "etag", "generation", "md5Hash", "crc32c", "content_md5")
_TIME_KEYS = ("mtime", "LastModified", "last_modified", "created")
# The packages of the `remote` extra; another backend's package (gcsfs, adlfs, aiohttp) is installed by name.
_REMOTE_EXTRA = ("fsspec", "s3fs")


@dataclass(frozen=True)
class StoredIdentity:
    """What the storage says about a shard's bytes without reading them: the size, and what changes with
    the content (``mtime_ns=`` for a path, ``ETag=`` / ``generation=`` for object storage; empty when the
    storage says nothing more). ``str()`` is the form the stream's state hashes."""

    size: int | None
    version: str

    def __str__(self) -> str:
        return f"size={self.size}" + (f";{self.version}" if self.version else "")


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
    except ImportError as error:  # the scheme's package (s3fs, gcsfs) is missing: fsspec says which
        missing = getattr(error.__cause__, "name", None) or getattr(error, "name", None) or "its fsspec backend"
        fix = "pip install 'stateful-sampler[remote]'" if missing in _REMOTE_EXTRA else f"pip install {missing}"
        raise ShardReadError(f"shard {shard!r} needs {missing}, which is not installed: {fix}") from error
    except ValueError as error:  # an unknown scheme
        raise ShardReadError(f"no filesystem for shard {shard!r}: {error}") from error


def thread_transferred() -> int:
    """Bytes read from remote storage by this thread so far: what one call moved, when calls run in threads."""
    return int(getattr(_this_thread, "bytes", 0))


def _count(size: int) -> None:
    with _transferred_lock:
        transferred[0] += size
    _this_thread.bytes = thread_transferred() + size


class _Counted(io.RawIOBase):
    """A remote file that adds what it reads to ``transferred``."""

    def __init__(self, file: Any) -> None:
        self._file = file

    @property
    def details(self) -> Any:
        """fsspec's ``info`` of the object as it was opened (None when the file does not keep it)."""
        return getattr(self._file, "details", None)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        _count(len(data))
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
    """A binary, seekable file for a path or URL; ``ShardReadError`` naming the shard if it cannot be opened
    (saying "not found" for a missing one)."""
    try:
        if not is_url(shard):
            return open(shard, "rb")
        fs, path = filesystem(shard, storage_options)
        return _Counted(fs.open(path, "rb", cache_type="none"))  # exact ranges: a footer read is the footer
    except ShardReadError:
        raise
    except FileNotFoundError as error:
        raise ShardReadError(f"could not open shard {shard!r}: not found ({error})") from error
    except Exception as error:  # PermissionError, botocore's ClientError, ...
        raise ShardReadError(f"could not open shard {shard!r}: {error}") from error


def stored_identity(shard: str, storage_options: Mapping[str, Any] | None = None) -> StoredIdentity:
    """What the storage says about the shard's bytes: size plus modification time (a path), or size
    plus ETag / generation / hash (object storage), without reading the content (one HEAD on S3)."""
    try:
        if not is_url(shard):
            return _of_stat(os.stat(shard))
        fs, path = filesystem(shard, storage_options)
        info = fs.info(path)
    except ShardReadError:
        raise
    except FileNotFoundError as error:
        raise ShardReadError(f"could not stat shard {shard!r}: not found ({error})") from error
    except Exception as error:
        raise ShardReadError(f"could not stat shard {shard!r}: {error}") from error
    return _of_info(info)


def opened_identity(shard: str, file: Any, storage_options: Mapping[str, Any] | None = None) -> StoredIdentity:
    """The stored identity of the bytes ``file`` (from ``open_shard``) reads: a path's by ``fstat`` of the open
    file, an object's from what fsspec learned when it opened it (on S3 the HEAD that also makes each
    ranged read conditional on that ETag), so no further request, and no gap in which the object could change."""
    if not is_url(shard):
        return _of_stat(os.fstat(file.fileno()))
    details = getattr(file, "details", None)
    if isinstance(details, Mapping) and details.get("size") is not None:
        return _of_info(details)
    return stored_identity(shard, storage_options)  # a backend whose files keep no info (file://): a stat


def _of_stat(stat: os.stat_result) -> StoredIdentity:
    return StoredIdentity(stat.st_size, f"mtime_ns={stat.st_mtime_ns}")


def _of_info(info: Mapping[str, Any]) -> StoredIdentity:
    content = [f"{key}={info[key]}" for key in _CONTENT_KEYS if info.get(key) not in (None, "")]
    version = content or [f"{key}={info[key]}" for key in _TIME_KEYS if info.get(key) not in (None, "")]
    size = info.get("size")
    return StoredIdentity(None if size is None else int(size), ";".join(version))
