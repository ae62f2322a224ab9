"""Window reading: each shard of a window read once, then records built at (shard, row) from the spans.

Apart from the stream's passes and state (``dataset.py``): this is the only part that touches storage,
and the part that decides what a first batch waits for.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from stateful_sampler.order.shards import EpochWindows, distinct
from stateful_sampler.stream.readers import ShardReader, ShardReadError, rows_reader, rows_span_reader, span_reader
from stateful_sampler.stream.remote import is_url

Spans = dict[int, tuple[int, Sequence[Any]]]  # shard -> (its first row read, the span of its rows)
Joined = tuple[Sequence[Any], np.ndarray]  # the spans joined, and each shard's base row in the join
# The most records a worker builds at once: a window's first chunk is one batch (the first batch waits
# for no more), each next one twice the last, up to this (fewer, larger conversions; bounded memory).
CHUNK_RECORDS = 1024
# The threads that read a first batch's remote shards side by side (``read_rows_span``): each of its ~60 small
# reads waits on storage. Local shards are read one after another: a local read is a file opened, a footer parsed
# and a row group decoded, tens of µs, where handing it to a thread and back cost more (a first batch over 63
# local parquet shards: 25 ms of wall in 4 threads, 15 ms in one, and a third of the CPU).
READ_THREADS = 4


class WindowGather:
    """Reads the spans a window needs from ``reader`` and builds the records of a chunk from them.

    Example:
        >>> from stateful_sampler.stream.readers import JsonlReader
        >>> import json, pathlib, tempfile
        >>> shard = pathlib.Path(tempfile.mkdtemp(), "a.jsonl")
        >>> _ = shard.write_text("".join(json.dumps({"x": i}) + "\\n" for i in range(5)))
        >>> gather = WindowGather(JsonlReader(), [str(shard)], [5])
        >>> shards, rows = np.array([0, 0]), np.array([3, 1])
        >>> spans = gather.read(shards, rows, [0])
        >>> gather.records(spans, join_spans(spans, 1), shards, rows)
        [{'x': 3}, {'x': 1}]
    """

    def __init__(self, reader: ShardReader, shards: Sequence[str], counts: Sequence[int]) -> None:
        self.reader = reader
        self.shards = shards
        self.counts = counts
        self.read_rows = rows_reader(reader)  # looked up once: a resume over many sources asks it for each
        self.read_rows_span = rows_span_reader(reader)

    def announce(self, windows: EpochWindows, window: int) -> None:
        """Tell a reader that fetches ahead (``ShardCache``) this window's shards, in the order ``read``
        reads them, and the next one's."""
        enter = getattr(self.reader, "enter_window", None)
        if enter is not None:
            names = [[self.shards[s] for s in windows.window_shards(w).tolist()] for w in (window, window + 1)]
            enter(names[0], names[1])

    def read(self, shards: np.ndarray, rows: np.ndarray, read_order: list[int]) -> Spans:
        """Per shard of the window, (first row, the span of rows needed), each read once, in the window's
        order (the order ``announce`` gave, in which ``ShardCache`` fetches ahead)."""
        read = span_reader(self.reader)
        method = getattr(read, "__name__", "read")
        spans: Spans = {}
        rank = {shard: i for i, shard in enumerate(read_order)}
        for shard in sorted(distinct(shards).tolist(), key=lambda shard: rank.get(shard, len(rank))):
            needed = rows[shards == shard]
            start, stop = int(needed.min()), int(needed.max()) + 1
            name = self.shards[shard]
            try:
                span = read(name, start, stop)
            except ShardReadError:
                raise
            except Exception as error:
                raise ShardReadError(f"could not read rows {start}..{stop - 1} of shard {name!r}: {error}") from error
            if not hasattr(span, "__len__") or not hasattr(span, "__getitem__"):
                raise TypeError(
                    f"{type(self.reader).__name__}.{method}({name!r}, {start}, {stop}) returned a "
                    f"{type(span).__name__}, not a sequence: {method} must return the {stop - start} records of "
                    f"rows {start}..{stop - 1} of shard {name!r} as a list (wrap a generator in list(...))"
                )
            if len(span) != stop - start:
                raise ShardReadError(
                    f"shard {name!r} returned {len(span)} records for rows {start}..{stop - 1}, expected "
                    f"{stop - start}: it holds fewer than the {self.counts[shard]} records counted at start"
                )
            spans[shard] = (start, span)
        return spans

    @property
    def reads_rows(self) -> bool:
        """The reader reads records at given rows without their window (``read_rows``)."""
        return self.read_rows is not None

    def records_at_rows(self, shards: np.ndarray, rows: np.ndarray) -> list[Any]:
        """The records at (shard, row) read on their own, each shard once (``read_rows``): a pass's first
        batch, which then waits for its own records only. A reader with ``read_rows_span`` builds the batch's
        records in one conversion of their joined spans, and reads the shards side by side in threads where
        one of them is a URL (``reads_in_threads``)."""
        slots_of: dict[int, list[int]] = {}  # grouped in Python: a batch's rows are few, NumPy calls cost more
        for slot, shard in enumerate(shards.tolist()):
            slots_of.setdefault(shard, []).append(slot)
        order = sorted(slots_of)
        wheres = [np.array(slots_of[shard], dtype=np.int64) for shard in order]
        spanned = self.read_rows_span is not None

        def read(shard: int, where: np.ndarray) -> Sequence[Any]:
            return self.shard_rows(shard, rows[where], as_span=spanned)

        joins = spanned and len(order) > 1
        if joins and self.reads_in_threads(order):
            with ThreadPoolExecutor(min(READ_THREADS, len(order))) as pool:
                found = list(pool.map(read, order, wheres))
        else:
            found = [read(shard, where) for shard, where in zip(order, wheres)]
        if joins:
            spans: Spans = {shard: (0, span) for shard, span in zip(order, found)}
            joined = join_spans(spans, len(self.shards))
            if joined is not None:  # row k of the join is slot concatenate(wheres)[k] of the batch
                slots = np.argsort(np.concatenate(wheres))
                return self._convert(joined[0], slots, lambda: f"the first batch's shards {self._names(spans)}")
        records: list[Any] = [None] * len(rows)
        for where, span in zip(wheres, found):
            for slot, record in zip(where.tolist(), span[:] if spanned else span):
                records[slot] = record
        return records

    def reads_in_threads(self, shards: Sequence[int]) -> bool:
        """Whether a first batch over ``shards`` reads them side by side in threads: where one is a URL (a read that
        waits on storage, or on a ``ShardCache``'s download), not where all are local files (see ``READ_THREADS``).

        Example:
            >>> from stateful_sampler.stream.readers import ParquetReader
            >>> gather = WindowGather(ParquetReader(), ["a.parquet", "s3://bucket/b.parquet"], [4, 4])
            >>> gather.reads_in_threads([0]), gather.reads_in_threads([0, 1])
            (False, True)
        """
        return any(is_url(self.shards[shard]) for shard in shards)

    def shard_rows(self, shard: int, rows: np.ndarray, as_span: bool = False) -> Sequence[Any]:
        """The records at ``rows`` of shard ``shard``, read on their own (``read_rows``): one shard's part of
        ``records_at_rows``, for a caller that groups its rows by shard itself (``MixedStream``'s first batch,
        over many sources' readers at once). ``as_span``: the reader's span of them (``read_rows_span``), its
        records built when taken."""
        read_rows = self.read_rows_span if as_span else self.read_rows
        if read_rows is None:
            raise TypeError(f"{type(self.reader).__name__} has no read_rows(shard, rows): read its window instead")
        name = self.shards[shard]
        try:
            found = read_rows(name, rows)
        except ShardReadError:
            raise
        except Exception as error:
            raise ShardReadError(f"could not read {self._rows_of(shard, rows)}: {error}") from error
        if len(found) != len(rows):
            raise ShardReadError(
                f"shard {name!r} returned {len(found)} records for {len(rows)} rows: it holds fewer than the "
                f"{self.counts[shard]} records counted at start"
            )
        return found

    def records(self, spans: Spans, joined: Joined | None, shards: np.ndarray, rows: np.ndarray) -> list[Any]:
        """The records at (shard, row) from the window's spans: from their join when they have one (one
        ``records_at`` for the chunk), else one ``records_at(rows)`` per shard for a span that has it
        (``ParquetSpan``), or indexing."""
        if joined is not None:
            span, bases = joined
            return self._convert(span, bases[shards] + rows, lambda: f"the window's shards {self._names(spans)}")
        if len(spans) == 1:  # one shard (window 1, or the padding): no interleaving to undo
            ((shard, (start, span)),) = spans.items()
            return self._convert(span, rows - start, lambda: self._rows_of(shard, rows))
        taken: list[Any] = []  # each shard's records in turn, then put back in the chunk's order
        slots = []
        for shard in distinct(shards).tolist():
            where = np.flatnonzero(shards == shard)
            start, span = spans[shard]
            taken += self._convert(span, rows[where] - start, lambda: self._rows_of(shard, rows[where]))  # noqa: B023 - called at once
            slots.append(where)
        if len(taken) == 1:
            return taken
        return list(operator.itemgetter(*np.argsort(np.concatenate(slots)).tolist())(taken))

    def _convert(self, span: Sequence[Any], offsets: np.ndarray, where: Callable[[], str]) -> list[Any]:
        records_at = getattr(span, "records_at", None)
        try:
            records = list(records_at(offsets)) if records_at is not None else [span[row] for row in offsets.tolist()]
        except ShardReadError:
            raise
        except Exception as error:
            raise ShardReadError(f"could not build the records of {where()}: {error}") from error
        if len(records) != len(offsets):
            raise ShardReadError(
                f"{type(span).__name__}.records_at returned {len(records)} records for {len(offsets)} of {where()}"
            )
        return records

    def _rows_of(self, shard: int, rows: np.ndarray) -> str:
        return f"rows {int(rows.min())}..{int(rows.max())} of shard {self.shards[shard]!r}"

    def _names(self, spans: Spans) -> str:
        return ", ".join(repr(self.shards[shard]) for shard in spans)


def join_spans(spans: Spans, shards: int) -> Joined | None:
    """The window's spans as one, when their type can ``join`` them (``ParquetSpan``: one table, its
    columns contiguous), with each shard's base: window row = base[shard] + shard row. A chunk is then
    one ``records_at`` call, and records taken from contiguous columns build faster than a read of the
    shards in row order does. None for a single span, or spans that do not join (other schemas)."""
    parts = list(spans.values())
    join = getattr(type(parts[0][1]), "join", None)
    if len(parts) < 2 or join is None or any(type(span) is not type(parts[0][1]) for _, span in parts):
        return None
    try:
        joined = join([span for _, span in parts])
    except (TypeError, ValueError):  # pyarrow: shards of other schemas; gather from each span instead
        return None
    bases, base = np.zeros(shards, dtype=np.int64), 0
    for shard, (start, span) in spans.items():
        bases[shard], base = base - start, base + len(span)
    return joined, bases


def chunk_bounds(length: int, batch_size: int) -> Iterator[tuple[int, int]]:
    """[begin, end) of each chunk of ``length`` records: one batch, then doubling up to ``CHUNK_RECORDS``.

    Example:
        >>> list(chunk_bounds(10, 2))
        [(0, 2), (2, 6), (6, 10)]
    """
    begin, size = 0, batch_size
    while begin < length:
        yield begin, min(begin + size, length)
        begin, size = begin + size, min(2 * size, max(batch_size, CHUNK_RECORDS))
