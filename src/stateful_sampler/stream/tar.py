"""``TarReader``: WebDataset tar shards, one record per group of files sharing a key, read by seeking.

A tar has no table of contents, so the first reader of a shard scans its member headers once and
writes an index (per record: its key and each file's suffix, data offset and size) beside the shard,
or in a cache directory when the shard is remote or its directory read-only. Every later count and
span comes from the index: a span maps the shard (or reads its byte range once, when remote) and
slices the files of the rows taken, so a resumed stream reads its first batch without scanning.

Records are grouped exactly as ``webdataset`` groups them (``tariterators.group_by_keys`` with
``base_plus_ext``): the key is the member's path up to the first dot of its file name, the suffix the
rest, lower-cased; consecutive members with one key are one record; members without a dot, that are
not regular files, or named ``__...__`` are skipped. A record is a dict of bytes:
``{"__key__": "a/000001", "__url__": shard, "jpg": b"...", "cls": b"3"}``; decoding is the stream's
``transform``, as with webdataset's ``.decode()``.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import re
import secrets
import tarfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateful_sampler.errors import ShardReadError
from stateful_sampler.stream.formats import SlicedSpan, content_identity, digest, rows_of_span, user_cache_dir
from stateful_sampler.stream.readers import ReadStats, ShardMetadata, scans_shard
from stateful_sampler.stream.remote import StoredIdentity, is_url, open_shard, stored_identity

_INDEX_FORMAT = "stateful-sampler tar index"
_INDEX_VERSION = 2
_FINGERPRINT_SAMPLES = 16  # member headers hashed to recognise an unchanged shard whose mtime was touched
_BLOCK = 512
_INDEXES_KEPT = 32  # indexes a reader keeps in memory (a window's shards, and some)
# webdataset's rules (tariterators.py): what is skipped, and how a name splits into key and suffix.
_SKIP_META = re.compile(r"__[^/]*__($|/)")
_KEY_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass(frozen=True)
class TarIndex:
    """Where each record's files lie in a tar: record ``r`` is ``keys[r]`` with the files
    ``bounds[r] .. bounds[r + 1] - 1``, file ``f`` being ``suffixes[f]`` at ``offsets[f]``, ``sizes[f]`` bytes."""

    keys: list[str]
    bounds: list[int]
    suffixes: list[str]
    offsets: list[int]
    sizes: list[int]
    size: int  # the tar's size in bytes
    end: int  # offset of the end-of-archive block
    headers: list[int]  # offsets of the sampled member headers of the fingerprint

    @property
    def digest(self) -> str:
        """What the content identity takes from the index: every record's key and files."""
        return digest(self.keys, self.bounds, self.suffixes, self.offsets, self.sizes, self.end)


def split_name(name: str) -> tuple[str | None, str | None]:
    """(key, suffix) of a member name as webdataset's ``base_plus_ext``: (None, None) without a dot."""
    match = _KEY_SUFFIX.match(name)
    return (match.group(1), match.group(2)) if match else (None, None)


def scan_tar(file: Any, shard: str) -> TarIndex:
    """The index of a tar read from ``file`` (seekable), grouped as webdataset groups it; a truncated
    or corrupt tar (a bad header, no end-of-archive block) raises ``ShardReadError`` naming ``shard``."""
    keys: list[str] = []
    bounds: list[int] = [0]
    suffixes: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    headers: list[int] = []
    try:
        size = file.seek(0, io.SEEK_END)
        file.seek(0)
        if file.read(2) == b"\x1f\x8b":
            raise ShardReadError(
                f"shard {shard!r} is a gzip-compressed tar: TarReader reads uncompressed tars (it seeks to "
                f"each record); decompress it once (gunzip) or read it with a reader that scans"
            )
        file.seek(0)
        with tarfile.open(fileobj=file, mode="r:") as archive:
            for info in archive:
                headers.append(info.offset)
                name = info.name
                if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                if _SKIP_META.match(name):
                    continue
                key, suffix = split_name(name)
                if key is None or suffix is None:
                    continue
                suffix = suffix.lower()
                if not keys or keys[-1] != key:
                    keys.append(key)
                    bounds.append(bounds[-1])
                if suffix in suffixes[bounds[-2] :] or suffix in ("__key__", "__url__"):
                    raise ShardReadError(f"shard {shard!r}: {name}: duplicate file name for key {key!r} ({suffix})")
                bounds[-1] += 1
                suffixes.append(suffix)
                offsets.append(info.offset_data)
                sizes.append(info.size)
                archive.members = []  # type: ignore[attr-defined]  # an index, not a list of TarInfo, is kept
            end = archive.offset
        file.seek(end)
        marker = file.read(_BLOCK)
    except ShardReadError:
        raise
    except Exception as error:  # tarfile.ReadError for a bad first header, OSError from the storage
        raise ShardReadError(f"could not read tar shard {shard!r}: {error}") from error
    if len(marker) != _BLOCK or marker.count(0) != _BLOCK:
        raise ShardReadError(
            f"tar shard {shard!r} is truncated or corrupt at byte {end} of {size}: a member header or the "
            f"end-of-archive block should be there, after {len(headers)} members"
        )
    step = max(1, len(headers) // _FINGERPRINT_SAMPLES)
    return TarIndex(keys, bounds, suffixes, offsets, sizes, size, end, [*headers[::step], *headers[-1:]])


def fingerprint(file: Any, index: TarIndex) -> str:
    """A hash of the sampled member headers and the end-of-archive block: what tells an index still
    fits a shard whose modification time changed (a cache touches its copies) but not its bytes."""
    hashed = hashlib.sha256()
    for offset in (*index.headers, index.end):
        file.seek(offset)
        hashed.update(file.read(_BLOCK))
    return hashed.hexdigest()[:32]


@dataclass
class TarReader:
    """WebDataset tar shards (uncompressed ``.tar``), by path or URL, through an index built once per shard.

    The index of a local shard is written beside it (``a.tar`` -> ``a.tar.tarindex``; a ``ShardCache`` copy
    ``<key>.shard`` -> ``<key>.tarindex``, outside the cache's size accounting); of a remote shard, or one
    in a read-only directory, in ``index_dir`` (default ``~/.cache/stateful-sampler/tar-index``). It is
    written atomically, so concurrent builders never see half an index, and rebuilt when the shard
    changes. ``version`` and ``checksums`` join the content identity, as for ``ParquetReader``. Under a
    ``ShardCache`` the index is built from the node's copy (``metadata`` is ``@scans_shard``): a cold node
    downloads each shard once, and counts, identifies and reads it from there.

    Example:
        >>> stream = ShardedStream(["s3://bucket/train-000.tar", ...], TarReader(), batch_size=32,
        ...                        transform=decode)  # doctest: +SKIP
        >>> next(iter(stream))  # doctest: +SKIP
        {"__key__": "000017", "__url__": "s3://...", "jpg": b"...", "cls": b"3"}
    """

    storage_options: dict[str, Any] | None = None
    index_dir: str | os.PathLike[str] | None = None
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def __post_init__(self) -> None:
        # shard -> (its file identity, its index), the last few used: an index costs memory per record.
        self._indexes: OrderedDict[str, tuple[str, TarIndex]] = OrderedDict()
        # shard -> (its file identity, records, index digest): what count and identity need, from the
        # index file's first line, so a stream built on many shards does not parse every index.
        self._summaries: dict[str, tuple[str, int, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_indexes": OrderedDict(), "_summaries": {}}

    @scans_shard
    def count(self, shard: str) -> int:
        return self._summary(shard, stored_identity(shard, self.storage_options))[0]

    def identity(self, shard: str) -> str:
        """The file's size and modification time (or ETag), and the digest of its index: every record's
        key and its files' names, offsets and sizes; then ``version`` and the shard's checksum."""
        return self.identity_from(shard, self.metadata(shard))

    @scans_shard
    def metadata(self, shard: str) -> ShardMetadata:
        """The stored identity, the index's digest and the records, from the index (the shard's member
        headers scanned once, when it has none that fits): under a ``ShardCache``, of the node's copy."""
        stored = stored_identity(shard, self.storage_options)
        records, index_digest = self._summary(shard, stored)
        return ShardMetadata(stored, f"tar={index_digest}", records)

    def identity_from(self, shard: str, metadata: ShardMetadata) -> str:
        """The identity of a shard whose metadata is ``metadata``, with this reader's ``version`` and checksums."""
        return content_identity(shard, str(metadata.stored), metadata.content, self.version, self.checksums)

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        return self.read_span(shard, start, stop).records_at(list(range(stop - start)))

    def read_rows(self, shard: str, rows: Sequence[int] | Any) -> list[Any]:
        """The records at ``rows``, in that order, decoding only them (see ``formats.rows_of_span``): a first
        batch after a resume waits for its own records, not for its window's shards."""
        return rows_of_span(self.read_span, shard, rows)

    def read_span(self, shard: str, start: int, stop: int) -> SlicedSpan:
        """Records ``start .. stop - 1``; each record's files are sliced from the shard when it is taken."""
        index = self.index(shard)
        if not 0 <= start <= stop <= len(index.keys):
            raise ShardReadError(f"rows {start}..{stop - 1} are outside tar shard {shard!r} of {len(index.keys)}")
        self.stats.opened += 1
        self.stats.rows += stop - start
        if start == stop:
            return SlicedSpan(0, lambda row: None, self.stats)
        bounds, offsets, sizes, suffixes = index.bounds, index.offsets, index.sizes, index.suffixes
        low = offsets[bounds[start]]  # a tar's members lie in order: the span's files lie between these
        high = max(offsets[f] + sizes[f] for f in range(bounds[stop - 1], bounds[stop]))
        self.stats.bytes += high - low
        buffer, base = self._bytes(shard, low, high)

        def record(row: int) -> dict[str, Any]:
            built: dict[str, Any] = {"__key__": index.keys[start + row], "__url__": shard}
            for f in range(bounds[start + row], bounds[start + row + 1]):
                built[suffixes[f]] = bytes(buffer[offsets[f] - base : offsets[f] - base + sizes[f]])
            return built

        return SlicedSpan(stop - start, record, self.stats)

    def index(self, shard: str) -> TarIndex:
        """The shard's index: from memory, from its index file while it fits the shard, else built."""
        stored = str(stored_identity(shard, self.storage_options))
        known = self._indexes.get(shard)
        if known is not None and known[0] == stored:
            self._indexes.move_to_end(shard)
            return known[1]
        loaded = self._load(shard, stored, whole=True)
        index = loaded[1] if loaded is not None else None
        if index is None:
            with self._open(shard) as file:
                index = scan_tar(file, shard)
                self._save(shard, stored, index, fingerprint(file, index))
        self._indexes[shard] = (stored, index)
        self._summaries[shard] = (stored, len(index.keys), index.digest)
        while len(self._indexes) > _INDEXES_KEPT:
            self._indexes.popitem(last=False)
        return index

    def _summary(self, shard: str, identity: StoredIdentity) -> tuple[int, str]:
        """(records, index digest) of the shard's bytes ``identity``: from memory, the index file's first line,
        or the index built."""
        stored = str(identity)
        known = self._summaries.get(shard)
        if known is None or known[0] != stored:
            loaded = self._load(shard, stored, whole=False)
            if loaded is not None:
                self._summaries[shard] = (stored, loaded[0]["records"], loaded[0]["digest"])
            else:
                self.index(shard)
        _, records, index_digest = self._summaries[shard]
        return records, index_digest

    def index_paths(self, shard: str) -> list[Path]:
        """Where the shard's index may be, in the order looked in: beside a local shard, then ``index_dir``."""
        name = hashlib.sha256((shard if is_url(shard) else os.path.abspath(shard)).encode()).hexdigest()[:32]
        in_cache = Path(self.index_dir) if self.index_dir is not None else user_cache_dir("tar-index")
        if is_url(shard) or self.index_dir is not None:
            return [in_cache / f"{name}.tarindex"]
        path = Path(shard)
        beside = path.with_name(f"{path.name.removesuffix('.shard')}.tarindex")
        return [beside, in_cache / f"{name}.tarindex"]

    def _open(self, shard: str) -> Any:
        raw = open_shard(shard, self.storage_options)
        # A remote shard is scanned through a large buffer: its headers are read in a few ranges.
        return raw if not is_url(shard) else io.BufferedReader(raw, 8 << 20)

    def _load(self, shard: str, stored: str, whole: bool) -> tuple[dict[str, Any], TarIndex | None] | None:
        """(the index file's header, the index when ``whole``) of the first index file that fits the shard.
        The file is a header line (what count and identity need, and what tells it fits) and a body line."""
        for path in self.index_paths(shard):
            try:
                with open(path, "rb") as file:
                    header = json.loads(file.readline())
                    if header.get("format") != _INDEX_FORMAT or header.get("version") != _INDEX_VERSION:
                        continue
                    if not self._fits(shard, stored, header):
                        continue
                    if not whole:
                        return header, None
                    body = json.loads(file.readline())
            except (OSError, ValueError, AttributeError):  # absent, half a file from another version, not JSON
                continue
            index = TarIndex(body["keys"], body["bounds"], body["suffixes"], body["offsets"], body["sizes"],
                             header["size"], header["end"], header["headers"])  # fmt: skip
            return header, index
        return None

    def _fits(self, shard: str, stored: str, header: dict[str, Any]) -> bool:
        """The index was built from these bytes: the same file identity, or (a local shard whose mtime
        was touched) the same size and the same sampled member headers."""
        if header["stored"] == stored:
            return True
        if is_url(shard) or not stored.startswith(f"size={header['size']};"):
            return False  # remote: the ETag or size changed; local: the size changed
        sampled = TarIndex([], [0], [], [], [], header["size"], header["end"], header["headers"])
        with self._open(shard) as file:
            return bool(fingerprint(file, sampled) == header["fingerprint"])

    def _save(self, shard: str, stored: str, index: TarIndex, headers_hash: str) -> None:
        header = {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "shard": shard, "stored": stored,
                  "fingerprint": headers_hash, "size": index.size, "end": index.end, "headers": index.headers,
                  "records": len(index.keys), "digest": index.digest}  # fmt: skip
        body = {"keys": index.keys, "bounds": index.bounds, "suffixes": index.suffixes, "offsets": index.offsets,
                "sizes": index.sizes}  # fmt: skip
        text = f"{json.dumps(header)}\n{json.dumps(body, separators=(',', ':'))}\n"
        for path in self.index_paths(shard):
            # A random name: two containers sharing the disk may run builders of the same pid.
            part = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                part.write_text(text)
                os.replace(part, path)  # atomic: a concurrent builder's index is the same, whichever lands
                return
            except OSError:  # a read-only directory: the next place
                part.unlink(missing_ok=True)
        # Nowhere writable: the index lives in this process only (each process scans the shard once).

    def _bytes(self, shard: str, low: int, high: int) -> tuple[Any, int]:
        """(a buffer holding bytes ``low .. high`` of the shard, the shard offset of its first byte): a
        memory map of a local shard, the range read in one request from a remote one."""
        try:
            if not is_url(shard):
                with open(shard, "rb") as file:
                    if os.fstat(file.fileno()).st_size < high:
                        raise ShardReadError(f"tar shard {shard!r} is shorter than its index ({high} bytes): truncated")
                    return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), 0
            with open_shard(shard, self.storage_options) as file:
                file.seek(low)
                data = file.read(high - low)
        except ShardReadError:
            raise
        except Exception as error:
            raise ShardReadError(f"could not read bytes {low}..{high} of tar shard {shard!r}: {error}") from error
        if len(data) != high - low:
            raise ShardReadError(f"tar shard {shard!r} ended at byte {low + len(data)}, before {high}: truncated")
        return data, low
