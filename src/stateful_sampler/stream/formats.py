"""What the format readers (tar, Arrow, MDS, LitData) share: the content identity they report, the
span that slices records out of one buffer, and where a reader keeps the files it derives from a shard.

Kept apart from ``readers.py`` so each format module depends on a few small, public seams only.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import operator
import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from stateful_sampler.errors import ShardReadError
from stateful_sampler.stream.readers import ReadStats
from stateful_sampler.stream.remote import is_url, open_shard

T = TypeVar("T")


def directory_index(
    root: str, storage_options: Mapping[str, Any] | None, what: str, fields: Callable[[Any], T]
) -> tuple[Callable[..., str], str, T]:
    """The ``index.json`` of a directory of shards (MDS, LitData), by path or URL: the ``join`` that names
    its shards, the index file's name, and ``fields(index)``. An index that does not parse, or lacks what
    ``fields`` reads, is a ``ShardReadError`` naming the file and ``what`` it should be."""
    join = posixpath.join if is_url(root) else os.path.join
    index_file = join(root, "index.json")
    try:
        with open_shard(index_file, storage_options) as file:
            return join, index_file, fields(json.loads(file.read()))
    except ShardReadError:
        raise
    except (ValueError, KeyError, TypeError) as error:
        raise ShardReadError(f"{index_file!r} is not {what}: {error}") from error


def content_identity(
    shard: str, stored: str, content: str, version: str | None, checksums: Mapping[str, str] | None
) -> str:
    """One string for the stream's state: the storage's identity of the bytes (``stored``), what the
    format says about them (``content``), and the user's version and checksum when given."""
    parts = [stored, content]
    if version is not None:
        parts.append(f"version={version}")
    if checksums is not None:
        if shard not in checksums:
            raise ValueError(f"checksums has no entry for shard {shard!r}: give one per shard, or none")
        parts.append(f"checksum={checksums[shard]}")
    return ";".join(parts)


def digest(*parts: object) -> str:
    """A short, stable hash of ``parts`` (their ``repr``), for the content part of an identity."""
    return hashlib.sha256("\0".join(repr(part) for part in parts).encode()).hexdigest()[:32]


def user_cache_dir(kind: str) -> Path:
    """``$XDG_CACHE_HOME/stateful-sampler/<kind>`` (``~/.cache/...``): where a derived file goes when
    the shard's own directory is remote or read-only."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stateful-sampler" / kind


class SlicedSpan(Sequence[Any]):
    """Records ``start .. stop - 1`` of a shard whose records are byte ranges of one buffer (a memory map
    of the shard, or the bytes of the span read at once): ``decode(buffer, row)`` builds the record at
    ``row`` (an offset into the span) only when it is taken."""

    def __init__(self, length: int, decode: Callable[[int], Any], stats: ReadStats) -> None:
        self._length = length
        self._decode = decode
        self._stats = stats

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.records_at(range(self._length)[index])
        row = operator.index(index)
        if not -self._length <= row < self._length:
            raise IndexError(f"row {row} is outside this span of {self._length} rows")
        return self.records_at([row % self._length])[0]

    def records_at(self, rows: Sequence[int] | Any) -> list[Any]:
        """The records at ``rows`` (offsets into the span, a list or an integer array), in that order."""
        offsets = rows.tolist() if hasattr(rows, "tolist") else list(rows)
        records = [self._decode(row) for row in offsets]
        self._stats.converted += len(records)
        return records


def rows_of_span(read_span: Callable[[str, int, int], Any], shard: str, rows: Sequence[int] | Any) -> list[Any]:
    """The records at ``rows`` of ``shard``, in that order, through a span from the first to the last of them
    whose records are decoded only when taken (``SlicedSpan`` over a memory map): the ``read_rows`` of a format
    with an offset per record (MDS, LitData, an indexed tar), which touches the asked records' bytes alone
    (a remote shard's span is read in one request). A row outside the shard raises the span's ``ShardReadError``.
    """
    offsets = [int(row) for row in (rows.tolist() if hasattr(rows, "tolist") else rows)]
    if not offsets:
        return []
    low = min(offsets)
    span = read_span(shard, low, max(offsets) + 1)
    return list(span.records_at([row - low for row in offsets]))


def shard_bytes(shard: str, storage_options: Mapping[str, Any] | None) -> Any:
    """The shard's bytes: a read-only memory map of a local file (nothing read until sliced), the whole
    object read once from a remote one. ``ShardReadError`` naming the shard if it cannot be read."""
    try:
        if not is_url(shard):
            with open(shard, "rb") as file:
                if os.fstat(file.fileno()).st_size == 0:
                    return b""
                return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        with open_shard(shard, storage_options) as file:
            return file.read()
    except ShardReadError:
        raise
    except Exception as error:
        raise ShardReadError(f"could not read shard {shard!r}: {error}") from error


def item_offsets(data: Any, shard: str, count: int | None, end: int | None = None) -> Any:
    """The item offsets of an MDS or LitData shard (``uint32`` item count, then ``count + 1`` ``uint32``
    offsets, then the items, which end at ``end``, the file's end by default): checked against the file,
    so a truncated or corrupt shard raises ``ShardReadError`` naming it instead of yielding wrong records."""
    import numpy as np

    size = len(data) if end is None else end
    items = int(np.frombuffer(data, np.uint32, 1)[0]) if size >= 4 else -1
    header = 4 + 4 * (items + 1)
    if items < 0 or header > size:
        raise ShardReadError(f"shard {shard!r} is truncated or corrupt: {size} bytes cannot hold its item table")
    if count is not None and items != count:
        raise ShardReadError(f"shard {shard!r} holds {items} items, its index says {count}: corrupt or replaced")
    offsets = np.frombuffer(data, np.uint32, items + 1, 4).astype(np.int64)
    if offsets[0] < header or (np.diff(offsets) < 0).any() or offsets[-1] != size:
        raise ShardReadError(
            f"shard {shard!r} is truncated or corrupt: its items end at byte {int(offsets[-1])}, the file has {size}"
        )
    return offsets


def by_shard(entries: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Index entries by shard path, and by file name where the name is unique: a reader finds a shard's
    entry whether it is given the path it listed or another URL of the file, and never another split's."""
    names: dict[str, list[dict[str, Any]]] = {}
    for path, entry in entries:
        names.setdefault(_name(path), []).append(entry)
    table = {name: found[0] for name, found in names.items() if len(found) == 1}
    table.update(entries)
    return table


def entry_of(table: Mapping[str, dict[str, Any]], shard: str) -> dict[str, Any] | None:
    """The entry of ``shard`` in a ``by_shard`` table; None for a renamed copy (a ShardCache's)."""
    return table.get(shard) or table.get(_name(shard))


def _name(path: str) -> str:
    return posixpath.basename(path.replace("\\", "/"))
