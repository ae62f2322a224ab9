"""``ArrowReader``: Arrow IPC shards (the stream format and the file format, Feather v2), memory-mapped
where local; a saved HF ``datasets.Dataset`` and the ``datasets`` cache files read directly.

``datasets.Dataset.save_to_disk`` writes ``data-XXXXX-of-NNNNN.arrow`` files and the ``datasets`` cache
``cache-*.arrow`` files: both are Arrow IPC *streams* of record batches, with the dataset's features
in the schema's metadata. ``saved_dataset_shards`` lists a saved dataset's files, in its order.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stateful_sampler.errors import ShardReadError
from stateful_sampler.extras import missing_extra
from stateful_sampler.stream.formats import content_identity, digest
from stateful_sampler.stream.readers import (
    ParquetSpan,
    ReadStats,
    ShardMetadata,
    row_indices,
    rows_in_pieces,
    scans_shard,
)
from stateful_sampler.stream.remote import is_url, open_shard, stored_identity

_FILE_MAGIC = b"ARROW1"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # what closing a stream writes (Arrow >= 0.15)


def saved_dataset_shards(directory: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The Arrow files of a ``datasets.Dataset.save_to_disk`` directory (path or URL), in the dataset's
    order, from its ``state.json`` (``_data_files``).

    Example:
        >>> shards = saved_dataset_shards("/data/my_dataset/train")  # doctest: +SKIP
        >>> stream = ShardedStream(shards, ArrowReader(), batch_size=32)  # doctest: +SKIP
    """
    join = posixpath.join if is_url(directory) else os.path.join
    state_file = join(directory, "state.json")
    try:
        with open_shard(state_file, storage_options) as file:
            state = json.loads(file.read())
    except ShardReadError as error:
        dict_file = join(directory, "dataset_dict.json")
        try:
            with open_shard(dict_file, storage_options) as file:
                splits = json.loads(file.read()).get("splits", [])
        except (ShardReadError, ValueError):
            raise ShardReadError(
                f"directory {directory!r} has no state.json: it is not a datasets.Dataset.save_to_disk directory"
            ) from error
        raise ValueError(
            f"directory {directory!r} holds a DatasetDict (splits {splits}): pass one split's directory, "
            f"e.g. {join(directory, splits[0]) if splits else directory!r}"
        ) from error
    except ValueError as error:
        raise ShardReadError(f"{state_file!r} is not JSON: {error}") from error
    files = state.get("_data_files")
    if not isinstance(files, list) or not all(isinstance(item, dict) and "filename" in item for item in files):
        raise ShardReadError(f"{state_file!r} has no _data_files list of {{'filename': ...}}: got {files!r}")
    return [join(directory, item["filename"]) for item in files]


@dataclass
class ArrowReader:
    """Arrow IPC shards, stream or file format (``.arrow``, Feather v2 ``.feather``), by path or URL.

    A local shard (or a ``ShardCache`` copy) is memory-mapped: counting it reads the batches' metadata,
    and a span takes the record batches its rows lie in, located by cumulative row counts, without
    copying them. A remote shard is read from its start to the end of the span (a stream has no
    index): put remote shards under a ``ShardCache``. Records are dicts of column values
    (``to_pylist``; a ``datasets`` ``Image`` column arrives as ``{"bytes": ..., "path": ...}``, decoded by
    the stream's ``transform``); ``columns`` selects some.

    Example:
        >>> stream = ShardedStream(saved_dataset_shards("/data/ds"), ArrowReader(), batch_size=32)  # doctest: +SKIP
    """

    columns: list[str] | None = None
    storage_options: dict[str, Any] | None = None
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    @scans_shard
    def count(self, shard: str) -> int:
        _, batches = self._batches(shard)
        return sum(batch.num_rows for batch in batches)

    def identity(self, shard: str) -> str:
        """The file's size and modification time (or ETag), its schema with its metadata (a ``datasets``
        file's features and fingerprint) and its record batches' row counts; then ``version`` and the
        shard's checksum."""
        return self.identity_from(shard, self.metadata(shard))

    @scans_shard
    def metadata(self, shard: str) -> ShardMetadata:
        """The stored identity, the digest of the schema and batch row counts, and the records: one read of
        every batch (a remote stream has no index; under a ``ShardCache``, the node's copy is mapped)."""
        stored = stored_identity(shard, self.storage_options)
        schema, batches = self._batches(shard)
        rows = [batch.num_rows for batch in batches]
        return ShardMetadata(stored, f"arrow={digest(schema.serialize().to_pybytes(), rows)}", sum(rows))

    def identity_from(self, shard: str, metadata: ShardMetadata) -> str:
        """The identity of a shard whose metadata is ``metadata``, with this reader's ``version`` and checksums."""
        return content_identity(shard, str(metadata.stored), metadata.content, self.version, self.checksums)

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        return self.read_span(shard, start, stop).records_at(list(range(stop - start)))

    def read_span(self, shard: str, start: int, stop: int) -> ParquetSpan:
        """Rows ``start .. stop - 1`` as columns (zero-copy from a memory map); records are built as taken."""
        pa = _pyarrow()
        schema, batches = self._batches(shard, stop)
        taken, first, row = [], None, 0
        for batch in batches:
            if row < stop and row + batch.num_rows > start:
                taken.append(batch)
                first = row if first is None else first
            row += batch.num_rows
        if row < stop:
            raise ShardReadError(f"Arrow shard {shard!r} has {row} rows, rows {start}..{stop - 1} were asked")
        table = pa.Table.from_batches(taken, schema=schema).slice(start - (first or 0), stop - start)
        if self.columns is not None:
            table = table.select(self.columns)
        self.stats.opened += 1
        self.stats.rows += sum(batch.num_rows for batch in taken)
        self.stats.bytes += sum(batch.nbytes for batch in taken)
        return ParquetSpan(table, self.stats)

    def read_rows(self, shard: str, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The records at ``rows``, in that order, from the record batches they lie in alone (a stream's
        batches before the last of them are walked, not copied, in a memory map): a first batch after a
        resume waits for its own records, not for its window's shards."""
        return self.read_rows_span(shard, rows)[:]

    def read_rows_span(self, shard: str, rows: Sequence[int] | np.ndarray) -> ParquetSpan:
        """The records of ``read_rows`` as columns, built when taken (the first batch joins its shards' spans)."""
        pa = _pyarrow()
        wanted = np.asarray(rows, dtype=np.int64)
        schema, batches = self._batches(shard, max(int(wanted.max()) + 1, 1) if len(wanted) else 1)
        pieces, offsets = rows_in_pieces(shard, [batch.num_rows for batch in batches], wanted)
        taken = [batches[piece] for piece in pieces.tolist()]
        table = pa.Table.from_batches(taken, schema=schema)
        if self.columns is not None:
            table = table.select(self.columns)
        self.stats.add_read(sum(batch.num_rows for batch in taken), sum(batch.nbytes for batch in taken))
        return ParquetSpan(table.take(row_indices(offsets)), self.stats)

    def _batches(self, shard: str, stop: int | None = None) -> tuple[Any, list[Any]]:
        """(schema, record batches) of the shard, up to the one holding row ``stop - 1`` when given."""
        pa = _pyarrow()
        try:
            source = (
                pa.memory_map(shard, "r")
                if not is_url(shard)
                else pa.PythonFile(open_shard(shard, self.storage_options), mode="r")
            )
        except ShardReadError:
            raise
        except Exception as error:  # FileNotFoundError, an empty file that cannot be mapped
            raise ShardReadError(f"could not open Arrow shard {shard!r}: {error}") from error
        try:
            with source:
                is_file = source.read(len(_FILE_MAGIC)) == _FILE_MAGIC
                source.seek(0)
                batches, rows = [], 0
                if is_file:
                    reader = pa.ipc.open_file(source)
                    for number in range(reader.num_record_batches):
                        if stop is not None and rows >= stop:
                            break
                        batches.append(reader.get_batch(number))
                        rows += batches[-1].num_rows
                    return reader.schema, batches
                stream = pa.ipc.open_stream(source)
                for batch in stream:
                    batches.append(batch)
                    rows += batch.num_rows
                    if stop is not None and rows >= stop:
                        break
                else:  # read to its end: a whole stream ends with the end-of-stream marker
                    size = source.seek(0, 2)
                    source.seek(max(size - len(_END_OF_STREAM), 0))
                    if source.read(len(_END_OF_STREAM)) != _END_OF_STREAM:
                        raise ShardReadError(
                            f"Arrow stream shard {shard!r} ends after {rows} rows without its end-of-stream marker: "
                            f"truncated (a writer that did not close it)"
                        )
                return stream.schema, batches
        except ShardReadError:
            raise
        except Exception as error:  # ArrowInvalid for a truncated or corrupt file, OSError from the storage
            raise ShardReadError(f"could not read Arrow shard {shard!r}: {error}") from error


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ModuleNotFoundError as error:
        raise missing_extra(error, "stream", "stateful_sampler.stream.ArrowReader") from error
    return pa
