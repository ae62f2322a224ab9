"""``ShardCache``: each shard fetched from storage once per node, whatever the ranks and workers.

Every reader of a ``ShardedStream`` reads (nearly) every shard of its window: that is the price
of an order that does not depend on the reader count. Against object storage that would be one
download per reader. The cache puts one copy on the node's local disk, shared by every process
that uses the same directory:

- ``manifest.json`` is what the node knows of each shard: its stored identity (size, ETag or
  modification time), its record count and its content identity (the footer's). A URL is looked up
  (one HEAD on S3) once per node per start: a process that finds another live process of the node
  using the manifest (``users.lock``, held shared by every cache) takes the identities that process's
  start looked up; the first process of a start (nobody holds it) begins a new generation and looks
  them up anew. A path is stat'd by each process (a system call, not a request). Counts and content
  identities are read (a footer: two ranged reads) once per node per version of the object; where the
  reader's ``count`` or ``metadata`` reads the whole shard (``@scans_shard``: a tar's headers, an Arrow
  stream, JSON Lines), from the node's copy, fetched for it: a cold node downloads each shard once.
- ``<key>.shard`` is a complete copy; ``<key>`` hashes the URL and the stored identity, so a changed
  object is fetched anew. It appears by an atomic rename, and ``<key>.seal`` records what the cache
  wrote: the size and SHA-256 of the bytes as downloaded, and the copy's inode, modification and
  change times. A copy is served only while it is sealed (any write, truncation, replacement or
  ``chmod`` moves its change time, which no unprivileged process can set back); a copy that is not is
  hashed again, and fetched anew unless its bytes are the ones downloaded. A download must be of the
  version the run identified, or it is refused: a run never mixes two versions of a shard.
- ``<key>.lock`` is held (``flock``) during a download: other processes that want the shard wait
  for that one download instead of starting their own. The download's ``<key>.part-<token>`` is
  created with ``O_EXCL`` and held with ``flock`` by its process while it lives.
- ``pins/<token>.json`` lists the shards of the window a reader is in and of the next one, and
  ``pins/<token>.lock`` is held by that reader's process. A shard no live reader pins is done; when a
  fetch would pass ``max_bytes``, done shards go first, least recently used first. The next window is
  fetched by a background thread while this one trains.
- ``fetched.log`` has one line per transfer from storage (bytes and URL): the node's IO.

Liveness is a lock held by the living (a dead process's ``flock`` is released by the kernel), so it
holds across PID namespaces (containers sharing the node's disk). No file inside the directory is
followed through a symbolic link.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

from stateful_sampler.checks import check_int
from stateful_sampler.errors import ShardReadError
from stateful_sampler.stream import remote
from stateful_sampler.stream.readers import (
    ShardMetadata,
    ShardReader,
    identity_in_two_steps,
    reads_whole_shard,
    rows_reader,
    rows_span_reader,
    span_reader,
)
from stateful_sampler.stream.remote import StoredIdentity

_CHUNK = 8 << 20
_LOOKUPS = 16  # look-ups of remote shards in flight at once (HEADs and footers: latency, not bandwidth)
_MANIFEST_VERSION = 1
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class CacheStats:
    """What the node fetched from storage through one cache directory, all processes together."""

    transfers: int
    bytes: int


@dataclass(frozen=True)
class _Entry:
    """What the node knows of one shard: the stored identity of its bytes (which keys its copy), and what was
    read of them: the records (None until counted) and the format's content identity (None until read)."""

    stored: StoredIdentity
    count: int | None = None
    content: str | None = None


class ShardCache:
    """A reader that reads through a node-local copy of each shard; wraps any ``ShardReader``.

    Args:
        reader: the reader of one shard file (``ParquetReader()``, ``JsonlReader()``, your own);
            it reads the local copy. Its ``storage_options`` (if any) open the remote shards.
        directory: on the node's local disk, the same for every rank and worker of the node, and
            writable only by the jobs' own user (or group): whatever writes it decides what every job
            reading through it trains on, so a directory every user may write is refused.
        max_bytes: the cache's size. At least the current and the next window of every reader on
            the node must fit; when live readers pin more, a read still fetches (the size is
            passed) and a prefetch is skipped (the read fetches that shard when it needs it), so
            no reader blocks on another.
        prefetch: fetch the next window in a background thread while the current one trains (and,
            on a cold start, the rest of the current window while its first shard decodes).

    Example:
        >>> reader = ShardCache(ParquetReader(), "/local/cache", max_bytes=20 << 30)  # doctest: +SKIP
        >>> stream = ShardedStream(["s3://bucket/part-000.parquet", ...], reader, batch_size=32)  # doctest: +SKIP
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
        for folder in (self.directory, self.directory / "pins"):
            mode = os.stat(folder).st_mode
            if mode & stat.S_IWOTH:
                raise ValueError(
                    f"directory {str(folder)!r} may be written by every user of the machine (mode {oct(mode & 0o7777)}):"
                    f" whatever writes it decides what every job reading through it trains on; give a directory "
                    f"that only the jobs' own user or group may write (chmod o-w {str(folder)!r})"
                )
        self._known: dict[str, _Entry] = {}  # shard -> what this process's run reads it as
        self._identities: dict[str, str] = {}  # a reader of your own's identity, asked once per process
        self._user: IO[bytes] | None = None  # users.lock, held shared while this cache lives
        self._pin_name = ""
        self._pin_pid = 0  # the process the pin name is of (a forked worker pins under its own)
        self._pin_holder: IO[bytes] | None = None  # pins/<name>.lock, held while this process pins
        self._pinned_now: frozenset[str] = frozenset()  # the keys this reader's pin file holds
        # Pins are numbered as windows are entered; one written behind the reads never replaces a later one.
        self._pins_asked = self._pin_written = 0
        self._pin_lock: tuple[int, threading.Lock] | None = None
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pending: list[Future[Any]] = []

    def __getstate__(self) -> dict[str, Any]:
        """A DataLoader worker gets the shards already known, but its own pin and prefetch thread (its parent
        holds the manifest for it)."""
        state = self.__dict__.copy()
        state.update(_user=None, _pin_name="", _pin_pid=0, _pin_holder=None, _pinned_now=frozenset(), _pins_asked=0,
                     _pin_written=0, _pin_lock=None, _pool=None, _pending=[])  # fmt: skip
        return state

    # -- the reader protocol

    def prepare(self, shards: Sequence[str], *, counts: bool = False) -> None:
        """Look up every shard's identity (and count, with ``counts=True``) at once, from the node's manifest:
        the stream calls this before it asks them one by one."""
        self._resolve(shards, content=True, counts=counts)

    def count(self, shard: str) -> int:
        return cast(int, self._entry(shard, content=True, counts=True).count)

    def known_count(self, shard: str) -> int | None:
        """The records of ``shard`` as the node read them with its identity (a footer's), None when not read."""
        entry = self._known.get(shard)
        return None if entry is None else entry.count

    def identity(self, shard: str) -> str:
        """The inner reader's identity of the shard. A reader with ``metadata`` and ``identity_from`` (the
        shipped ones) has its metadata read once per node and its own settings (``version``, ``checksums``)
        joined in this process; another reader's ``identity`` is asked once per process; a reader without
        one is identified by the stored identity (size and ETag or modification time). A subclass that
        overrides ``identity`` keeps it: asked once per process."""
        identify = getattr(self.reader, "identity", None)
        if identify is None:
            return str(self._entry(shard).stored)
        if identity_in_two_steps(self.reader):
            entry = self._entry(shard, content=True)
            metadata = ShardMetadata(entry.stored, cast(str, entry.content), entry.count)
            return cast(str, self.reader.identity_from(shard, metadata))  # type: ignore[attr-defined]
        known = self._identities.get(shard)
        if known is None:
            known = self._identities[shard] = identify(shard)
        return known

    def read(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        return self._read(self.reader.read, shard, start, stop)

    def read_span(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        """The inner reader's ``read_span`` of the local copy (its ``read`` for a reader without one)."""
        return self._read(span_reader(self.reader), shard, start, stop)

    @property
    def read_rows(self) -> Callable[[str, Any], Sequence[Any]]:
        """The inner reader's ``read_rows`` of the local copy, so that a first batch after a resume reads only
        its own records through the cache too. Only where the inner reader has one (``rows_reader``): otherwise
        an ``AttributeError``, and the stream reads spans, as it would from the inner reader."""
        return self._rows_through(rows_reader(self.reader), "read_rows")

    @property
    def read_rows_span(self) -> Callable[[str, Any], Sequence[Any]]:
        """The inner reader's ``read_rows_span`` of the local copy, where it has one (see ``read_rows``)."""
        return self._rows_through(rows_span_reader(self.reader), "read_rows_span")

    def _rows_through(
        self, inner: Callable[[str, Any], Sequence[Any]] | None, name: str
    ) -> Callable[[str, Any], Sequence[Any]]:
        if inner is None:
            raise AttributeError(f"{type(self.reader).__name__} reads no rows by index ({name}): the cache reads spans")
        read = inner

        def rows_of_copy(shard: str, rows: Any) -> Sequence[Any]:
            return self._read(lambda path, _start, _stop: read(path, rows), shard, 0, 0)

        return rows_of_copy

    def _read(self, read: Callable[[str, int, int], Sequence[Any]], shard: str, start: int, stop: int) -> Sequence[Any]:
        path = self.fetch(shard)
        try:
            return read(str(path), start, stop)
        except Exception as error:  # a reader may wrap the FileNotFoundError (ParquetReader: ShardReadError)
            if path.exists():
                raise self._through(error, shard, path) from error
        # The copy went between fetch and open (evicted by a process that does not pin it): fetched again.
        path = self.fetch(shard)
        try:
            return read(str(path), start, stop)
        except Exception as error:
            raise self._through(error, shard, path) from error

    def _through(self, error: Exception, shard: str, path: Path) -> ShardReadError:
        """The inner reader's error on the local copy, naming the shard (its URL) where it named the copy."""
        message = str(error).replace(repr(str(path)), repr(shard)).replace(str(path), shard)
        if shard not in message:
            message = f"could not read shard {shard!r}: {message}"
        return ShardReadError(
            f"{message} (read through the node cache in {str(self.directory)!r}, from a verified copy of the "
            f"bytes downloaded from {shard!r})"
        )

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
        """The local copy of ``shard``, fetched unless present and sealed; waits for another process's download."""
        return cast(Path, self._fetch(shard, True))  # a demand fetch always fetches

    def stats(self) -> CacheStats:
        """Transfers from storage logged in this directory (every process on the node)."""
        try:
            lines = _read_text(self.directory / "fetched.log").splitlines()
        except FileNotFoundError:
            return CacheStats(0, 0)
        return CacheStats(len(lines), sum(int(line.split(" ", 1)[0]) for line in lines))

    def wait(self) -> None:
        """Wait for this process's prefetches (tests and benchmarks; training never needs to)."""
        for future in self._pending:
            future.exception()
        self._pending = []

    def _key(self, shard: str, stored: StoredIdentity | None = None) -> tuple[str, int]:
        """(the key of the shard's copy, its size) as this process's run knows the shard (or of version ``stored``)."""
        stored = self._entry(shard).stored if stored is None else stored
        return hashlib.sha256(f"{shard}\0{stored}".encode()).hexdigest()[:32], stored.size or 0

    def _path(self, shard: str) -> Path:
        return self.directory / f"{self._key(shard)[0]}.shard"

    def _fetch(self, shard: str, demand: bool, stored: StoredIdentity | None = None) -> Path | None:
        """The copy of the version this run reads (of ``stored``: a look-up that reads the copy, the run's
        version not decided yet), fetched unless present and sealed."""
        stored = self._entry(shard).stored if stored is None else stored
        key, size = self._key(shard, stored)
        path = self.directory / f"{key}.shard"
        if self._sealed(path, size):
            _touch(path.with_suffix(".seal"))
            return path
        with _locked(self.directory / f"{key}.lock"):
            if self._sealed(path, size) or self._reseal(path, size):  # another process fetched it meanwhile
                return path
            _remove(path)  # not the cache's copy (truncated, replaced, a symbolic link), or not there
            reserved = self._reserve(key, size, demand)
            if reserved is None:
                return None
            part, target = reserved
            try:
                with target:
                    self._download(shard, part, target, path, stored)
            except BaseException as error:
                part.unlink(missing_ok=True)
                if isinstance(error, Exception) and not isinstance(error, ShardReadError):
                    raise ShardReadError(f"could not fetch shard {shard!r} into {self.directory}: {error}") from error
                raise
        return path

    def _download(self, shard: str, part: Path, target: IO[bytes], path: Path, expected: StoredIdentity) -> None:
        """Copy the shard into ``part`` (held by this process), refusing another version than ``expected``, the
        run's; rename it into place and seal it."""
        digest, size = hashlib.sha256(), 0
        with remote.open_shard(shard, self.storage_options) as source:
            found = remote.opened_identity(shard, source, self.storage_options)
            if found != expected:
                raise _changed(shard, expected, found)
            while chunk := source.read(_CHUNK):
                target.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        target.truncate()
        target.flush()
        if expected.size is not None and size != expected.size:
            raise ShardReadError(f"shard {shard!r} gave {size} bytes, but storage says it holds {expected.size}")
        os.replace(part, path)
        copy = os.fstat(target.fileno())  # after the rename, which moves the change time
        _write_atomic(path.with_suffix(".seal"), json.dumps({"sha256": digest.hexdigest(), **_seal_of(copy)}))
        self._log(size, shard)

    def _sealed(self, path: Path, size: int) -> bool:
        """The copy is the file the cache wrote (not a symbolic link, not rewritten, truncated or replaced)."""
        seal = _read_json(path.with_suffix(".seal"))
        try:
            copy = os.lstat(path)
        except FileNotFoundError:
            return False
        return (
            isinstance(seal, dict)
            and stat.S_ISREG(copy.st_mode)
            and (size == 0 or copy.st_size == size)
            and all(seal.get(name) == value for name, value in _seal_of(copy).items())
        )

    def _reseal(self, path: Path, size: int) -> bool:
        """A regular copy of the right size whose seal no longer matches (copied with ``cp -a``, an inode
        renumbered, a ``chmod``) is kept if its bytes hash as they did when downloaded; sealed again then."""
        seal = _read_json(path.with_suffix(".seal"))
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except OSError:  # not there, or a symbolic link (ELOOP)
            return False
        with os.fdopen(fd, "rb") as copy:
            found = os.fstat(copy.fileno())
            if (
                not isinstance(seal, dict)
                or not stat.S_ISREG(found.st_mode)
                or found.st_size != seal.get("size")
                or (size and found.st_size != size)
                or _sha256(copy) != seal.get("sha256")
            ):
                return False
        _write_atomic(path.with_suffix(".seal"), json.dumps({"sha256": seal["sha256"], **_seal_of(found)}))
        return True

    def _reserve(self, key: str, size: int, demand: bool) -> tuple[Path, IO[bytes]] | None:
        """Make room for ``size`` bytes, evicting done shards; a demand fetch gets room regardless.
        The reservation is a sparse part file of the shard's size, so concurrent fetches count it, created
        (``O_EXCL``) and locked by this process under the cache's lock: a part nobody holds is a dead
        process's, whatever its PID namespace."""
        with _locked(self.directory / "cache.lock"):
            files = [entry for entry in os.scandir(self.directory) if ".shard" in entry.name or ".part-" in entry.name]
            for entry in files:
                if ".part-" in entry.name and _abandoned(Path(entry.path)):
                    _remove(Path(entry.path))  # a download whose process died
            sizes = {entry.path: _size(entry) for entry in files}  # a download may rename its part meanwhile
            used = sum(sizes.values())
            if used + size > self.max_bytes:
                pinned = self._pinned()
                done = sorted(
                    (entry for entry in files if entry.name.endswith(".shard") and entry.name[:-6] not in pinned),
                    key=lambda entry: _mtime(Path(entry.path).with_suffix(".seal")),
                )
                for entry in done:
                    if used + size <= self.max_bytes:
                        break
                    used -= sizes[entry.path]
                    _remove(Path(entry.path))
                    _remove(Path(entry.path).with_suffix(".seal"))
                if used + size > self.max_bytes and not demand:
                    return None
            part = self.directory / f"{key}.part-{secrets.token_hex(8)}"
            target = _create_held(part, "r+b")
            target.truncate(size)
        return part, target

    # -- the node's manifest

    def _entry(self, shard: str, *, content: bool = False, counts: bool = False) -> _Entry:
        self._resolve([shard], content=content, counts=counts)
        return self._known[shard]

    def _resolve(self, shards: Sequence[str], *, content: bool, counts: bool) -> None:
        """Know each shard's stored identity for this run (and its content identity and count when asked),
        from the node's manifest where it has them for this start, else by looking them up (in threads, for
        URLs) and adding them to it."""
        reads_metadata = callable(getattr(self.reader, "metadata", None))

        def lacking(shard: str) -> bool:
            entry = self._known.get(shard)
            return (
                entry is None
                or (content and reads_metadata and entry.content is None)
                or (counts and entry.count is None)
            )

        todo = [shard for shard in dict.fromkeys(shards) if lacking(shard)]
        if not todo:
            return
        with _locked(self.directory / "manifest.lock"):
            generation, table = self._manifest()
            changed = False
            if self._user is None and self._join():
                generation, changed = generation + 1, True  # the first process of a start: look URLs up anew

            def run_view(shard: str) -> StoredIdentity | None:
                """The stored identity this run reads the shard as, where it is decided already."""
                if shard in self._known:
                    return self._known[shard].stored
                row = table.get(shard)
                if remote.is_url(shard) and row is not None and row["generation"] == generation:
                    return _stored_of(row)
                return None

            jobs = [partial(self._look_up, shard, run_view(shard), table.get(shard), content, counts) for shard in todo]
            urls = sum(remote.is_url(shard) for shard in todo)
            if urls > 1:
                with ThreadPoolExecutor(min(_LOOKUPS, urls), thread_name_prefix="shard-lookup") as pool:
                    found = list(pool.map(lambda job: job(), jobs))
            else:
                found = [job() for job in jobs]
            for shard, (entry, moved) in zip(todo, found):
                row = {"size": entry.stored.size, "version": entry.stored.version, "count": entry.count,
                       "content": entry.content, "generation": generation}  # fmt: skip
                changed |= table.get(shard) != row
                table[shard] = row
                self._known[shard] = entry
                if moved is not None:
                    self._log(moved, shard)
            if changed:
                _write_atomic(self.directory / "manifest.json",
                              json.dumps({"version": _MANIFEST_VERSION, "generation": generation, "shards": table}))  # fmt: skip

    def _look_up(
        self, shard: str, view: StoredIdentity | None, row: dict[str, Any] | None, content: bool, counts: bool
    ) -> tuple[_Entry, int | None]:
        """The shard's entry, with what was read from storage to make it (bytes; None when nothing was read but a
        stat). ``view``: the stored identity this run reads the shard as, if decided; ``row``: the manifest's."""
        before = remote.thread_transferred()
        metadata = getattr(self.reader, "metadata", None) if content else None
        known = None if row is None else _Entry(_stored_of(row), row["count"], row["content"])
        if view is None and (metadata is None or known is not None or reads_whole_shard(metadata)):
            # A stat (one HEAD) first where the node knows a version (unchanged, its metadata is reused), or
            # where the metadata is read from the node's copy (which the version names).
            view = remote.stored_identity(shard, self.storage_options)
        entry = known if known is not None and known.stored == view else None
        moved = None  # bytes read from storage for the metadata or count (not the copy's download, logged apart)
        downloaded = 0
        copy: str | None = None

        def source(method: Callable[[str], Any], stored: StoredIdentity) -> str:
            """What ``method`` reads: the node's copy of version ``stored`` when it scans the whole shard (a cold
            node then downloads the shard once, not once to count it and again to read it), else the shard."""
            nonlocal copy, downloaded
            if not reads_whole_shard(method):
                return shard
            if copy is None:
                start = remote.thread_transferred()
                copy = str(self._fetch(shard, True, stored))
                downloaded = remote.thread_transferred() - start
            return copy

        if metadata is not None and (entry is None or entry.content is None):
            where = source(metadata, cast(StoredIdentity, view))
            read: ShardMetadata = metadata(where)  # one read gives the stored identity and the content
            if where != shard:  # the copy's own identity is the local file's: its download checked it is ``view``
                read = replace(read, stored=cast(StoredIdentity, view))
            elif view is not None and read.stored != view:
                raise _changed(shard, view, read.stored)
            base = known if known is not None and known.stored == read.stored else _Entry(read.stored)
            count = read.count if read.count is not None else base.count
            entry = _Entry(read.stored, count, read.content)
            moved = 0 if where == shard else moved
        if entry is None:
            entry = _Entry(cast(StoredIdentity, view))
        if counts and entry.count is None:
            where = source(self.reader.count, entry.stored)
            entry = replace(entry, count=self.reader.count(where))
            moved = 0 if where == shard else moved
        return entry, None if moved is None else remote.thread_transferred() - before - downloaded

    def _manifest(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """(the generation, the table of shards) of the node's manifest; empty when absent or unreadable."""
        data = _read_json(self.directory / "manifest.json")
        if not isinstance(data, dict) or data.get("version") != _MANIFEST_VERSION:
            return 0, {}
        return int(data["generation"]), dict(data["shards"])

    def _join(self) -> bool:
        """Hold ``users.lock`` shared while this cache lives; True when no other cache held it (a start: the
        manifest's URLs are looked up anew). Called under ``manifest.lock``, so the test and the shared hold
        are one step for every other process."""
        self._user = _open_held(self.directory / "users.lock")
        try:
            fcntl.flock(self._user, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(self._user, fcntl.LOCK_SH)
        return alone

    def _log(self, size: int, shard: str) -> None:
        fd = os.open(self.directory / "fetched.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "a") as log:
            log.write(f"{size} {shard}\n")

    # -- pins

    def _pin(self, keys: list[str], asked: int) -> None:
        """Write the pin of the ``asked``-th window entered, unless a later window's is written already: a pin
        left behind the reads in the prefetch thread must not unpin the window the reader went on to."""
        with self._lock():
            if self._pin_pid != os.getpid():  # a forked worker pins under its own name
                self._pin_name, self._pin_pid, self._pin_written = secrets.token_hex(8), os.getpid(), 0
                with _locked(self.directory / "cache.lock"):  # created and held before any reaper can see it
                    self._pin_holder = _create_held(self.directory / "pins" / f"{self._pin_name}.lock", "rb")
            if asked < self._pin_written:
                return
            _write_atomic(self.directory / "pins" / f"{self._pin_name}.json", json.dumps(keys))
            self._pinned_now, self._pin_written = frozenset(keys), asked

    def _holds(self, keys: Sequence[str]) -> bool:
        """This process's pin file holds ``keys`` (a forked worker has no pin of its parent's)."""
        return self._pin_pid == os.getpid() and self._pinned_now.issuperset(keys)

    def _pinned(self) -> set[str]:
        """The shards pinned by live readers; the pins of dead processes (their lock free) are removed."""
        pins = self.directory / "pins"
        kinds: dict[str, set[str]] = {}
        for entry in os.scandir(pins):
            name, _, kind = entry.name.rpartition(".")
            if kind in ("json", "lock"):
                kinds.setdefault(name, set()).add(kind)
        pinned: set[str] = set()
        for name, found in kinds.items():
            if "lock" not in found or _abandoned(pins / f"{name}.lock"):
                for kind in found:
                    _remove(pins / f"{name}.{kind}")
            elif "json" in found:
                keys = _read_json(pins / f"{name}.json")
                pinned.update(keys if isinstance(keys, list) else [])
        return pinned

    def _lock(self) -> threading.Lock:
        if self._pin_lock is None or self._pin_lock[0] != os.getpid():  # a forked worker's own, never held at fork
            self._pin_lock = (os.getpid(), threading.Lock())
        return self._pin_lock[1]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool[0] != os.getpid():  # a forked worker has no thread of its parent's
            self._pool = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch"))
        return self._pool[1]


def _changed(shard: str, expected: StoredIdentity, found: StoredIdentity) -> ShardReadError:
    return ShardReadError(
        f"shard {shard!r} changed on storage during this run: the run identified it as {str(expected)!r}, storage "
        f"now holds {str(found)!r}; the node cache serves one version of a shard per run and never mixes two: "
        f"start the run again once every process of the node has stopped (a state saved before the change is "
        f"then refused, naming the shard)"
    )


def _stored_of(row: dict[str, Any]) -> StoredIdentity:
    return StoredIdentity(row["size"], row["version"])


def _seal_of(copy: os.stat_result) -> dict[str, int]:
    """What any change to a file moves: its size, inode, and modification and change times."""
    return {"size": copy.st_size, "inode": copy.st_ino, "mtime_ns": copy.st_mtime_ns, "ctime_ns": copy.st_ctime_ns}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with _open_held(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _open_held(path: Path) -> IO[bytes]:
    """A lock file of the cache, created if absent, never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ShardReadError(
                f"{str(path)!r} is a symbolic link: the cache never follows one inside its directory; remove it"
            ) from error
        raise
    return os.fdopen(fd, "rb")


def _create_held(path: Path, mode: str) -> IO[bytes]:
    """A new file (``O_EXCL``, never through a symbolic link), locked by this process until it closes it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return os.fdopen(fd, mode)


def _abandoned(path: Path) -> bool:
    """No process holds ``path``'s lock: its owner died (a symbolic link is nobody's)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _sha256(file: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := file.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _read_text(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd) as file:
        return file.read()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except (OSError, ValueError):  # absent, a symbolic link, or damaged: as if absent
        return None


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(f"{path.name}.tmp-{secrets.token_hex(8)}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(part, path)


def _remove(path: Path) -> None:
    """Unlink ``path`` (a symbolic link itself, not what it points to); absent is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _touch(path: Path) -> None:
    try:
        os.utime(path, follow_symlinks=False)
    except FileNotFoundError:
        pass


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0


def _mtime(path: Path) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except FileNotFoundError:
        return 0
