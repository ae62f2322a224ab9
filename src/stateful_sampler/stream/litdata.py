"""``LitDataReader``: LitData optimized directories (``index.json`` + ``chunk-*.bin``) read as they are,
without ``litdata`` and without re-encoding.

The layout, from litdata's ``streaming/writer.py``, ``item_loader.py`` (``PyTreeLoader``) and
``serializers.py``: a chunk is a ``uint32`` item count, ``count + 1`` ``uint32`` byte offsets, then the
items; an item is the ``uint32`` sizes of its leaves, then each leaf's bytes, serialized as
``config.data_format`` names them; ``config.data_spec`` is the pytree (dict, list, tuple) the leaves fill.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stateful_sampler.errors import ShardReadError
from stateful_sampler.extras import missing_extra
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
from stateful_sampler.stream.readers import ParquetSpan, ReadStats
from stateful_sampler.stream.remote import stored_identity

_FOOTER_MAGIC = b"LDARW01\0"
# litdata's _NUMPY_SCTYPES order (constants.py): a numpy leaf's dtype is its index in this list.
_NUMPY_DTYPES = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                        np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
                                        bool)]  # fmt: skip
SUPPORTED_FORMATS = ("str", "int", "float", "bool", "bytes", "file", "jpeg", "image", "numpy", "no_header_numpy",
                     "pickle")  # fmt: skip


def _numpy(data: memoryview) -> Any:
    dtype = _NUMPY_DTYPES[int(np.frombuffer(data, np.uint32, 1)[0])]
    ndim = int(np.frombuffer(data, np.uint32, 1, 4)[0])
    shape = np.frombuffer(data, np.uint32, ndim, 8).tolist()
    return np.frombuffer(data, dtype, offset=8 + 4 * ndim).reshape(shape)


def leaf_decoder(data_format: str, allow_pickle: bool) -> Callable[[memoryview], Any]:
    """How a leaf serialized as ``data_format`` is decoded; images and files stay bytes."""
    name, _, config = data_format.partition(":")
    simple: dict[str, Callable[[memoryview], Any]] = {
        "str": lambda data: bytes(data).decode("utf-8"),
        "int": lambda data: struct.unpack("<q", data)[0],
        "float": lambda data: struct.unpack("<d", data)[0],
        "bool": lambda data: bytes(data) != b"\x00",
        "bytes": bytes,
        "file": bytes,
        "jpeg": bytes,
        "image": bytes,
        "numpy": _numpy,
    }
    if name in simple:
        return simple[name]
    if name == "no_header_numpy":
        dtype = _NUMPY_DTYPES[int(config)]
        return lambda data: np.frombuffer(data, dtype).copy()
    if name == "pickle":
        if not allow_pickle:
            raise ValueError(
                f"a leaf is serialized {data_format!r}: unpickling runs code from the chunk; pass "
                f"LitDataReader(..., allow_pickle=True) if you trust the data"
            )
        import pickle

        return lambda data: pickle.loads(bytes(data))
    raise ValueError(f"a leaf is serialized {data_format!r}, which LitDataReader does not read; it reads "
                     f"{', '.join(SUPPORTED_FORMATS)}")  # fmt: skip


def unflatten(spec: dict[str, Any], leaves: list[Any]) -> Any:
    """The item from its leaves and litdata's pytree spec (``treespec_dumps`` protocol 1): dict, list,
    tuple and OrderedDict nodes."""
    position = [0]

    def build(node: dict[str, Any]) -> Any:
        kind = node["type"]
        if kind is None:
            position[0] += 1
            return leaves[position[0] - 1]
        children = [build(child) for child in node["children_spec"]]
        if kind in ("builtins.dict", "collections.OrderedDict"):
            return dict(zip(json.loads(node["context"]), children))
        if kind == "builtins.list":
            return children
        if kind == "builtins.tuple":
            return tuple(children)
        raise ValueError(f"LitDataReader cannot rebuild pytree nodes of type {kind!r} (dict, list, tuple only)")

    return build(spec)


def arrow_footer(data: Any, shard: str) -> tuple[int, int] | None:
    """(offset, length) of the Arrow IPC file litdata appends to a chunk of dict rows (``LDARW01`` magic,
    litdata >= 0.2.7x), or None for a chunk without one."""
    size = len(data)
    if size < 12 or bytes(data[size - 8 : size]) != _FOOTER_MAGIC:
        return None
    length = struct.unpack_from("<I", data, size - 12)[0]
    if not 0 < length <= size - 12:
        raise ShardReadError(f"LitData chunk {shard!r} has an Arrow footer of {length} bytes in {size}: corrupt")
    return size - 12 - length, length


def _spec(data_spec: str | None) -> dict[str, Any]:
    if data_spec is None:
        return {"type": None, "context": None, "children_spec": []}
    protocol, spec = json.loads(data_spec)
    if protocol != 1:
        raise ValueError(f"data_spec uses pytree protocol {protocol}: LitDataReader reads protocol 1")
    return dict(spec)


@dataclass
class LitDataReader:
    """LitData chunks of the optimized directory ``root`` (a path or URL holding ``index.json``).

    ``reader.shards`` lists the chunk files, in the index's order; a ShardCache copy reads too. Records
    are the items as written (a dict, list or tuple of leaves): ``str``, ``int``, ``float``, ``bool``,
    ``bytes``, numpy arrays; images and files stay bytes (litdata decodes them to tensors: do it in the
    transform). ``pickle`` leaves are refused unless ``allow_pickle=True``; compressed or encrypted
    directories are refused (decompress with litdata once, or re-optimize without compression).

    Example:
        >>> reader = LitDataReader("s3://bucket/optimized")  # doctest: +SKIP
        >>> stream = ShardedStream(reader.shards, reader, batch_size=32)  # doctest: +SKIP
    """

    root: str
    storage_options: dict[str, Any] | None = None
    allow_pickle: bool = False
    version: str | None = None
    checksums: Mapping[str, str] | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def __post_init__(self) -> None:
        join, index_file, (chunks, config, formats) = directory_index(
            self.root, self.storage_options, "a LitData index (chunks and config)",
            lambda index: (index["chunks"], index["config"], list(index["config"]["data_format"])),
        )  # fmt: skip
        self._formats: list[str] = formats
        for option in ("compression", "encryption"):
            if config.get(option):
                raise ShardReadError(
                    f"{index_file!r}: the chunks use {option} {config[option]!r}, which LitDataReader does not read;"
                    f" optimize the dataset without it"
                )
        if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
            raise ValueError(f"{index_file!r}: item_loader {config['item_loader']!r}: LitDataReader reads "
                             f"PyTreeLoader chunks (litdata's default)")  # fmt: skip
        self._spec = _spec(config.get("data_spec"))
        self._config = config
        self._decoders = self._make_decoders()
        self.shards: list[str] = [join(self.root, chunk["filename"]) for chunk in chunks]
        self._chunks = by_shard(list(zip(self.shards, chunks)))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoders": None}  # closures: rebuilt in the process that unpickles

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoders = self._make_decoders()

    def _make_decoders(self) -> list[Callable[[memoryview], Any]]:
        return [leaf_decoder(data_format, self.allow_pickle) for data_format in self._formats]

    def count(self, shard: str) -> int:
        chunk = self._chunk(shard)
        if chunk is not None:
            return int(chunk["chunk_size"])
        data = shard_bytes(shard, self.storage_options)
        footer = arrow_footer(data, shard)
        return len(item_offsets(data, shard, None, None if footer is None else footer[0])) - 1

    def identity(self, shard: str) -> str:
        """The file's size and modification time (or ETag), its entry in ``index.json`` and the config."""
        chunk = self._chunk(shard) or {"chunk_size": self.count(shard)}
        content = f"litdata={digest(json.dumps([chunk, self._config], sort_keys=True))}"
        return content_identity(shard, str(stored_identity(shard, self.storage_options)), content, self.version,
                                self.checksums)  # fmt: skip

    def read(self, shard: str, start: int, stop: int) -> list[Any]:
        return self.read_span(shard, start, stop).records_at(list(range(stop - start)))

    def read_rows(self, shard: str, rows: Sequence[int] | Any) -> list[Any]:
        """The records at ``rows``, in that order, decoding only them (see ``formats.rows_of_span``): a first
        batch after a resume waits for its own records, not for its window's shards."""
        return rows_of_span(self.read_span, shard, rows)

    def read_span(self, shard: str, start: int, stop: int) -> SlicedSpan | ParquetSpan:
        """Items ``start .. stop - 1``; each is decoded from the (memory-mapped) chunk when taken, or, for a
        chunk whose rows litdata stored as an Arrow footer, taken from its columns."""
        data = shard_bytes(shard, self.storage_options)
        chunk = self._chunk(shard)
        footer = arrow_footer(data, shard)
        offsets = item_offsets(data, shard, None if chunk is None else int(chunk["chunk_size"]),
                               None if footer is None else footer[0])  # fmt: skip
        if not 0 <= start <= stop < len(offsets):
            raise ShardReadError(f"rows {start}..{stop - 1} are outside LitData chunk {shard!r} of {len(offsets) - 1}")
        self.stats.opened += 1
        self.stats.rows += stop - start
        self.stats.bytes += int(offsets[stop] - offsets[start])
        if footer is not None and offsets[-1] == offsets[0]:  # items in the footer only
            return self._footer_span(data, footer, shard, start, stop, len(offsets) - 1)

        def item(row: int) -> Any:
            begin, end = int(offsets[start + row]), int(offsets[start + row + 1])
            return self._decode(memoryview(data)[begin:end], shard, start + row)

        return SlicedSpan(stop - start, item, self.stats)

    def _footer_span(
        self, data: Any, footer: tuple[int, int], shard: str, start: int, stop: int, items: int
    ) -> ParquetSpan:
        try:
            import pyarrow as pa
            import pyarrow.ipc
        except ModuleNotFoundError as error:  # litdata wrote the rows as Arrow: reading them takes pyarrow
            raise missing_extra(error, "stream", "stateful_sampler.stream.LitDataReader") from error

        try:
            table = pa.ipc.open_file(pa.py_buffer(memoryview(data)[footer[0] : footer[0] + footer[1]])).read_all()
        except Exception as error:  # ArrowInvalid for a corrupt footer
            raise ShardReadError(f"could not read the Arrow rows of LitData chunk {shard!r}: {error}") from error
        if table.num_rows != items:
            raise ShardReadError(f"LitData chunk {shard!r} has {table.num_rows} Arrow rows for {items} items: corrupt")
        self.stats.bytes += footer[1]
        return ParquetSpan(table.slice(start, stop - start), self.stats)

    def _decode(self, data: memoryview, shard: str, row: int) -> Any:
        leaves = len(self._formats)
        header = 4 * leaves
        sizes = np.frombuffer(data, np.uint32, leaves).tolist() if len(data) >= header else None
        if sizes is None or header + sum(sizes) != len(data):
            raise ShardReadError(f"LitData chunk {shard!r} row {row}: its leaf sizes do not match its "
                                 f"{len(data)} bytes: corrupt")  # fmt: skip
        values, at = [], header
        for size, decode in zip(sizes, self._decoders):
            try:
                values.append(decode(data[at : at + size]))
            except Exception as error:
                raise ShardReadError(f"LitData chunk {shard!r} row {row}: {error}") from error
            at += size
        return unflatten(self._spec, values)

    def _chunk(self, shard: str) -> dict[str, Any] | None:
        """The chunk's ``index.json`` entry, by file name (None for a renamed copy, a ShardCache's)."""
        return entry_of(self._chunks, shard)
