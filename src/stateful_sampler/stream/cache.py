"""``ShardCache``: each shard fetched from storage once per node, whatever the ranks and workers.

Every reader of a ``ShardedStream`` reads (nearly) every shard of its window: that is the price
of an order that does not depend on the reader count. Against object storage that would be one
download per reader. The cache puts one copy on the node's local disk, shared by every process
that uses the same directory:

- ``<key>.shard`` is a complete shard; it appears by an atomic rename, so a reader never sees half
  a file. ``<key>`` hashes the URL and the storage's identity of the object (ETag, size), so a
  changed object is fetched anew.
- ``<key>.lock`` is held (``flock``) during a download: other processes that want the shard wait
  for that one download instead of starting their own.
- ``pins/<pid>-<n>.json`` lists the shards of the window a reader is in and of the next one. A shard
  no live reader pins is done; when a fetch would pass ``max_bytes``, done shards go first, least
  recently used first. The next window is fetched by a background thread while this one trains.
- ``fetched.log`` has one line per transfer from storage (bytes and URL): the node's IO.

``count`` and ``identity`` are computed once per node too (``<key>.meta.json``), from the footer.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from stateful_sampler.checks import check_int
from stateful_sampler.errors import ShardReadError
from stateful_sampler.stream import remote
from stateful_sampler.stream.readers import ShardReader, span_reader

_CHUNK = 8 << 20
_readers = itertools.count()


@dataclass(frozen=True)
class CacheStats:
    """What the node fetched from storage through one cache directory, all processes together."""

    transfers: int
    bytes: int


class ShardCache:
    """A reader that reads through a node-local copy of each shard; wraps any ``ShardReader``.

    Args:
        reader: the reader of one shard file (``ParquetReader()``, ``JsonlReader()``, your own);
            it reads the local copy. Its ``storage_options`` (if any) open the remote shards.
        directory: on the node's local disk, the same for every rank and worker of the node.
        max_bytes: the cache's size. At least the current and the next window of every reader on
            the node must fit; when live readers pin more, a read still fetches (the size is
            passed) and a prefetch is skipped (the read fetches that shard when it needs it), so
            no reader blocks on another.
        prefetch: fetch the next window in a background thread while the current one trains (and,
            on a cold start, the rest of the current window while its first shard decodes).

    Example:
        >>> reader = ShardCache(ParquetReader(), "/local/cache", max_bytes=20 << 30)  # doctest: +SKIP
        >>> stream = ShardedStream(["s3://bucket/part-000.parquet", ...], reader, batch_size=32)
    """

    def __init__(
        self, reader: ShardReader, directory: str | os.PathLike[str], *, max_bytes: int, prefetch: bool = True
    ) -> None:
        if not isinstance(reader, ShardReader):
            raise TypeError(f"reader must have count(shard) and read(shard, start, stop), got {type(reader).__name__}")
        self.reader = reader
        self.directory = Path(directory)
        self.max_bytes = check_int("max_bytes", max_bytes, minimum=1)
        self.prefetch = bool(prefetch)
        self.storage_options = getattr(reader, "storage_options", None)
        (self.directory / "pins").mkdir(parents=True, exist_ok=True)
        self._keys: dict[str, tuple[str, int]] = {}  # shard -> (key, size): one stat per shard and process
        self._pin_name = ""
        self._pinned_now: frozenset[str] = frozenset()  # the keys this reader's pin file holds
        # Pins are numbered as windows are entered; one written behind the reads never replaces a later one.
        self._pins_asked = self._pin_written = 0
        self._pin_lock: tuple[int, threading.Lock] | None = None
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pending: list[Future[Any]] = []

    def __getstate__(self) -> dict[str, Any]:
        """A DataLoader worker gets the keys already known, but its own pin and prefetch thread."""
        state = self.__dict__.copy()
        state.update(_pin_name="", _pinned_now=frozenset(), _pins_asked=0, _pin_written=0, _pin_lock=None, _pool=None,
                     _pending=[])  # fmt: skip
        return state

    # -- the reader protocol

    def count(self, shard: str) -> int:
        return int(self._meta(shard)["count"])

    def identity(self, shard: str) -> str:
        return str(self._meta(shard)["identity"])

    def read(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        return self._read(self.reader.read, shard, start, stop)

    def read_span(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        """The inner reader's ``read_span`` of the local copy (its ``read`` for a reader without one)."""
        return self._read(span_reader(self.reader), shard, start, stop)

    def _read(self, read: Callable[[str, int, int], Sequence[Any]], shard: str, start: int, stop: int) -> Sequence[Any]:
        path = self.fetch(shard)
        try:
            return read(str(path), start, stop)
        except Exception:  # a reader may wrap the FileNotFoundError (ParquetReader: ShardReadError)
            if path.exists():
                raise
        # The copy went between fetch and open (evicted by a process that does not pin it): fetched again.
        return read(str(self.fetch(shard)), start, stop)

    def enter_window(self, shards: Sequence[str], next_shards: Sequence[str]) -> None:
        """Pin this window's and the next window's shards; fetch in the background, one at a time and in
        this order, this window's missing shards after the first (the reader's first read fetches that
        one meanwhile, then decodes each shard as it arrives), then the next window's."""
        keys = [self._key(shard)[0] for shard in (*shards, *next_shards)]
        self._pins_asked += 1
        wanted = [*shards[1:], *next_shards] if self.prefetch else []
        # Only shards not yet here: a warm cache fetches nothing in the background.
        tasks: list[Callable[[], Any]] = [
            partial(self._fetch, shard, False) for shard in wanted if not self._path(shard).exists()
        ]
        if self.prefetch and self._holds(keys[: len(shards)]):
            # This window is pinned already (the last window's pin had it as the next one): the new pin
            # (a file write, milliseconds on some disks) is written behind the reads, before the
            # prefetch of the next window that it protects.
            tasks.insert(0, partial(self._pin, keys, self._pins_asked))
        else:
            self._pin(keys, self._pins_asked)
        if tasks:
            pool = self._executor()
            self._pending = [future for future in self._pending if not future.done()]
            self._pending += [pool.submit(task) for task in tasks]

    # -- the cache

    def fetch(self, shard: str) -> Path:
        """The local copy of ``shard``, fetched unless present; waits for another process's download."""
        return cast(Path, self._fetch(shard, True))  # a demand fetch always fetches

    def stats(self) -> CacheStats:
        """Transfers from storage logged in this directory (every process on the node)."""
        try:
            lines = (self.directory / "fetched.log").read_text().splitlines()
        except FileNotFoundError:
            return CacheStats(0, 0)
        return CacheStats(len(lines), sum(int(line.split(" ", 1)[0]) for line in lines))

    def wait(self) -> None:
        """Wait for this process's prefetches (tests and benchmarks; training never needs to)."""
        for future in self._pending:
            future.exception()
        self._pending = []

    def _path(self, shard: str) -> Path:
        return self.directory / f"{self._key(shard)[0]}.shard"

    def _fetch(self, shard: str, demand: bool) -> Path | None:
        key, size = self._key(shard)
        path = self._path(shard)
        if path.exists():
            _touch(path)
            return path
        with _locked(self.directory / f"{key}.lock"):
            if path.exists():  # another process fetched it while this one waited
                _touch(path)
                return path
            part = self.directory / f"{key}.part-{os.getpid()}-{next(_readers)}"
            if not self._reserve(part, size, demand):
                return None
            try:
                with remote.open_shard(shard, self.storage_options) as source, open(part, "r+b") as target:
                    shutil.copyfileobj(source, target, _CHUNK)
                    target.truncate()
                os.replace(part, path)
            except BaseException as error:
                part.unlink(missing_ok=True)
                if isinstance(error, Exception) and not isinstance(error, ShardReadError):
                    raise ShardReadError(f"could not fetch shard {shard!r} into {self.directory}: {error}") from error
                raise
            self._log(path.stat().st_size, shard)
        return path

    def _reserve(self, part: Path, size: int, demand: bool) -> bool:
        """Make room for ``size`` bytes, evicting done shards; a demand fetch gets room regardless.
        The reservation is a sparse file of the shard's size, so concurrent fetches count it."""
        with _locked(self.directory / "cache.lock"):
            files = [entry for entry in os.scandir(self.directory) if ".shard" in entry.name or ".part-" in entry.name]
            for entry in files:
                if ".part-" in entry.name and not _alive(int(entry.name.rsplit("-", 2)[1])):
                    os.unlink(entry.path)  # a download whose process died
            sizes = {entry.path: _size(entry) for entry in files}  # a download may rename its part meanwhile
            used = sum(sizes.values())
            if used + size > self.max_bytes:
                pinned = self._pinned()
                done = sorted(
                    (entry for entry in files if entry.name.endswith(".shard") and entry.name[:-6] not in pinned),
                    key=_mtime,
                )
                for entry in done:
                    if used + size <= self.max_bytes:
                        break
                    used -= sizes[entry.path]
                    os.unlink(entry.path)
                if used + size > self.max_bytes and not demand:
                    return False
            with open(part, "wb") as reservation:
                reservation.truncate(size)
        return True

    def _key(self, shard: str) -> tuple[str, int]:
        known = self._keys.get(shard)
        if known is None:
            identity = remote.file_identity(shard, self.storage_options)
            key = hashlib.sha256(f"{shard}\0{identity}".encode()).hexdigest()[:32]
            size = identity.split(";", 1)[0].removeprefix("size=")
            known = self._keys[shard] = (key, int(size) if size.isdigit() else 0)
        return known

    def _meta(self, shard: str) -> dict[str, Any]:
        """Count and identity from the inner reader on the remote shard, once per node."""
        key, _ = self._key(shard)
        path = self.directory / f"{key}.meta.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            pass
        with _locked(self.directory / f"{key}.lock"):
            if path.exists():
                return json.loads(path.read_text())
            before = remote.transferred[0]
            identity = getattr(self.reader, "identity", None)
            meta = {
                "count": self.reader.count(shard),
                "identity": identity(shard)
                if identity is not None
                else remote.file_identity(shard, self.storage_options),
            }
            _write_atomic(path, json.dumps(meta))
            self._log(remote.transferred[0] - before, shard)
        return meta

    def _log(self, size: int, shard: str) -> None:
        with open(self.directory / "fetched.log", "a") as log:
            log.write(f"{size} {shard}\n")

    def _pin(self, keys: list[str], asked: int) -> None:
        """Write the pin of the ``asked``-th window entered, unless a later window's is written already: a pin
        left behind the reads in the prefetch thread must not unpin the window the reader went on to."""
        with self._lock():
            if not self._pin_name.startswith(f"{os.getpid()}-"):  # a forked worker pins under its own name
                self._pin_name, self._pin_written = f"{os.getpid()}-{next(_readers)}.json", 0
            if asked < self._pin_written:
                return
            _write_atomic(self.directory / "pins" / self._pin_name, json.dumps(keys))
            self._pinned_now, self._pin_written = frozenset(keys), asked

    def _holds(self, keys: Sequence[str]) -> bool:
        """This process's pin file holds ``keys`` (a forked worker has no pin of its parent's)."""
        return self._pin_name.startswith(f"{os.getpid()}-") and self._pinned_now.issuperset(keys)

    def _pinned(self) -> set[str]:
        """The shards pinned by live readers; the pins of dead processes are removed."""
        pinned: set[str] = set()
        for entry in os.scandir(self.directory / "pins"):
            if not entry.name.endswith(".json"):
                continue
            if not _alive(int(entry.name.split("-", 1)[0])):
                os.unlink(entry.path)
                continue
            try:
                pinned.update(json.loads(Path(entry.path).read_text()))
            except (FileNotFoundError, ValueError):
                continue
        return pinned

    def _lock(self) -> threading.Lock:
        if self._pin_lock is None or self._pin_lock[0] != os.getpid():  # a forked worker's own, never held at fork
            self._pin_lock = (os.getpid(), threading.Lock())
        return self._pin_lock[1]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool[0] != os.getpid():  # a forked worker has no thread of its parent's
            self._pool = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch"))
        return self._pool[1]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(f"{path.name}.tmp-{os.getpid()}-{next(_readers)}")
    part.write_text(text)
    os.replace(part, path)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        pass


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_size
    except FileNotFoundError:
        return 0


def _mtime(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
