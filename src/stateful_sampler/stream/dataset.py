"""``ShardedStream``: an ``IterableDataset`` over shards in the shard-and-window order, exactly resumable.

Which record fills each epoch position is fixed by (seed, epoch, position) alone
(``order.shards``); ranks and workers only decide who delivers it (``stream.layout``). So the
state is an epoch and a position, a resume is arithmetic, and a resume may change the worker
count, the world size and the batch size. A reader reads one window at a time: per window, each
shard it needs is read once, for the span of rows its positions fall on.

Passes. Workers hold copies of the stream, so only the main process can keep count of passes, and
only if it hears of them: a ``DataLoader`` over the stream must be built by ``stream.loader(...)``
(or iterated through ``ResumableLoader`` and the framework integrations), which tells the stream
when a pass begins and ends and sets the batching. A plain ``DataLoader(stream)`` is refused at
its first batch: its batch size, ``drop_last`` and ``persistent_workers`` are out of the stream's
sight, and each would deliver other records than the state says, with no error.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from stateful_sampler.checks import check_bool, check_choice, check_int, check_optional_int
from stateful_sampler.errors import StreamSetupError
from stateful_sampler.hooks import pass_starting
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.layout import MAX_EPOCH
from stateful_sampler.order.policies import Tail
from stateful_sampler.order.shards import DEFAULT_SPREAD, EpochWindows, ShardedShuffle
from stateful_sampler.ranks import process_world_size, resolve_ranks
from stateful_sampler.resharding import refuse_resharding
from stateful_sampler.stream.gather import Joined, Spans, WindowGather, chunk_bounds, join_spans
from stateful_sampler.stream.layout import StreamLayout
from stateful_sampler.stream.manifest import ShardManifest
from stateful_sampler.stream.readers import ShardReader
from stateful_sampler.stream.state import Manifest, StreamState, check_counts, shard_identities
from stateful_sampler.stream.window_parts import WindowPart, take_first_batch, window_parts
from stateful_sampler.wrappers import BatchSizeWords, adopt_batch_size, dataloaders_under


@dataclass(frozen=True)
class _Cursor:
    epoch: int
    position: int


@dataclass(eq=False)
class _Pass:
    """A pass begun: the epoch it draws, the position it started from and, for a pass iterated directly
    in this process, the records it has handed out (``None`` for a loader's pass, whose workers and
    fetcher run ahead of the loop)."""

    epoch: int
    origin: int
    handed_out: int | None = None


_NOTHING = object()
_BATCH_SIZE_WORDS = BatchSizeWords(
    "DataLoader",
    "ShardedStream",
    ": a worker delivers whole batches of the stream's size; build the loader with stream.loader(...)",
)


class ShardedStream(IterableDataset):
    """Yields this rank's and this worker's records of each epoch's shard-and-window order.

    Args:
        shards: shard names (paths), in a fixed order: their order is part of the order's identity.
        reader: a ``ShardReader`` (``ParquetReader``, or your own). A reader with ``identity(shard)``
            puts each shard's content identity in the state (see ``stream.state``).
        batch_size: per-rank batch; ``stream.loader(...)`` builds the ``DataLoader`` with it.
        window: k, the shards' worth of records shuffled together; memory per reader is one window's.
        spread: m, the pieces each shard is cut into: a window takes one piece of each of k * m shards,
            so a batch mixes k * m shards at the memory of k (each shard is read m times an epoch, a
            piece at a time). Unset: a loaded state's spread, else ``DEFAULT_SPREAD``. 1 is the order of
            whole shards (states saved before ``spread`` existed resume to it).
        seed: an int in [0, 2**63).
        counts: records per shard; read from the reader once when not given. When given, each is checked
            against the count the reader read with the shard's identity, where it read one (a parquet
            footer), or the manifest's: a contradiction is refused, naming the shard.
        shard_manifest: a file (on local disk) that keeps each shard's count and content identity by its
            size and modification time or ETag (``stream.manifest``): the first build reads the shards and
            writes it, a restart stats the shards instead of reading their footers. Not with a ``ShardCache``,
            which keeps a manifest of its own on the node.
        tail: ``"pad"`` (marked repeats even out the ranks) or ``"drop"``.
        num_replicas, rank: default to the process group, or 1 and 0 without one.
        yield_keys: yield ``(record, SampleKey)``; the key's index is the global record index
            (shards concatenated in the order given) and ``is_padding`` marks repeats.
        transform: applied to each record in the worker, e.g. to build tensors. A transform with
            ``takes_key = True`` (``KeyedTransform``, ``SeededTransform``) is called as
            ``transform(record, key)``: per-record randomness seeded from the key is exact after a
            resume at any worker count and world size.

    Passes: ``set_epoch(e)`` makes the next pass draw epoch ``e`` from its start, except right after
    ``load_state_dict``, where the saved epoch keeps its saved position. A pass started without
    ``set_epoch`` after another pass draws the next epoch (a completed or abandoned pass moves on).

    Example:
        >>> stream = ShardedStream(paths, ParquetReader(), batch_size=32, window=8)  # doctest: +SKIP
        >>> loader = stream.loader(num_workers=2)                                   # doctest: +SKIP
    """

    def __init__(
        self,
        shards: Sequence[str | os.PathLike[str]],
        reader: ShardReader,
        *,
        batch_size: int,
        window: int = 8,
        seed: int = 0,
        spread: int | None = None,
        counts: Sequence[int] | None = None,
        shard_manifest: str | os.PathLike[str] | None = None,
        tail: str = "pad",
        num_replicas: int | None = None,
        rank: int | None = None,
        yield_keys: bool = False,
        transform: Callable[..., Any] | None = None,
    ) -> None:
        if isinstance(shards, (str, os.PathLike)) or not shards:
            raise TypeError(f"shards must be a non-empty list of shard names, got {shards!r}")
        if not isinstance(reader, ShardReader):
            raise TypeError(f"reader must have count(shard) and read(shard, start, stop), got {type(reader).__name__}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.shards = [os.fspath(shard) for shard in shards]
        self.reader = reader
        self.window = check_int("window", window, minimum=1)
        self._spread_given = check_optional_int("spread", spread, minimum=1) is not None
        self.spread = DEFAULT_SPREAD if spread is None else spread
        self.init_delivery(
            batch_size=batch_size, seed=seed, tail=tail, num_replicas=num_replicas, rank=rank,
            yield_keys=yield_keys, transform=transform,
        )  # fmt: skip
        given = counts is not None
        prepare = getattr(reader, "prepare", None)
        known = None
        if shard_manifest is not None:
            if prepare is not None:
                raise ValueError(
                    f"shard_manifest: {type(reader).__name__} keeps a manifest of its own on the node (ShardCache): "
                    f"leave shard_manifest unset"
                )
            known = ShardManifest(shard_manifest).look_up(reader, self.shards)
        elif prepare is not None:  # a reader that looks the shards up at once (ShardCache: once per node)
            prepare(self.shards, counts=not given)
        if counts is None:
            counts = known.counts if known is not None else [reader.count(shard) for shard in self.shards]
        if len(counts) != len(self.shards):
            raise ValueError(f"counts must give one count per shard ({len(self.shards)}), got {len(counts)}")
        self.counts = [check_int(f"counts[{i}] ({self.shards[i]!r})", count) for i, count in enumerate(counts)]
        self.order = ShardedShuffle(self.counts, self.window, self.seed, self.spread)
        if known is None:
            self.identities = shard_identities(reader, self.shards, self.counts if given else None)
        else:
            check_counts(self.shards, self.counts, known.counts)
            self.identities = known.identities
        self.manifest = Manifest.of(self.shards, self.counts, self.identities)
        self.gather = WindowGather(reader, self.shards, self.counts)

    def init_delivery(
        self,
        *,
        batch_size: int,
        seed: int,
        tail: str,
        num_replicas: int | None,
        rank: int | None,
        yield_keys: bool,
        transform: Callable[..., Any] | None,
    ) -> None:
        """Set the batching, seed, tail, ranks and keys, with no pass begun: the part of the constructor a
        stream of another order over the same delivery (``MixedStream``) shares."""
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.seed = check_int("seed", seed, maximum=(1 << 63) - 1)
        self.tail = check_choice("tail", tail, Tail)
        if self.tail not in (Tail.PAD, Tail.DROP):
            raise ValueError(f"tail must be 'pad' or 'drop' for a stream, got {tail!r}")
        self.yield_keys = check_bool("yield_keys", yield_keys)
        self.transform = transform
        self._num_replicas = check_optional_int("num_replicas", num_replicas, minimum=1)
        self._rank = check_optional_int("rank", rank)
        self.rank  # noqa: B018 - validates rank against num_replicas now when both are known
        self._next = _Cursor(0, 0)  # where the next pass starts while no pass has begun since a load or set_epoch
        self._pass: _Pass | None = None  # the last pass begun since then
        self._pass_ended = False  # that pass was taken to its end by the loop
        self._driving = False  # a loader is starting a pass: its workers and fetcher take self._pass

    # -- ranks, resolved late like StatefulSampler's

    @property
    def num_replicas(self) -> int:
        return self._num_replicas if self._num_replicas is not None else process_world_size()

    @property
    def rank(self) -> int:
        return resolve_ranks(self.num_replicas, self._rank)[1]

    @property
    def given_ranks(self) -> tuple[int | None, int | None]:
        """The ``num_replicas`` and ``rank`` passed at construction (``None``: taken from the process group)."""
        return self._num_replicas, self._rank

    def __getstate__(self) -> dict[str, Any]:
        """Workers started by spawn or forkserver have no process group: they get the ranks the
        main process resolved when the DataLoader pickled the dataset for them."""
        state = self.__dict__.copy()
        state["_num_replicas"], state["_rank"] = self.num_replicas, self.rank
        return state

    # -- epochs and length

    def _upcoming(self) -> _Cursor:
        """Where a pass begun now starts: after a pass, the next epoch."""
        if self._pass is None:
            return self._next
        return _Cursor(self._pass.epoch + 1, 0)

    def _current(self) -> _Cursor:
        """The pass under way (begun, not ended), else the one a new pass would draw. A pass iterated
        directly is where it has got to, as a stream restored from ``state_dict()`` now would be: its
        records are handed out by this process, so nothing runs ahead of the loop (as for a
        ``StatefulSampler`` without workers)."""
        current = self._pass
        if current is None or self._pass_ended:
            return self._upcoming()
        if current.handed_out is None:
            return _Cursor(current.epoch, current.origin)
        return _Cursor(current.epoch, self._layout(current.origin).position_after(current.handed_out))

    @property
    def epoch(self) -> int:
        """The epoch of the pass under way, else of the pass the next ``iter()`` begins."""
        return self._current().epoch

    @property
    def position(self) -> int:
        """The epoch position the pass under way started from (for a pass iterated directly, the one it
        has got to), else the next pass starts from."""
        return self._current().position

    def set_epoch(self, epoch: int) -> None:
        """The next pass draws ``epoch`` from its start. Two cases change nothing: right after
        ``load_state_dict`` the saved epoch keeps its saved position, and while a pass of ``epoch`` is
        under way (begun, not taken to its end) it goes on, for frameworks that call ``set_epoch`` again
        once the pass began (Lightning, Accelerate). Any other epoch leaves the pass under way."""
        epoch = check_int("epoch", epoch, maximum=MAX_EPOCH)
        refuse_resharding(self, sys._getframe(1))  # Accelerate's dispatcher calls this on every rank, first
        if self._pass is None and epoch == self._next.epoch:
            return
        if self._pass is not None and not self._pass_ended and epoch == self._pass.epoch:
            return
        self._next, self._pass, self._pass_ended = _Cursor(epoch, 0), None, False

    def layout(self) -> StreamLayout:
        """The deal of the rest of the current pass's epoch to the ranks."""
        return self._layout(self._current().position)

    def _layout(self, origin: int) -> StreamLayout:
        world_size = self.num_replicas
        if self.tail is Tail.DROP and self.epoch_size < world_size:
            raise ValueError(
                f"tail='drop' with {self.epoch_size} records on num_replicas={world_size} ranks would drop "
                f"every record: use tail='pad' or fewer ranks"
            )
        return StreamLayout(self.tail, self.epoch_size, world_size, origin)

    @property
    def epoch_size(self) -> int:
        """Positions in an epoch (every record of the shards once)."""
        return self.order.size

    def __len__(self) -> int:
        """This rank's records in the epoch of the pass under way (else of the next pass), counted from
        the epoch's start as Lightning expects, as ``StatefulSampler``'s: a pass resumed mid-epoch counts
        the part before it as if these ranks had taken it."""
        layout = self.layout()
        return -(-layout.origin // layout.world_size) + layout.local_length

    def remaining_length(self) -> int:
        """This rank's records in the pass under way, else in the pass the next ``iter()`` begins."""
        return self.layout().local_length

    def pass_length(self) -> int:
        """This rank's records in the pass under way, counted from its start, else in the next pass (what
        ``StatefulSampler.pass_length`` gives Lightning's epoch-length bookkeeping)."""
        if self._pass is not None and not self._pass_ended:
            return self._layout(self._pass.origin).local_length
        return self.remaining_length()

    @property
    def pass_begun(self) -> bool:
        """Whether a pass began since the last ``set_epoch`` (to another epoch), ``load_state_dict`` or ``settle``."""
        return self._pass is not None

    def settle(self) -> None:
        """Done with a pass the loop took to its end: the next pass starts at the next epoch, and
        ``state_dict(consumed_batches=k)`` counts from there (``ResumableLoader`` calls this at each
        ``iter()`` when no pass of its own is under way, as it does ``StatefulSampler``'s). A pass under
        way is left as it is: a loader that broke off settles it itself at the batches it consumed."""
        if self._pass is not None and self._pass_ended:
            self._next, self._pass, self._pass_ended = self._upcoming(), None, False

    def state_after(self, consumed: int) -> dict[str, Any]:
        """The state once the loop consumed ``consumed`` of this rank's records of a loader's pass under way
        (else of the next pass), capped at the pass's: what ``ResumableLoader`` saves."""
        current = self._pass
        start = self._next if current is None else _Cursor(current.epoch, current.origin)
        layout = self._layout(start.position)
        records = min(check_int("consumed", consumed), layout.local_length)
        return self.state_at(start.epoch, layout.position_after(records))

    def global_records(
        self, epoch: int, origin: int, local_start: int, local_stop: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """This rank's global record indices (shards concatenated in the order given, a ``SampleKey``'s index)
        at its local positions [local_start, local_stop) of the pass of ``epoch`` dealt from ``origin``, and
        which of them are padding: what a tool following training (the certificate) records, no record read."""
        layout = self._layout(origin)
        slots = layout.slots(self.rank, np.arange(local_start, local_stop, dtype=np.int64))
        return self.order.epoch(epoch).records(layout.positions(slots)), slots >= layout.size

    # -- loaders

    def loader(self, **kwargs: Any) -> StreamLoader:
        """The ``DataLoader`` for this stream: batches of the stream's ``batch_size``, each pass reported
        to the stream. Takes ``DataLoader``'s arguments (``num_workers``, ``collate_fn``, ...); a
        ``batch_size`` other than the stream's, ``drop_last=True`` (it would lose the pass's last
        batch) and ``persistent_workers=True`` (workers would keep a past pass) are refused.

        Example:
            >>> loader = stream.loader(num_workers=2)  # doctest: +SKIP
        """
        return StreamLoader(self, **kwargs)

    def loader_pass(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``loader`` (a ``DataLoader`` over this stream, possibly wrapped) as one pass: the pass
        begins before its workers start, so they draw it, and it ends when the loader is exhausted.
        ``ResumableLoader`` and ``StreamLoader`` iterate through this; a pass already being started by
        an outer loader passes through."""
        if self._driving:
            return iter(loader)
        self._check_loader(loader)
        return self._drive(self._begin_pass(), loader)

    def _drive(self, begun: _Pass, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``loader`` with the pass marked as a loader's until its first batch: by then its
        workers were forked or pickled and its fetcher built (a wrapper such as Accelerate's may do
        that only at the first ``next``), each with the pass in its copy of the stream."""
        self._driving = True
        try:
            iterator = iter(loader)
            first = next(iterator, _NOTHING)
        finally:
            self._driving = False
        if first is not _NOTHING:
            yield first
            yield from iterator
        if self._pass is begun:
            self._pass_ended = True

    def _handing_out(self, begun: _Pass, records: Iterator[Any]) -> Iterator[Any]:
        """A pass iterated directly: each record is counted as the loop takes it, so the stream's state
        is known at every point of the pass (``state_dict()`` needs no count, and a count is checked)."""
        for begun.handed_out, record in enumerate(records, 1):
            yield record
        if self._pass is begun:
            self._pass_ended = True

    def _begin_pass(self) -> _Pass:
        self._pass_ended = True  # the previous pass, if any, is over: the hooks see the pass about to begin
        pass_starting(self)  # SamplerCheckpoint restores, verify records: as for a sampler
        start = self._upcoming()
        if start.epoch > MAX_EPOCH:
            raise ValueError(f"epoch must be at most {MAX_EPOCH}: the pass after epoch {start.epoch - 1} is past it")
        self._layout(start.position)  # refuse a tail that cannot be dealt before a worker starts
        self._pass, self._pass_ended = _Pass(start.epoch, start.position), False
        return self._pass

    def _check_loader(self, loader: Any) -> None:
        """Refuse a DataLoader whose batching would deliver other records than the stream counts."""
        found = _dataloader_of(loader, self)
        if found is None:
            raise StreamSetupError(
                f"found no DataLoader over this ShardedStream in {type(loader).__name__}: build it with "
                f"stream.loader(...)"
            )
        adopt_batch_size(self, found.batch_size, words=_BATCH_SIZE_WORDS, unbatched=False)
        if found.drop_last:
            raise StreamSetupError(
                "DataLoader drop_last=True would drop the pass's last, partial batch that the state counts as "
                "delivered: leave drop_last=False (tail='drop' drops records to even out the ranks)"
            )
        if found.persistent_workers and found.num_workers > 0:
            raise StreamSetupError(
                "DataLoader persistent_workers=True keeps workers that hold the epoch and position of the pass "
                "they started with: leave it off, workers then start each pass from the stream's state"
            )

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        """In a ``DataLoader`` (a worker, or its fetcher at 0 workers, also under a dataset that wraps the
        stream): the records of the pass a loader began. Iterated directly: a pass of its own, begun here
        (not at the first record), whose state follows each record the loop takes."""
        refuse_resharding(self, sys._getframe(1))  # before a worker's own refusal: it would name the wrong fix
        info = get_worker_info()
        if info is not None or _inside_a_fetcher():
            if not self._driving:
                raise StreamSetupError(
                    "a DataLoader(stream, ...) of its own does not tell the stream when a pass begins or ends, and "
                    "its batch_size, drop_last and persistent_workers may deliver other records than the state "
                    "counts: build it with stream.loader(num_workers=..., ...), or iterate it through ResumableLoader"
                )
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            return self._iter_pass(self._current(), worker, workers)
        begun = self._begin_pass()
        begun.handed_out = 0
        return self._handing_out(begun, self._iter_pass(_Cursor(begun.epoch, begun.origin), 0, 1))

    def iter_worker(self, worker: int, workers: int) -> Iterator[Any]:
        """What DataLoader worker ``worker`` of ``workers`` yields in the pass under way, else the next pass:
        its batches, window by window. Begins no pass."""
        return self._iter_pass(self._current(), worker, workers)

    def _iter_pass(self, start: _Cursor, worker: int, workers: int) -> Iterator[Any]:
        # The records of each chunk in turn: chaining the chunks in C keeps Python frames off the path
        # of each record.
        return itertools.chain.from_iterable(
            self.pass_chunks(start.epoch, self._layout(start.position), worker, workers)
        )

    def pass_chunks(self, epoch: int, layout: StreamLayout, worker: int, workers: int) -> Iterator[Iterable[Any]]:
        """This rank's and worker's records of ``epoch`` dealt by ``layout``, a chunk at a time: the one part
        of a pass a stream of another order (``MixedStream``) replaces."""
        return self._pass_chunks(_Cursor(epoch, layout.origin), worker, workers)

    def _pass_chunks(self, start: _Cursor, worker: int, workers: int) -> Iterator[Iterable[Any]]:
        layout = self._layout(start.position)
        windows = self.order.epoch(start.epoch)
        parts = window_parts(windows, layout, self.rank, self.batch_size, worker, workers)
        # A pass that starts inside its epoch (a resume) reads its first batch's records on their own where the
        # reader reads rows, in one read over the windows the batch spans: a shard of two windows read once.
        resumed = start.position and self.gather.reads_rows
        held = take_first_batch(self.gather, windows, layout, parts, self.batch_size, workers) if resumed else []
        for part in itertools.chain(held, parts):
            if part.window < windows.windows:
                self.gather.announce(windows, part.window)
            if part.alone or part.slots.size:  # the padding's records are the last window's
                yield from self._chunks_of_window(windows, layout, part)

    def _chunks_of_window(
        self, windows: EpochWindows, layout: StreamLayout, part: WindowPart
    ) -> Iterator[Iterable[Any]]:
        """This worker's records of one window, in order, a chunk at a time. Each shard is read once for
        the window, then records are built chunk by chunk (one batch, then doubling up to
        ``CHUNK_RECORDS``): with a reader whose spans convert lazily (``read_span``) the first batch
        waits for the window's reads and one batch's conversion, not for the whole window's. The first
        ``part.alone`` records (the pass's first batch, a resume's) come from ``part.first``, located and read
        on their own: that batch waits for its own records only, not for its windows' slots or shards."""
        alone = part.alone
        read_order = windows.window_shards(min(part.window, windows.windows - 1)).tolist()

        def after_the_batch() -> Iterator[tuple[int, int]]:  # the window's slots taken once the batch is out
            for begin, end in chunk_bounds(len(part.slots) - alone, self.batch_size):
                yield alone + begin, alone + end

        located: tuple[np.ndarray, np.ndarray] | None = None  # the window's (shard, row) of each slot
        spans: Spans = {}
        joined: Joined | None = None
        transform = self.transform
        takes_key = getattr(transform, "takes_key", False)
        keyed = self.yield_keys or takes_key
        for begin, end in itertools.chain([(0, alone)] if alone else [], after_the_batch()):
            if end <= alone:
                slots, shards, rows, records = part.first.of(part)  # type: ignore[union-attr]
            else:
                if located is None:  # the rest of the window located, and its spans read once, at its first chunk
                    rest = windows.locate(layout.positions(part.slots[alone:]))
                    if alone:
                        _, head_shards, head_rows, _ = part.first.of(part)  # type: ignore[union-attr]
                        rest = (np.concatenate([head_shards, rest[0]]), np.concatenate([head_rows, rest[1]]))
                    located = rest
                    spans = self.gather.read(located[0], located[1], read_order)
                    joined = join_spans(spans, len(self.shards))
                slots, shards, rows = part.slots[begin:end], located[0][begin:end], located[1][begin:end]
                records = self.gather.records(spans, joined, shards, rows)
            if not keyed:
                yield records if transform is None else map(transform, records)
                continue
            keys = [
                SampleKey(index, self.seed, windows.epoch, slot, slot >= layout.size)
                for index, slot in zip((self.order.offsets[shards] + rows).tolist(), slots.tolist())
            ]
            if transform is not None:
                if takes_key:
                    records = [transform(record, key) for record, key in zip(records, keys)]
                else:
                    records = [transform(record) for record in records]
            yield zip(records, keys) if self.yield_keys else records

    # -- state

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The state after the loop consumed ``consumed_batches`` batches of the pass under way (of the
        next pass when none is under way): the loop's count (``enumerate(loader, 1)``), not what workers
        prefetched. The same on every rank. A state after the last batch resumes to nothing more of
        that epoch, then the next one, as a loop's last batch does.

        Without ``consumed_batches``: before any pass, the position the next pass starts from; after
        the loop took a pass to its end, the next epoch's start; inside a pass iterated directly
        (``for record in stream``), the position after the records the loop took. Refused while a
        loader's pass is under way, where only the loop knows how far it got. Inside a pass iterated
        directly the stream knows it: a count of more records than it handed out is refused, and so is a
        count once that pass has ended (the live stream has moved on; the count would resume inside it).
        """
        current = self._pass
        if consumed_batches is None:
            if current is None or self._pass_ended or current.handed_out is not None:
                now = self._current()
                return self.state_at(now.epoch, now.position)
            raise ValueError(
                f"consumed_batches: a pass of epoch {current.epoch} is under way and its workers prefetch: "
                f"pass state_dict(consumed_batches=k) with the batches the loop consumed"
            )
        consumed = check_int("consumed_batches", consumed_batches)
        start = self._next if current is None else _Cursor(current.epoch, current.origin)
        layout = self._layout(start.position)
        batches = -(-layout.local_length // self.batch_size)
        if consumed > batches:
            raise ValueError(
                f"consumed_batches must be at most {batches}, the batches of this pass of epoch {start.epoch} "
                f"(from position {start.position}), got {consumed}"
            )
        records = min(consumed * self.batch_size, layout.local_length)
        if current is not None and current.handed_out is not None and self._pass_ended:
            raise ValueError(
                f"consumed_batches={consumed}: this pass of epoch {start.epoch} is iterated directly and has ended (the "
                f"loop, or a helper that batches its records, asked past its last record), so the stream has moved on "
                f"to epoch {start.epoch + 1}: call state_dict(), which saves that epoch's start, or iterate through "
                f"stream.loader() or ResumableLoader, which tell a state inside the loop from one after it"
            )
        if current is not None and current.handed_out is not None and records > current.handed_out:
            raise ValueError(
                f"consumed_batches={consumed} counts {records} records of this pass of epoch {start.epoch}, but it "
                f"is iterated directly and has handed out {current.handed_out}: the state would skip records the "
                f"loop never took. Count the batches of {self.batch_size} records the loop took, or call "
                f"state_dict(), which knows"
            )
        return self.state_at(start.epoch, layout.position_after(records))

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The saved state of the stream at ``position`` of ``epoch`` (what ``state_dict`` returns there)."""
        return self._state(epoch, position).to_dict()

    def _state(self, epoch: int, position: int) -> StreamState:
        return StreamState(
            shards=self.manifest.shards,
            records=self.manifest.records,
            digest=self.manifest.digest,
            locator=self.manifest.locator,
            seed=self.seed,
            window=self.window,
            tail=self.tail.value,
            spread=self.spread,
            epoch=epoch,
            position=position,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state in O(1); world size, worker count and batch size may differ.
        Another shard list (or shard content, for a reader with ``identity``), seed, window or tail
        raises ``IncompatibleStateError``, and so does another ``spread`` than the one given to the stream;
        a stream built without ``spread`` takes the state's (spread 1 for a state saved before it existed)."""
        saved = StreamState.from_dict(state)
        spread = self.spread if self._spread_given else saved.spread
        current = replace(self._state(0, 0), spread=spread)
        saved.check_continues(current, self.shards, self.counts, self.identities)
        if spread != self.spread:
            self.spread, self.order = spread, ShardedShuffle(self.counts, self.window, self.seed, spread)
        self.restart_at(saved.epoch, saved.position)

    def restart_at(self, epoch: int, position: int) -> None:
        """The next pass starts at ``position`` of ``epoch``, no pass begun: a checked state loaded."""
        self._next, self._pass, self._pass_ended = _Cursor(epoch, position), None, False


class StreamLoader(DataLoader):
    """A ``DataLoader`` over a ``ShardedStream`` with the stream's batching, which reports each pass to it.
    Build it with ``stream.loader(...)``."""

    def __init__(self, dataset: ShardedStream, **kwargs: Any) -> None:
        if not isinstance(dataset, ShardedStream):
            raise TypeError(f"StreamLoader iterates a ShardedStream, got {type(dataset).__name__}")
        batch_size = kwargs.pop("batch_size", dataset.batch_size)
        for name in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(name) not in (None, False):
                raise StreamSetupError(f"{name}: a ShardedStream orders its records itself, leave {name} unset")
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        dataset._check_loader(self)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        stream: ShardedStream = self.dataset  # type: ignore[assignment]
        if stream._driving:  # an outer loader_pass is starting this pass
            return super().__iter__()
        return stream.loader_pass(_Unreported(self))

    def state_dict(self) -> dict[str, Any]:
        """What Lightning saves of a train loader that has a ``state_dict``: only a mark. The loader cannot
        know what the loop consumed (Lightning fetches a batch ahead), so the position is saved by
        ``SamplerCheckpoint``, or by ``ResumableLoader`` in any other loop."""
        return {"stream_loader": "the position is in SamplerCheckpoint's or ResumableLoader's state"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Lightning restores the mark saved by ``state_dict`` only when no ``SamplerCheckpoint`` took its place
        (the callback empties it): a resume that nothing would put at the saved position is refused."""
        if not state:
            return
        raise StreamSetupError(
            "a checkpoint restores this StreamLoader, but the stream's position is saved by "
            "stateful_sampler.lightning.SamplerCheckpoint (Lightning) or ResumableLoader (other loops): add "
            "SamplerCheckpoint() to the Trainer's callbacks and save the checkpoint again with it"
        )


class _Unreported:
    """``StreamLoader`` seen as a plain ``DataLoader`` by ``loader_pass``: iterating it does not report again."""

    def __init__(self, loader: StreamLoader) -> None:
        self.dataloader = loader

    def __iter__(self) -> Iterator[Any]:
        return DataLoader.__iter__(self.dataloader)


def _dataloader_of(loader: Any, stream: ShardedStream) -> DataLoader | None:
    """The ``DataLoader`` over ``stream`` at ``loader`` or inside the wrappers frameworks put around it."""
    return next((found for found in dataloaders_under(loader) if found.dataset is stream), None)


def _inside_a_fetcher() -> bool:
    """``iter(stream)`` under a DataLoader's dataset fetcher (torch's or torchdata's), not a direct loop:
    called by the fetcher, or by a dataset of the user's that wraps the stream and that the fetcher iterates
    (its batch size would not be the stream's, and the state would count the stream's batches)."""
    frame = sys._getframe(1).f_back
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            caller = frame.f_locals.get("self")
            if type(caller).__name__.endswith("IterableDatasetFetcher"):
                return True
        frame = frame.f_back
    return False
