"""``MDSReader``: Mosaic MDS shards (``index.json`` + ``shard.XXXXX.mds``) read as they are, without
``mosaicml-streaming`` and without re-encoding.

The layout, from streaming's ``format/mds`` (writer and reader): a shard is a ``uint32`` sample count,
``count + 1`` ``uint32`` byte offsets, the writer's config, then the samples; a sample is the ``uint32``
sizes of its variable-size columns, then each column's bytes in ``column_names`` order. ``index.json``
lists the shards with their sample counts, columns, encodings and compression.
"""

from __future__ import annotations

import bz2
import gzip
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from stateful_sampler.errors import ShardReadError
from stateful_sampler.stream.formats import (
    SlicedSpan,
    by_shard,
    content_identity,
    digest,
    directory_index,
    entry_of,
    item_offsets,
    rows_of_span,
    shard_bytes,
)
from stateful_sampler.stream.readers import ReadStats
from stateful_sampler.stream.remote import stored_identity

_SCALARS = {name: np.dtype(name) for name in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                             "float16", "float32", "float64")}  # fmt: skip
# NDArray's dtype and shape-dtype codes (streaming/base/format/mds/encodings.py).
_NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                   34: "float32", 64: "uint64", 65: "int64", 66: "float64"}  # fmt: skip
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
_IMAGES = ("jpeg", "png")
SUPPORTED_ENCODINGS = (
    "bytes", "str", "int", *_SCALARS, "str_int", "str_float", "str_decimal", "json", *_IMAGES, "list[jpeg]",
    "list[png]", "jpeg_array", "jpegarray", "ndarray", "pkl",
)  # fmt: skip


def _list_of_bytes(data: memoryview, header: int) -> list[bytes]:
    """MDS's list encodings: ``header`` bytes (a placeholder and/or the count), the sizes, the items."""
    items = int(np.frombuffer(data, np.uint32, 1, header - 4)[0])
    sizes = np.frombuffer(data, np.uint32, items, header).tolist()
    out, at = [], header + 4 * items
    for size in sizes:
        out.append(bytes(data[at : at + size]))
        at += size
    return out


def _ndarray(config: str) -> Callable[[memoryview], Any]:
    parts = config.split(":") if config else []
    fixed_dtype = parts[0] if parts else None
    fixed_shape = tuple(int(dim) for dim in parts[1].split(",")) if len(parts) > 1 else None

    def decode(data: memoryview) -> Any:
        at, dtype, shape = 0, fixed_dtype, fixed_shape
        if dtype is None:
            dtype, at = _NDARRAY_DTYPES[data[0]], 1
        if shape is None:
            ndim, shape_dtype = data[at] >> 2, _SHAPE_DTYPES[data[at] % 4]
            width = np.dtype(shape_dtype).itemsize
            shape = tuple(np.frombuffer(data, shape_dtype, ndim, at + 1).tolist())
            at += 1 + ndim * width
        return np.frombuffer(data, dtype, offset=at).reshape(shape)

    return decode


def decoder(encoding: str, column: str, allow_unsafe_types: bool) -> Callable[[memoryview], Any]:
    """How a column of ``encoding`` is decoded; images stay bytes (decode them in the transform)."""
    name, _, config = encoding.partition(":")
    if name in _SCALARS:
        dtype = _SCALARS[name]
        return lambda data: np.frombuffer(data, dtype, 1)[0]
    simple: dict[str, Callable[[memoryview], Any]] = {
        "bytes": bytes,
        "str": lambda data: bytes(data).decode("utf-8"),
        "int": lambda data: int(np.frombuffer(data, np.int64, 1)[0]),
        "str_int": lambda data: int(bytes(data).decode("utf-8")),
        "str_float": lambda data: float(bytes(data).decode("utf-8")),
        "str_decimal": lambda data: Decimal(bytes(data).decode("utf-8")),
        "json": lambda data: json.loads(bytes(data).decode("utf-8")),
        "jpeg": bytes,
        "png": bytes,
        "list[jpeg]": lambda data: _list_of_bytes(data, 8),
        "list[png]": lambda data: _list_of_bytes(data, 8),
        "jpeg_array": lambda data: _list_of_bytes(data, 4),
        "jpegarray": lambda data: _list_of_bytes(data, 4),
    }
    if name in simple:
        return simple[name]
    if name == "ndarray":
        return _ndarray(config)
    if name == "pkl":
        if not allow_unsafe_types:
            raise ValueError(
                f"column {column!r} is encoded 'pkl': unpickling runs code from the shard; pass "
                f"MDSReader(..., allow_unsafe_types=True) if you trust the data"
            )
        import pickle

        return lambda data: pickle.loads(bytes(data))
    raise ValueError(f"column {column!r} has encoding {encoding!r}, which MDSReader does not read; it reads "
                     f"{', '.join(SUPPORTED_ENCODINGS)}")  # fmt: skip


def _decompressor(compression: str, shard: str) -> Callable[[bytes], bytes]:
    family = compression.split(":", 1)[0]
    if family == "gz":
        return gzip.decompress
    if family == "bz2":
        return bz2.decompress
    if family == "zstd":
        try:
            import zstandard
        except ModuleNotFoundError:
            try:
                import zstd  # type: ignore[import-not-found]
            except ModuleNotFoundError:
                raise ShardReadError(
                    f"shard {shard!r} is zstd-compressed and no zstd decompressor is installed: pip install "
                    f"zstandard, or write the dataset without compression"
                ) from None
            return lambda data: bytes(zstd.decompress(data))
        return lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise ShardReadError(f"shard {shard!r} is compressed with {compression!r}: MDSReader reads gz, bz2 and zstd")


@dataclass
class MDSReader:
    """Mosaic MDS shards of the dataset at ``root`` (a path or URL holding ``index.json``).

    ``reader.shards`` lists the shard files, in the index's order; a ShardCache copy of any of them reads
    too (every shard of one index shares its columns). Records are dicts of the columns, decoded as
    Mosaic decodes them, except images (``jpeg``, ``png`` and their lists), which stay bytes for the
    transform to decode. ``pkl`` columns are refused unless ``allow_unsafe_types=True`` (unpickling runs
    code). zstd shards need ``zstandard`` installed; gz and bz2 are read with the standard library.

    Example:
        >>> reader = MDSReader("s3://bucket/mds-dataset")  # doctest: +SKIP
        >>> stream = ShardedStream(reader.shards, ShardCache(reader, "/local/cache", max_bytes=50 << 30),
        ...                        batch_size=32)  # doctest: +SKIP
    """

    root: str
    storage_options: dict[str, Any] | None = None
    allow_unsafe_types: bool = False
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def __post_init__(self) -> None:
        join, index_file, entries = directory_index(
            self.root, self.storage_options, "an MDS index (a JSON object with 'shards')", lambda index: index["shards"]
        )
        if not entries:
            raise ValueError(f"{index_file!r} lists no shards")
        layouts = {json.dumps([e.get("column_names"), e.get("column_encodings"), e.get("column_sizes"),
                               e.get("compression")]) for e in entries}  # fmt: skip
        if len(layouts) != 1 or any(entry.get("format") != "mds" or entry.get("version") != 2 for entry in entries):
            raise ValueError(f"{index_file!r}: MDSReader reads MDS version 2 shards sharing one column layout, got "
                             f"{len(layouts)} layouts")  # fmt: skip
        first = entries[0]
        self.columns: list[str] = list(first["column_names"])
        self._sizes: list[int | None] = list(first["column_sizes"])
        self._encodings: list[str] = list(first["column_encodings"])
        self._decoders = self._make_decoders()
        self._compression: str | None = first.get("compression")
        # A merged index names its shards with their subdirectory (``split/shard.00000.mds``).
        files = [join(self.root, (entry.get("zip_data") or entry["raw_data"])["basename"]) for entry in entries]
        self.shards: list[str] = files
        self._entries = by_shard(list(zip(files, entries)))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoders": None}  # closures: rebuilt in the process that unpickles

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoders = self._make_decoders()

    def _make_decoders(self) -> list[Callable[[memoryview], Any]]:
        return [decoder(encoding, column, self.allow_unsafe_types)
                for column, encoding in zip(self.columns, self._encodings)]  # fmt: skip

    def count(self, shard: str) -> int:
        entry = self._entry(shard)
        if entry is not None:
            return int(entry["samples"])
        return len(item_offsets(self._data(shard), shard, None)) - 1

    def identity(self, shard: str) -> str:
        """The file's size and modification time (or ETag), and its entry in ``index.json`` (columns,
        sample count, sizes and hashes of its files)."""
        entry = self._entry(shard) or {"samples": self.count(shard), "columns": self.columns}
        content = f"mds={digest(json.dumps(entry, sort_keys=True))}"
        return content_identity(shard, str(stored_identity(shard, self.storage_options)), content, self.version,
                                self.checksums)  # fmt: skip

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        return self.read_span(shard, start, stop).records_at(list(range(stop - start)))

    def read_rows(self, shard: str, rows: Sequence[int] | Any) -> list[Any]:
        """The records at ``rows``, in that order, decoding only them (see ``formats.rows_of_span``): a first
        batch after a resume waits for its own records, not for its window's shards."""
        return rows_of_span(self.read_span, shard, rows)

    def read_span(self, shard: str, start: int, stop: int) -> SlicedSpan:
        """Samples ``start .. stop - 1``; each is decoded from the (memory-mapped) shard when taken."""
        data = self._data(shard)
        entry = self._entry(shard)
        offsets = item_offsets(data, shard, None if entry is None else int(entry["samples"]))
        if not 0 <= start <= stop < len(offsets):
            raise ShardReadError(f"rows {start}..{stop - 1} are outside MDS shard {shard!r} of {len(offsets) - 1}")
        self.stats.opened += 1
        self.stats.rows += stop - start
        self.stats.bytes += int(offsets[stop] - offsets[start])

        def sample(row: int) -> dict[str, Any]:
            begin, end = int(offsets[start + row]), int(offsets[start + row + 1])
            return self._decode(memoryview(data)[begin:end], shard, start + row)

        return SlicedSpan(stop - start, sample, self.stats)

    def _decode(self, data: memoryview, shard: str, row: int) -> dict[str, Any]:
        sizes, at = [], 0
        for size in self._sizes:
            if size is None:
                size, at = int(np.frombuffer(data, np.uint32, 1, at)[0]), at + 4
            sizes.append(size)
        if at + sum(sizes) != len(data):
            raise ShardReadError(f"MDS shard {shard!r} row {row}: its columns take {at + sum(sizes)} bytes, the "
                                 f"sample has {len(data)}: corrupt")  # fmt: skip
        sample = {}
        for column, size, decode in zip(self.columns, sizes, self._decoders):
            try:
                sample[column] = decode(data[at : at + size])
            except Exception as error:
                raise ShardReadError(f"MDS shard {shard!r} row {row} column {column!r}: {error}") from error
            at += size
        return sample

    def _entry(self, shard: str) -> dict[str, Any] | None:
        """The shard's ``index.json`` entry, by file name (None for a renamed copy, a ShardCache's)."""
        return entry_of(self._entries, shard)

    def _data(self, shard: str) -> Any:
        data = shard_bytes(shard, self.storage_options)
        if self._compression is None:
            return data
        try:
            return _decompressor(self._compression, shard)(bytes(data))
        except ShardReadError:
            raise
        except Exception as error:  # a truncated or corrupt compressed file
            raise ShardReadError(f"could not decompress MDS shard {shard!r} ({self._compression}): {error}") from error
