"""``PackedStream``: a stream's records packed into rows of ``seq_len`` tokens, exactly resumable and elastic.

Composed of the pieces that already are: the stream's epoch order (a ``ShardedStream``'s, or a
``MixedStream``'s draws, ``MixedStream.epoch_indices``) becomes a ``Strategy`` (``order.stream_order.StreamOrder``), ``PackedRows`` packs that strategy's passes (split and cut, or whole
records best-fit inside windows of the order), and ``PackedDataset`` turns each row plan into
``input_ids`` / ``labels`` / ``position_ids`` and, collated, ``cu_seqlens``. So rows are what the sampler deals to
ranks (equal steps, marked padding rows), a resume is the row sampler's O(window) anchor, and a resume at
another world size, per-rank batch or worker count is the sampler's elastic resume.

A row is planned from record lengths alone: each shard's token column is read for its lengths first (for
parquet, that column only), then a row's records are read when a worker builds it, whole shards at a time,
a window's shards kept.

What a ``PackedStream`` uses of its source stream is small and public: ``shards``, ``counts``, ``reader``
(``read(shard, start, stop)``, and ``lengths(shard, column)`` when it has one), ``order`` (its epoch order:
``size`` and ``epoch(e).records(positions)``), ``seed``, ``given_ranks``, ``transform``, and ``set_epoch`` /
``state_at`` / ``load_state_dict`` for the source's identity, which a saved state carries and a resume checks.
Of a ``MixedStream``: ``sources`` (each read as above, or a map-style dataset indexed directly), ``offsets``,
``epoch_size``, ``epoch_indices(epoch, positions)`` and the same identity calls; a planned ``schedule`` change,
at an epoch or at ``(epoch, position)``, is part of its draws, so it is packed exactly like any other draw.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.strategy import SavedOrder
from stateful_sampler.order.stream_order import StreamOrder
from stateful_sampler.packing.base import DEFAULT_WINDOW
from stateful_sampler.packing.dataset import PackedDataset
from stateful_sampler.packing.rows import PackedRows
from stateful_sampler.stream.dataset import ShardedStream
from stateful_sampler.stream.mixed import MixedStream
from stateful_sampler.stream.readers import ShardReader

PACKED_STREAM_VERSION = 1
_DRAWS_FIELDS = {"mixture", "slot"}
_SOURCE_FIELDS = {"version", "source"}


def record_lengths(stream: ShardedStream, tokens: str, cache: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Every record's token count, shards concatenated in the stream's order: the reader's
    ``lengths(shard, column)`` where it has one (``ParquetReader`` reads the token column alone), else the
    length of each record's ``tokens``. With ``cache`` (a folder), each shard's lengths are kept in a file named
    by a hash of the shard's name, count, content identity (when the reader has one) and ``tokens``, and read
    back from it, so that a resume reads no shard to plan its rows."""
    reader = stream.reader
    read_lengths = getattr(reader, "lengths", None)
    folder = None if cache is None else Path(cache)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    identities = stream.identities
    parts = []
    for index, (shard, count) in enumerate(zip(stream.shards, stream.counts)):
        kept = None
        if folder is not None:
            identity = "" if identities is None else identities[index]
            key = hashlib.sha256(f"{shard}\0{count}\0{identity}\0{tokens}".encode()).hexdigest()[:32]
            kept = folder / f"{key}.npy"
        if kept is not None and kept.exists():
            lengths = np.load(kept)
        elif read_lengths is not None:
            lengths = np.asarray(read_lengths(shard, tokens), dtype=np.int64).reshape(-1)
        else:
            records = reader.read(shard, 0, count)
            lengths = np.array([len(tokens_of(record, tokens, f"shard {shard!r}")) for record in records])
        if len(lengths) != count:
            raise ValueError(f"shard {shard!r} has {count} records, but {len(lengths)} lengths of {tokens!r} were read")
        lengths = lengths.astype(np.int64, copy=False)
        _refuse_empty(lengths, f"shard {shard!r}", tokens)
        if kept is not None and not kept.exists():
            partial = kept.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(partial, lengths)
            partial.replace(kept)  # whole or absent: a killed run leaves no half-written lengths
        parts.append(lengths)
    return np.concatenate(parts)


def mixed_lengths(stream: MixedStream, tokens: str, cache: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Every record's token count, the mixture's sources concatenated: a stream source's from
    ``record_lengths`` (``cache`` included), a map-style source's from each record's ``tokens``, read once (its
    content has no identity to name a kept file by, so ``cache`` does not hold it)."""
    parts = []
    for index, source in enumerate(stream.sources):
        if isinstance(source, ShardedStream):
            parts.append(record_lengths(source, tokens, cache))
            continue
        where = f"streams[{index}]"
        lengths = np.array([len(tokens_of(source[row], tokens, where)) for row in range(len(source))], dtype=np.int64)
        _refuse_empty(lengths, where, tokens)
        parts.append(lengths)
    return np.concatenate(parts)


def _refuse_empty(lengths: np.ndarray, where: str, tokens: str) -> None:
    if len(lengths) and int(lengths.min()) < 1:
        row = int(lengths.argmin())
        raise ValueError(
            f"record {row} of {where} has {int(lengths[row])} tokens in {tokens!r}: a packed record needs at least "
            f"1 token, leave empty records out of the shards"
        )


def tokens_of(record: Any, tokens: str, where: str) -> Any:
    """The token sequence of one record: its ``tokens`` field (a record that is no mapping is its tokens);
    ``where`` names the record's home in an error (``"shard '3'"``, ``"streams[1]"``)."""
    if not isinstance(record, Mapping):
        return record
    if tokens not in record:
        raise KeyError(f"tokens={tokens!r}: a record of {where} has no such field (it has {sorted(record)})")
    return record[tokens]


class StreamRecords(Dataset):
    """The stream's records by global index (shards concatenated in the order given), as token sequences.

    Reads whole shards and keeps the last ``kept`` (a window's): the rows of one window of the order read
    each of its shards once per worker."""

    def __init__(
        self, shards: Sequence[str], counts: Sequence[int], reader: ShardReader, tokens: str, kept: int
    ) -> None:
        self.shards = list(shards)
        self.counts = [int(count) for count in counts]
        self.reader = reader
        self.tokens = tokens
        self.kept = kept
        self.offsets = np.concatenate(([0], np.cumsum(self.counts)))
        self._held: OrderedDict[int, list[Any]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": OrderedDict()}  # a worker reads its own shards

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> Any:
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self._shard(shard)[index - int(self.offsets[shard])]

    def _shard(self, shard: int) -> list[Any]:
        held = self._held.get(shard)
        if held is not None:
            self._held.move_to_end(shard)
            return held
        name = self.shards[shard]
        records = self.reader.read(name, 0, self.counts[shard])
        held = [tokens_of(record, self.tokens, f"shard {name!r}") for record in records]
        self._held[shard] = held
        if len(self._held) > self.kept:
            self._held.popitem(last=False)
        return held


class MapRecords(Dataset):
    """A map-style source's records as token sequences (its ``tokens`` field), ``where`` naming it in an error."""

    def __init__(self, dataset: Any, tokens: str, where: str) -> None:
        self.dataset = dataset
        self.tokens = tokens
        self.where = where

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return tokens_of(self.dataset[index], self.tokens, self.where)


class SourceRecords(Dataset):
    """The records of several sources by their index in the sources concatenated (a mixed stream's keys),
    each source read by its own reader (``StreamRecords``, ``MapRecords``): the source-agnostic reader of rows."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = list(parts)
        self.offsets = np.concatenate(([0], np.cumsum([len(part) for part in self.parts])))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> Any:
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[part][index - int(self.offsets[part])]


class MixedDraws:
    """A ``MixedStream``'s draws as an ``order.stream_order.ChangingOrder``: epoch e's records by position, and
    the mixture's slot and continuation (``Mixture.state_at`` / ``resume_from``), so that packed rows over a
    ``MixedStream(on_change="continue")`` splice another mixture in at a resume as over a ``Mixture``."""

    def __init__(self, stream: MixedStream) -> None:
        self.stream = stream

    def epoch(self, epoch: int) -> MixedEpoch:
        return MixedEpoch(self.stream, epoch)

    def identity(self) -> str:
        return self.stream.mixture.fingerprint()

    def state_at(self, epoch: int, position: int, kept_from: int | None) -> dict[str, Any]:
        mixture = self.stream.mixture
        return {"mixture": mixture.fingerprint(), "slot": mixture.state_at(epoch, position, kept_from=kept_from)}

    def resume_from(self, saved: SavedOrder) -> MixedDraws | None:
        """These draws under the mixture that continues the saved one (a copy of the stream holding it), None
        when the saved mixture is this one; another mixture is refused naming ``mixture`` unless the stream was
        built with ``on_change="continue"``."""
        slot = saved.state
        if not isinstance(slot, Mapping) or set(slot) != _DRAWS_FIELDS or not isinstance(slot["mixture"], str):
            raise IncompatibleStateError(
                "strategy_state.drawn", slot, f"a dict with {sorted(_DRAWS_FIELDS)}", "not a mixed stream's draws"
            )
        mixture = self.stream.mixture
        at = SavedOrder(saved.size, Mixture.name, slot["mixture"], slot["slot"], saved.pass_index, saved.offset)
        resumed = mixture.resume_from(at)
        if resumed is None:
            raise IncompatibleStateError("mixture", slot["mixture"], mixture.fingerprint(), mixture.mismatch_hint())
        if resumed is mixture:
            return None
        stream = copy.copy(self.stream)
        stream.mixture = resumed  # as MixedStream.load_state_dict continues: the draws are the mixture's
        return MixedDraws(stream)


class MixedEpoch:
    """One epoch of a ``MixedStream``'s draws, holding its sources' orders between blocks of positions."""

    def __init__(self, stream: MixedStream, epoch: int) -> None:
        self.stream = stream
        self.epoch = epoch
        self.orders: dict[Any, Any] = {}

    def records(self, positions: np.ndarray) -> np.ndarray:
        return self.stream.epoch_indices(self.epoch, positions, self.orders)


class PackedStream(PackedRows):
    """Rows of ``seq_len`` tokens of a stream's records (a ``ShardedStream`` or a ``MixedStream``), in the stream's
    epoch order; this rank's share.

    A ``PackedRows`` sampler over the stream's order (so everything it does holds: ranks, tails, elastic resume,
    ``state_dict(consumed_batches=k)``, ``ResumableLoader``, ``SamplerCheckpoint``), with the dataset that builds
    its rows from the stream's shards (``packed_dataset``, a ``PackedDataset``) and the loader over both (``loader()``).

    Over a ``MixedStream``, epoch e packs the mixture's epoch e: its ``num_samples`` draws in order (a record
    drawn twice is packed twice), with the weights in force at each position (a ``schedule`` key ``(e, position)``
    changes them inside an epoch, and inside a window of rows, exactly).

    Args:
        stream: a ``ShardedStream`` built without ``num_replicas`` and ``rank`` (rows are dealt to ranks here)
            and without a ``transform`` (rows are built from the records' tokens), or a ``MixedStream`` built
            so, whose sources are too (map-style sources give each record, or its ``tokens`` field). Its seed
            is the rows' seed; its own batching and tail are unused.
        seq_len: tokens per row.
        tokens: the record field holding each record's token ids (a list column, for parquet).
        split_records: ``True``: the epoch's records concatenated and cut every ``seq_len`` tokens; ``False``:
            whole records, best-fit decreasing inside windows of ``window`` positions of the stream's order.
        truncate: with ``split_records=False``, keep the first ``seq_len`` tokens of a longer record instead of
            refusing it.
        window: positions of the stream's order planned together (the unit of packing and of a resume's cost).
        batch_size: rows per batch on each rank.
        num_replicas, rank, tail: as ``StatefulSampler``: ``tail="pad"`` evens out the ranks with marked
            padding rows (labels all ``-100``, ``is_padding`` set).
        attention, pad_id: as ``PackedDataset``.
        lengths_cache: a folder where each shard's lengths are kept once read (see ``record_lengths``): a
            restarted run plans its rows without reading the shards' token columns again (a mixed stream's
            map-style sources are measured again: see ``mixed_lengths``).

    Example:
        >>> packed = PackedStream(stream, seq_len=256, batch_size=8)              # doctest: +SKIP
        >>> loader = ResumableLoader(packed.loader(num_workers=2))                # doctest: +SKIP
        >>> batch = next(iter(loader)); batch["input_ids"].shape                  # doctest: +SKIP
        torch.Size([8, 256])
    """

    def __init__(
        self,
        stream: ShardedStream,
        seq_len: int,
        *,
        tokens: str = "input_ids",
        split_records: bool = True,
        batch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        tail: str = "pad",
        truncate: bool = False,
        window: int = DEFAULT_WINDOW,
        attention: str = "varlen",
        pad_id: int = 0,
        lengths_cache: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(stream, ShardedStream):
            raise TypeError(f"stream must be a ShardedStream or a MixedStream, got {type(stream).__name__}")
        kind = type(stream).__name__
        if stream.given_ranks != (None, None):
            raise ValueError(
                f"stream: a PackedStream deals its rows to the ranks, so its source stream must be built without "
                f"num_replicas and rank: build the {kind} without them and pass them to PackedStream"
            )
        if not isinstance(tokens, str):
            raise TypeError(f"tokens must be the name of the records' token field, got {type(tokens).__name__}")
        _refuse_transform("stream", stream, tokens)
        self.stream = stream
        self.tokens = tokens
        self.source = stream.state_at(0, 0)  # the source's identity, whatever its own cursor is
        source = json.dumps(self.source, sort_keys=True)
        if isinstance(stream, MixedStream):
            for index, part in enumerate(stream.sources):
                _refuse_transform(f"streams[{index}]", part, tokens)
            lengths = mixed_lengths(stream, tokens, lengths_cache)
            order = StreamOrder(MixedDraws(stream), source, records=len(lengths), pass_length=stream.epoch_size)
            records: Dataset = SourceRecords(
                [_records_of(index, part, tokens) for index, part in enumerate(stream.sources)]
            )
        else:
            lengths = record_lengths(stream, tokens, lengths_cache)
            order = StreamOrder(stream.order, source)
            records = _records_of(None, stream, tokens)
        super().__init__(
            lengths,
            seq_len,
            split_records=split_records,
            window=window,
            seed=stream.seed,
            num_replicas=num_replicas,
            rank=rank,
            tail=tail,
            batch_size=batch_size,
            truncate=truncate,
            strategy=order,
        )
        self.packed_dataset = PackedDataset(records, self, attention=attention, pad_id=pad_id)

    def loader(self, **kwargs: Any) -> DataLoader:
        """The ``DataLoader`` of collated rows: this sampler, its ``packed_dataset`` and that dataset's ``collate``. Takes
        ``DataLoader``'s other arguments (``num_workers``, ...); ``batch_size`` defaults to this sampler's, and
        one that contradicts it is refused.

        Example:
            >>> loader = packed.loader(num_workers=2)  # doctest: +SKIP
        """
        for name in ("sampler", "batch_sampler", "shuffle", "collate_fn"):
            if kwargs.get(name) not in (None, False):
                raise ValueError(f"{name}: a PackedStream's loader sets it itself, leave {name} unset")
            kwargs.pop(name, None)
        batch_size = kwargs.pop("batch_size", self.batch_size)
        if batch_size is None:
            raise ValueError("batch_size: pass PackedStream(..., batch_size=B) or loader(batch_size=B)")
        if self.batch_size is None:
            self.batch_size = batch_size
        elif batch_size != self.batch_size:
            raise ValueError(f"batch_size={batch_size} contradicts PackedStream(..., batch_size={self.batch_size})")
        return DataLoader(
            self.packed_dataset, sampler=self, batch_size=batch_size, collate_fn=self.packed_dataset.collate, **kwargs
        )

    @property
    def mixture(self) -> Mixture | None:
        """The mixture the rows draw from now: a ``MixedStream``'s, as a ``load_state_dict`` under
        ``on_change="continue"`` continued it (the segments ``audit.mixture.audit_segments`` reads), which
        ``self.stream`` does not hold; None over a ``ShardedStream``.

        Example:
            >>> books = [{"input_ids": [1] * n} for n in (3, 5, 2, 7)]
            >>> code = [{"input_ids": [2] * n} for n in (4, 1, 6)]
            >>> mixed = MixedStream([books, code], [3, 1], batch_size=1, num_samples=8)
            >>> PackedStream(mixed, 8, batch_size=1, num_replicas=1, rank=0).mixture.weights_at(0, 0).tolist()
            [0.75, 0.25]
        """
        order = self.strategy.drawn
        if isinstance(order, StreamOrder) and isinstance(order.shuffle, MixedDraws):
            return order.shuffle.stream.mixture
        return None

    def extra_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The row anchor, and the source stream's identity (``stream``), which a resume checks first."""
        return {**super().extra_state(state), "stream": {"version": PACKED_STREAM_VERSION, "source": self.source}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved state in O(window); another source stream (a shard changed, added or removed, another
        seed or window; a mixed stream's source or mixture changed) is refused by the stream itself, naming it."""
        if not isinstance(state, Mapping):
            raise IncompatibleStateError("state", type(state).__name__, "a dict from PackedStream.state_dict()")
        state = dict(state)
        saved = state.pop("stream", "<missing>")
        if not isinstance(saved, Mapping) or set(saved) != _SOURCE_FIELDS:
            raise IncompatibleStateError(
                "stream", saved, f"a dict with {sorted(_SOURCE_FIELDS)}", "not a state of PackedStream.state_dict()"
            )
        if saved["version"] != PACKED_STREAM_VERSION:
            raise IncompatibleStateError("stream.version", saved["version"], PACKED_STREAM_VERSION)
        source = saved["source"]
        kind = type(self.stream).__name__
        if not isinstance(source, Mapping):
            raise IncompatibleStateError("stream.source", source, f"a dict from {kind}.state_dict()")
        saved_kind = MixedStream.__name__ if "mixture" in source else ShardedStream.__name__
        if saved_kind != kind:
            raise IncompatibleStateError(
                "stream.source", f"a {saved_kind}'s state", f"a {kind}'s", f"the state packs a {saved_kind}"
            )
        copy.copy(self.stream).load_state_dict(dict(source))  # refuses another stream, naming the field
        super().load_state_dict(state)


def _records_of(index: int | None, source: Any, tokens: str) -> Dataset:
    """One source's token sequences by record index: a stream's shards read a window's at a time, or a map-style
    dataset's records (``index``: the source's place in a mixed stream)."""
    if isinstance(source, ShardedStream):
        return StreamRecords(source.shards, source.counts, source.reader, tokens, kept=source.window + 1)
    return MapRecords(source, tokens, f"streams[{index}]")


def _refuse_transform(name: str, source: Any, tokens: str) -> None:
    transform = getattr(source, "transform", None) if isinstance(source, ShardedStream) else None
    if transform is not None:
        raise ValueError(
            f"{name}: its transform {transform!r} would not be applied (rows are built from the records' "
            f"{tokens!r}): build the {type(source).__name__} without a transform"
        )
