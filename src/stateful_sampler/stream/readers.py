"""Shard readers: the small protocol the stream reads through, parquet via pyarrow, and JSON Lines.

A reader answers two questions: how many records a shard holds (asked once per shard, when the
stream is built) and which records lie in rows [start, stop) of a shard. The stream asks the
second once per shard per window and reader, for the span of rows that reader needs there, and
builds the window's records batch by batch: a span that converts records only when asked
(``read_span``, ``ParquetSpan``) makes the first batch wait for one batch's conversion, not the
window's.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from stateful_sampler.errors import ShardReadError
from stateful_sampler.extras import missing_extra
from stateful_sampler.stream.remote import StoredIdentity, is_url, open_shard, opened_identity, stored_identity


@runtime_checkable
class ShardReader(Protocol):
    def count(self, shard: str) -> int:
        """The records in ``shard``, from metadata where the format has it."""
        ...

    def read(self, shard: str, start: int, stop: int) -> Sequence[Any]:
        """Records ``start .. stop - 1`` of ``shard``, in row order."""
        ...


# Optional, looked up with getattr, so a reader with only count and read still works:
#   identity(shard) -> str: what identifies the shard's content (size and modification time, a
#       footer, an ETag, a version); the stream's state keeps a hash of it and refuses a resume on
#       a shard whose identity changed.
#   known_count(shard) -> int | None: the records the last identity(shard) read with it (parquet: the
#       footer's), None when that read did not say; the stream checks a given ``counts=`` against it.
#   metadata(shard) -> ShardMetadata and identity_from(shard, metadata) -> str: identity in two steps,
#       the read of the shard's metadata (what its bytes are) and the reader's own settings (version,
#       checksums) joined to it; ``ShardCache`` reads the first once per node and asks the second in
#       each process, so a setting changed in one process changes that process's identity.
#   prepare(shards, counts=...): called once with the stream's shards before their counts (when
#       ``counts=True``) and identities are asked, so a reader can look them all up at once (``ShardCache``).
#   enter_window(shards, next_shards): called before each window, so a reader can fetch ahead and
#       release what is done (``ShardCache``).
#   A method marked ``@scans_shard`` (``count``, ``metadata``) reads the whole shard: ``ShardCache`` calls it
#       on the node's copy, so a cold node downloads the shard once (not once to count, again to read).
#   read_span(shard, start, stop) -> Sequence: the same records as ``read``, as a sequence that may
#       build them only when indexed; with ``records_at(rows)`` it builds many in one call. The stream
#       reads through it (see ``span_reader``), so a window is decoded once and converted batch by batch.
#       A span type with a ``join(spans)`` classmethod (``ParquetSpan``) has a window's spans joined into one.
#   read_rows(shard, rows) -> Sequence: the records at ``rows`` (in that order), reading only what holds
#       them (parquet: their row groups). The first batch of a pass is read through it, so a resume waits
#       for that batch's records, not for its window's shards.
#   read_rows_span(shard, rows) -> span: the records of ``read_rows`` as a span of a type with ``join``
#       (``ParquetSpan``), safe to call from several threads: the first batch reads remote shards side by side
#       (local ones one after another, see ``gather.READ_THREADS``), joins their spans and builds its records in
#       one conversion.


@dataclass(frozen=True)
class ShardMetadata:
    """What one read of a shard's metadata says: the storage's identity of the bytes read (``stored``),
    what the format says of them (``content``: a footer's digest), and the records they hold when the
    format says so without a full read (parquet's footer; None for JSON Lines)."""

    stored: StoredIdentity
    content: str
    count: int | None


@dataclass
class ReadStats:
    """What one reader process read: shards opened, rows decoded and bytes (compressed, from metadata),
    and records converted to Python (``converted``: with ``read_span``, only the rows taken)."""

    opened: int = 0
    rows: int = 0
    bytes: int = 0
    converted: int = 0

    def add_read(self, rows: int, read_bytes: int) -> None:
        """One shard opened for ``rows`` rows of ``read_bytes``: safe from the threads that read a first batch's
        shards side by side (``read_rows_span``)."""
        with _STATS_LOCK:
            self.opened, self.rows, self.bytes = self.opened + 1, self.rows + rows, self.bytes + read_bytes


_STATS_LOCK = threading.Lock()  # one for every reader: a first batch's reads add to their stats once each


Method = TypeVar("Method", bound=Callable[..., Any])


def scans_shard(method: Method) -> Method:
    """Marks a reader's ``count`` or ``metadata`` that reads the whole shard (a tar's member headers, an Arrow
    stream's batches, JSON Lines' lines). A ``ShardCache`` calls a marked method on the node's copy of the
    shard, which the reads then use: a cold node downloads each shard once. An override in a subclass is
    unmarked until it is marked itself.

    Example:
        >>> class Lines:
        ...     @scans_shard
        ...     def count(self, shard): return sum(1 for _ in open(shard))
        >>> reads_whole_shard(Lines().count), reads_whole_shard(len)
        (True, False)
    """
    method.scans_shard = True  # type: ignore[attr-defined]
    return method


def reads_whole_shard(method: Any) -> bool:
    """``method`` (a reader's bound ``count`` or ``metadata``) is marked ``@scans_shard``."""
    return getattr(method, "scans_shard", False) is True


def identity_in_two_steps(reader: Any) -> bool:
    """The reader's ``identity(shard)`` is ``identity_from(shard, metadata(shard))``: it has both, and no
    ``identity`` overridden below the class that defines them (a subclass that adds to its identity keeps
    it: ``ShardCache`` then asks that ``identity``, once per process)."""
    if not callable(getattr(reader, "metadata", None)) or not callable(getattr(reader, "identity_from", None)):
        return False
    return _defined_with(reader, "identity_from", "identity")


def _defined_with(reader: Any, method: str, other: str) -> bool:
    """``method`` is defined in the class that defines ``other``, or below it (so it knows of it)."""
    own = getattr(reader, "__dict__", {})
    if other in own and method not in own:
        return False
    mro = type(reader).__mro__
    method_owner = next((owner for owner in mro if method in vars(owner)), None)
    other_owner = next((owner for owner in mro if other in vars(owner)), None)
    if method_owner is None or other_owner is None:  # set on the instance, or provided by __getattr__
        return True
    return issubclass(method_owner, other_owner)


def span_reader(reader: Any) -> Callable[[str, int, int], Sequence[Any]]:
    """``reader.read_span`` when it has one, else ``reader.read``. A ``read`` overridden below the class
    that defines ``read_span`` (a subclass of ``ParquetReader`` that filters or logs its records) is what
    the records are, so it wins: the faster path never skips a user's own ``read``."""
    span = getattr(reader, "read_span", None)
    if span is None or not _defined_with(reader, "read_span", "read"):
        return cast(Callable[[str, int, int], Sequence[Any]], reader.read)
    return cast(Callable[[str, int, int], Sequence[Any]], span)


def rows_span_reader(reader: Any) -> Callable[[str, np.ndarray], Sequence[Any]] | None:
    """``reader.read_rows_span`` where it reads what ``read`` and ``read_rows`` would (neither overridden below
    the class that defines it, see ``span_reader``), else None."""
    read_rows_span = getattr(reader, "read_rows_span", None)
    if read_rows_span is None or rows_reader(reader) is None:
        return None
    if not (_defined_with(reader, "read_rows_span", "read") and _defined_with(reader, "read_rows_span", "read_rows")):
        return None
    return cast(Callable[[str, np.ndarray], Sequence[Any]], read_rows_span)


def rows_reader(reader: Any) -> Callable[[str, np.ndarray], Sequence[Any]] | None:
    """``reader.read_rows`` for a random-access format (parquet row groups), else None; None too when
    ``read`` is overridden below the class that defines ``read_rows`` (see ``span_reader``)."""
    read_rows = getattr(reader, "read_rows", None)
    if read_rows is None or not _defined_with(reader, "read_rows", "read"):
        return None
    return cast(Callable[[str, np.ndarray], Sequence[Any]], read_rows)


def rows_in_pieces(shard: str, sizes: Sequence[int], rows: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a shard stored in pieces of ``sizes`` rows (parquet row groups, Arrow record batches): the pieces that
    hold ``rows``, in order, and each row's offset in those pieces read one after another. A row past the
    shard's end raises ``ShardReadError`` naming the shard (it holds fewer records than were counted).

    Example:
        >>> pieces, offsets = rows_in_pieces("a", [4, 4, 4], [9, 1, 2])
        >>> pieces.tolist(), offsets.tolist()
        ([0, 2], [5, 1, 2])
    """
    wanted = np.asarray(rows, dtype=np.int64)
    lengths = np.asarray(sizes, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    if len(wanted) and (wanted.min() < 0 or wanted.max() >= total):
        raise ShardReadError(
            f"shard {shard!r} holds {total} records, rows {int(wanted.min())}..{int(wanted.max())} were asked: it "
            f"holds fewer than were counted at start"
        )
    piece_of = np.searchsorted(ends, wanted, side="right")
    pieces = np.flatnonzero(np.bincount(piece_of, minlength=len(lengths)))  # np.unique imports numpy.ma
    # Each piece's first row in the shard, and in the pieces read one after another.
    in_shard = ends[pieces] - lengths[pieces]
    in_read = np.cumsum(lengths[pieces]) - lengths[pieces]
    at = np.searchsorted(pieces, piece_of)
    return pieces, wanted - in_shard[at] + in_read[at]


class ParquetSpan(Sequence[dict[str, Any]]):
    """Rows of a parquet shard decoded to columns (a ``pyarrow.Table``); the records (dicts, as
    ``to_pylist`` makes them) are built only for the rows asked. Columnar decoding is cheap, building
    Python objects is not: the stream reads a window's spans at once and converts a batch at a time."""

    def __init__(self, table: Any, stats: ReadStats) -> None:
        self.table = table
        self._stats = stats
        self._gatherable: Any = None  # the table as records_at takes from it, made at its first call

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.records_at(list(range(len(self))[index]))
        row = operator.index(index)
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} is outside this span of {len(self)} rows")
        return self.records_at([row % len(self)])[0]

    @classmethod
    def join(cls, spans: Sequence[ParquetSpan]) -> ParquetSpan:
        """The spans one after another as one span, its columns in one contiguous block (a window's
        spans, which the stream then takes from in one call per chunk). Spans of other schemas raise."""
        import pyarrow as pa

        return cls(pa.concat_tables([span.table for span in spans]).combine_chunks(), spans[0]._stats)

    def records_at(self, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The records at ``rows`` (a list or an integer array of offsets into the span), in that order,
        in one conversion."""
        if not len(rows):
            return []
        if self._gatherable is None:
            self._gatherable = fixed_size_lists(self.table)
        records = cast(list[dict[str, Any]], self._gatherable.take(row_indices(rows)).to_pylist())
        self._stats.converted += len(records)
        return records


def row_indices(rows: Sequence[int] | Any) -> Any:
    """``rows`` as an int64 arrow array, built from its buffer: ``pyarrow.array`` (and ``take`` given a
    list or a numpy array, which calls it) imports pandas at its first call, 0.6 s that a process
    without pandas would pay at its first batch after a resume.

    Example:
        >>> row_indices([3, 1]).to_pylist()
        [3, 1]
    """
    import pyarrow as pa

    offsets = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(offsets), [None, pa.py_buffer(offsets)])


def fixed_size_lists(table: Any) -> Any:
    """``table`` with each list column whose lists all have one length (an embedding, a token block)
    and no nulls as a fixed-size list column: the same records, but a ``take`` copies each row's values
    as one block, where arrow's ``take`` of a variable-size list gathers them one value at a time (about
    ten times the cost at 64 floats a row, which a shuffled order pays on every record)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for index, column in enumerate(table.columns):
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or column.null_count:
            continue
        lengths = pc.list_value_length(column)
        if not len(lengths):
            continue
        bounds = pc.min_max(lengths).as_py()
        if bounds["min"] != bounds["max"]:
            continue
        fixed = pa.list_(column.type.value_field, bounds["max"])
        try:
            cast_column = column.cast(fixed)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a pyarrow that cannot cast it: take as it is
            continue
        table = table.set_column(index, table.field(index).with_type(fixed), cast_column)
    return table


@dataclass
class ParquetReader:
    """Parquet shards through pyarrow: counts from the footer, reads by whole row groups.

    Records are dicts of column values (``pyarrow.Table.to_pylist``); ``columns`` selects some.
    Shards are paths or URLs (``s3://``, ``gs://``, ``https://``, ``file://``; fsspec with
    ``storage_options``). ``version`` (a dataset version) and ``checksums`` (shard -> checksum you
    computed) join the content identity, which the stream's state checks on resume; a checksum takes
    the place of the modification time (or ETag), so a touched or copied shard with the same bytes is
    still the same shard.

    Example:
        >>> reader = ParquetReader(columns=["x", "y"], storage_options={"anon": True})  # doctest: +SKIP
    """

    columns: list[str] | None = None
    storage_options: dict[str, Any] | None = None
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def __post_init__(self) -> None:
        # The metadata the last count read, which the next identity of that shard takes (one read for
        # both when the stream asks for them in turn), and the count the last identity read.
        self._counted: tuple[str, ShardMetadata] | None = None
        self._identified: tuple[str, int | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_counted": None, "_identified": None}

    def count(self, shard: str) -> int:
        metadata = self.metadata(shard)
        self._counted = (shard, metadata)
        return cast(int, metadata.count)

    def identity(self, shard: str) -> str:
        """The file's size and modification time (or ETag) and its footer: writer, schema, key-value
        metadata, and per row group its rows, sizes and each column chunk's min/max statistics; then
        ``version`` and the shard's checksum (see ``identity_from``)."""
        counted, self._counted = self._counted, None
        metadata = counted[1] if counted is not None and counted[0] == shard else self.metadata(shard)
        self._identified = (shard, metadata.count)
        return self.identity_from(shard, metadata)

    def known_count(self, shard: str) -> int | None:
        """The rows of ``shard``'s footer as the last ``identity(shard)`` read it (None for another shard)."""
        return self._identified[1] if self._identified is not None and self._identified[0] == shard else None

    def metadata(self, shard: str) -> ShardMetadata:
        """The footer alone, and the stored identity of the bytes it was read from (one HEAD and two exact
        ranged reads on S3)."""
        stored, metadata = _footer(shard, self.storage_options)
        schema = [(c.path, c.physical_type, str(c.logical_type)) for c in metadata.schema]
        groups = ",".join(_row_group(metadata.row_group(i)) for i in range(metadata.num_row_groups))
        digest = hashlib.sha256(
            f"{metadata.created_by}\0{metadata.num_rows}\0{groups}\0{schema}\0"
            f"{sorted((metadata.metadata or {}).items())}".encode()
        ).hexdigest()[:32]
        return ShardMetadata(stored, f"parquet={digest}", int(metadata.num_rows))

    def identity_from(self, shard: str, metadata: ShardMetadata) -> str:
        """The identity of a shard whose metadata is ``metadata``, with this reader's ``version`` and checksums."""
        return _identity(self, shard, metadata)

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        records = cast(list[dict[str, Any]], self._table(shard, start, stop).to_pylist())
        self.stats.converted += len(records)
        return records

    def read_span(self, shard: str, start: int, stop: int) -> ParquetSpan:
        """Rows ``start .. stop - 1`` decoded to columns; records are built as they are taken."""
        return ParquetSpan(self._table(shard, start, stop), self.stats)

    def lengths(self, shard: str, column: str) -> np.ndarray:
        """Each record's length of the list column ``column``, reading that column alone (``PackedStream`` plans
        a shard's rows from them before it reads any record)."""
        with _Parquet(shard, self.storage_options) as parquet:
            self.stats.opened += 1
            try:
                values = parquet.read(columns=[column]).column(0)
            except Exception as error:  # a missing column is ArrowInvalid or KeyError, a corrupt file OSError
                raise ShardReadError(f"could not read column {column!r} of shard {shard!r}: {error}") from error
        import pyarrow.compute as pc

        return np.asarray(pc.list_value_length(values).to_numpy(zero_copy_only=False), dtype=np.int64)

    def read_rows(self, shard: str, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The records at ``rows`` of ``shard``, in that order, decoding only the row groups they lie in: a
        first batch after a resume waits for its own row groups, not for its window's shards."""
        return self.read_rows_span(shard, rows)[:]

    def read_rows_span(self, shard: str, rows: Sequence[int] | np.ndarray) -> ParquetSpan:
        """The records of ``read_rows`` as columns, built when taken (the first batch joins its shards' spans)."""
        with _Parquet(shard, self.storage_options) as parquet:
            metadata = parquet.metadata
            groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
            pieces, offsets = rows_in_pieces(shard, [group.num_rows for group in groups], rows)
            taken = [groups[index] for index in pieces.tolist()]
            try:
                # One thread: a row group or two, where starting arrow's pool's tasks costs more than it saves.
                table = parquet.read_row_groups(pieces.tolist(), columns=self.columns, use_threads=False)
            except Exception as error:  # pyarrow raises OSError or ArrowInvalid for a corrupt file
                raise ShardReadError(f"could not read rows of shard {shard!r}: {error}") from error
        self.stats.add_read(sum(group.num_rows for group in taken), sum(
            group.column(c).total_compressed_size for group in taken for c in range(group.num_columns)))  # fmt: skip
        return ParquetSpan(table.take(row_indices(offsets)), self.stats)

    def _table(self, shard: str, start: int, stop: int) -> Any:
        """Rows ``start .. stop - 1`` as a ``pyarrow.Table``, reading the whole row groups they lie in."""
        with _Parquet(shard, self.storage_options) as parquet:
            self.stats.opened += 1
            metadata = parquet.metadata
            groups, first_row, row = [], None, 0
            for index in range(metadata.num_row_groups):
                group = metadata.row_group(index)
                if row < stop and row + group.num_rows > start:
                    groups.append(index)
                    first_row = row if first_row is None else first_row
                    self.stats.rows += group.num_rows
                    self.stats.bytes += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
                row += group.num_rows
            try:
                table = parquet.read_row_groups(groups, columns=self.columns)
            except Exception as error:  # pyarrow raises OSError or ArrowInvalid for a corrupt file
                raise ShardReadError(f"could not read rows {start}..{stop - 1} of shard {shard!r}: {error}") from error
        return table.slice(start - (first_row or 0), stop - start)


@dataclass
class JsonlReader:
    """JSON Lines shards (one JSON value per line), by path or URL, optionally gzip-compressed (``.gz``).

    ``count`` reads the whole shard (JSON Lines has no footer): for remote shards pass ``counts=``
    to the stream, or each shard is read once more to count it (under a ``ShardCache``, the node's
    copy, which the reads then use). ``read`` scans to ``stop`` and decodes only rows ``start .. stop - 1``;
    ``read_rows`` decodes only the rows asked (a resume's first batch: its own records, not a window's span).

    Example:
        >>> stream = ShardedStream(["s3://bucket/a.jsonl"], JsonlReader(), batch_size=8)  # doctest: +SKIP
    """

    storage_options: dict[str, Any] | None = None
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    @scans_shard
    def count(self, shard: str) -> int:
        with self._lines(shard) as lines:
            return sum(1 for line in lines if line.strip())

    def identity(self, shard: str) -> str:
        """Size and modification time (or ETag) of the file (JSON Lines has no footer to read), then
        ``version`` and the shard's checksum (see ``identity_from``)."""
        return self.identity_from(shard, self.metadata(shard))

    def metadata(self, shard: str) -> ShardMetadata:
        """The stored identity alone (a stat; a HEAD on S3): counting the records would read the whole shard."""
        return ShardMetadata(stored_identity(shard, self.storage_options), "jsonl", None)

    def identity_from(self, shard: str, metadata: ShardMetadata) -> str:
        """The identity of a shard whose metadata is ``metadata``, with this reader's ``version`` and checksums."""
        return _identity(self, shard, metadata)

    def read(self, shard: str, start: int, stop: int) -> list[Any]:
        return self._decoded(shard, range(start, stop), stop)

    def read_rows(self, shard: str, rows: Sequence[int] | np.ndarray) -> list[Any]:
        """The records at ``rows`` (any order, repeated or not): the shard is scanned to the last of them, and
        only their lines are decoded, so a resume's first batch decodes its own records, not a window's span.
        A row past the shard's end raises ``ShardReadError`` naming the shard."""
        wanted = np.asarray(rows, dtype=np.int64).tolist()
        if not wanted:
            return []
        last = max(wanted)
        if min(wanted) < 0:
            raise ShardReadError(f"shard {shard!r}: row {min(wanted)} was asked; rows start at 0")
        distinct = set(wanted)
        records = self._decoded(shard, distinct, last + 1)  # in the shard's order: the distinct rows ascending
        if len(records) < len(distinct):
            raise ShardReadError(
                f"shard {shard!r} ends before row {last}, which was asked: it holds fewer records than were "
                f"counted at start"
            )
        decoded = dict(zip(sorted(distinct), records))
        return [decoded[row] for row in wanted]

    def _decoded(self, shard: str, rows: range | set[int], stop: int) -> list[Any]:
        """The records of the shard's rows in ``rows`` (all below ``stop``), in the shard's order: the lines
        are scanned to row ``stop``, and only those rows' are decoded."""
        self.stats.opened += 1
        records: list[Any] = []
        with self._lines(shard) as lines:
            row = 0
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                if row >= stop:
                    break
                if row in rows:
                    try:
                        records.append(json.loads(line))
                    except ValueError as error:
                        raise ShardReadError(
                            f"shard {shard!r} line {number} (row {row}) is not JSON: {error}"
                        ) from error
                    self.stats.bytes += len(line)
                row += 1
        self.stats.rows += len(records)
        self.stats.converted += len(records)
        return records

    @contextmanager
    def _lines(self, shard: str) -> Iterator[Iterator[bytes]]:
        """The shard's lines, unzipped when its bytes are gzip's (by their magic number, not the name:
        ``ShardCache`` hands the reader a copy whose name has no ``.gz``)."""
        with open_shard(shard, self.storage_options) as raw:
            file = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, 1 << 20)
            if file.peek(2)[:2] != _GZIP_MAGIC:
                yield file
                return
            with gzip.open(file) as unzipped:
                yield unzipped


def _identity(reader: Any, shard: str, metadata: ShardMetadata) -> str:
    """One string for the stream's state: the storage's identity of the bytes, what the format says
    about them, and the user's version and checksum when given. A checksum identifies the content by
    itself, so with ``checksums`` the modification time (or ETag) is left out: a copied or touched
    shard with the same bytes keeps its identity."""
    if reader.checksums is not None and shard not in reader.checksums:
        raise ValueError(f"checksums has no entry for shard {shard!r}: give one per shard, or none")
    stored = f"size={metadata.stored.size}" if reader.checksums is not None else str(metadata.stored)
    parts = [stored, metadata.content]
    if reader.version is not None:
        parts.append(f"version={reader.version}")
    if reader.checksums is not None:
        parts.append(f"checksum={reader.checksums[shard]}")
    return ";".join(parts)


def _footer(shard: str, storage_options: Mapping[str, Any] | None) -> tuple[StoredIdentity, Any]:
    """The parquet footer alone, in two exact reads (its length, then it), so counting a remote
    shard moves its footer's bytes and no more (pyarrow would read the last 64 KiB); and the stored
    identity of the bytes it was read from."""
    pq = _parquet_module()
    import pyarrow as pa

    with open_shard(shard, storage_options) as file:
        stored = opened_identity(shard, file, storage_options)
        try:
            size = file.seek(0, io.SEEK_END)
            file.seek(max(size - 8, 0))
            tail = file.read(8)
            length = int.from_bytes(tail[:4], "little")
            if len(tail) != 8 or tail[4:] != b"PAR1" or length + 12 > size:
                raise ValueError("not a parquet file: no PAR1 footer")
            file.seek(size - 8 - length)
            footer = file.read(length)
            return stored, pq.read_metadata(pa.py_buffer(b"PAR1" + footer + tail))
        except ShardReadError:
            raise
        except Exception as error:  # ValueError above, ArrowInvalid for a corrupt footer
            raise ShardReadError(f"could not open shard {shard!r}: {error}") from error


_GZIP_MAGIC = b"\x1f\x8b"


def _row_group(group: Any) -> str:
    chunks = []
    for c in range(group.num_columns):
        column = group.column(c)
        statistics = column.statistics
        bounds = (
            (statistics.min, statistics.max, statistics.null_count) if statistics and statistics.has_min_max else ()
        )
        chunks.append(f"{column.total_compressed_size}:{bounds}")
    return f"{group.num_rows}/{group.total_byte_size}[{' '.join(chunks)}]"


def _parquet_module() -> Any:
    """``pyarrow.parquet``, imported at first use (importing the stream does not need it), or the
    ``pip install`` of the ``stream`` extra that brings it. ``pyarrow.compute`` comes with it: the
    ``take`` of ``ParquetSpan.records_at`` needs it, and importing it at a first batch costs tens of ms."""
    try:
        import pyarrow.compute  # noqa: F401
        import pyarrow.parquet as pq
    except ModuleNotFoundError as error:
        raise missing_extra(error, "stream", "stateful_sampler.stream.ParquetReader") from error
    return pq


def _open_native(shard: str) -> Any:
    """A local shard as an arrow file: pyarrow reads it without a call back into Python for each range (a
    Python file costs a first batch's ~100 small reads about a third of their time)."""
    import pyarrow as pa

    try:
        return pa.OSFile(shard, "rb")
    except FileNotFoundError as error:
        raise ShardReadError(f"could not open shard {shard!r}: not found ({error})") from error
    except Exception as error:  # PermissionError, IsADirectoryError, ...
        raise ShardReadError(f"could not open shard {shard!r}: {error}") from error


class _Parquet:
    """``pyarrow.parquet.ParquetFile`` over a path or URL, closed with its file."""

    def __init__(self, shard: str, storage_options: Mapping[str, Any] | None) -> None:
        pq = _parquet_module()
        local = not is_url(shard)
        self._file = _open_native(shard) if local else open_shard(shard, storage_options)
        try:
            # A local file's column chunks are read where they lie: pre-buffering them (coalesced reads on arrow's IO
            # threads, which a remote file's ranged reads gain from) made a first batch's 64 reads 20-30% slower here.
            self.parquet = pq.ParquetFile(self._file, pre_buffer=not local)
        except Exception as error:  # ArrowInvalid for a file that is not parquet
            self._file.close()
            raise ShardReadError(f"could not open shard {shard!r}: {error}") from error

    def __enter__(self) -> Any:
        return self.parquet

    def __exit__(self, *exc: object) -> None:
        self.parquet.close()
        self._file.close()
