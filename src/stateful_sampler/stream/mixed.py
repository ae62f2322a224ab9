"""``MixedStream``: several sources (``ShardedStream``s, or map-style datasets) drawn at set weights, exactly resumable.

The draw sequence is ``order.mixture.Mixture``'s: epoch e holds stream positions e*num_samples ...
(e+1)*num_samples - 1, and ``Mixture.locate`` says which source each takes and that source's draw number k
(the quota interleave, the schedule's ``(e, position)`` changes, a change at a resume). Source d's k-th draw
is position k % size_d of its source-epoch k // size_d in the source's own order: a ``ShardedStream``'s
shard-and-window order (its seed and window), or, for a map-style dataset, a permutation of its indices
seeded by (seed, d, source-epoch). So each source walks its own epochs, on at its own rate.

The outer stream carries what a ``ShardedStream`` does: ranks, batching, the tail (marked padding), passes,
``.loader()`` and the state; it is one, whose records come from the mixture (``pass_chunks``). Reading:
a source's window is read once, whole, when its first draw of a pass needs it, and held until the source
moves on (with the window before, which only the mirrored padding reads again): per rank, one window's
reads per source window, as one stream reads.

The state is one small dict: the epoch and position, each source's identity (a 4-character check each,
and a digest of them all, naming the source that changed), the seed, tail and epoch length, and the
mixture's slot (``Mixture.state_at``: each source's draws, O(sources)). A resume is O(sources): no source's
data is touched before the first batch asks for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.policies import Tail
from stateful_sampler.order.shards import EpochWindows, distinct, locate_many
from stateful_sampler.order.strategy import SavedOrder
from stateful_sampler.stream.dataset import ShardedStream
from stateful_sampler.stream.gather import CHUNK_RECORDS, Spans
from stateful_sampler.stream.layout import StreamLayout
from stateful_sampler.stream.state import Manifest

MIXED_STATE_VERSION = 1
_FIELDS = {
    "version": int,
    "epoch": int,
    "position": int,
    "seed": int,
    "tail": str,
    "num_samples": int,
    "records": int,
    "sources": str,
    "sources_digest": str,
    "mixture": str,
    "slot": dict,
}
_TAG = 0x4D495853  # "MIXS": the permutations of map-style sources
_CHECK_CHARS = 4  # hex characters of each source's identity in the state


class MixedStream(ShardedStream):
    """Yields this rank's and worker's records of each epoch of a mixture of sources at ``weights``.

    Args:
        streams: the sources, in order (part of the identity): ``ShardedStream``s built without ranks
            (each keeps its shards, reader, window, seed and transform; its batching and tail are unused),
            or map-style datasets (``len`` and ``__getitem__``), each drawn in its own seeded permutation
            per source-epoch.
        weights: one non-negative weight per source (``Mixture``'s rules).
        batch_size: per-rank batch; ``stream.loader(...)`` builds the ``DataLoader`` with it.
        num_samples: the epoch's draws; default every source's records once in total.
        schedule, on_change: as ``Mixture``'s: weights from ``(epoch, position)`` on, and whether a state saved
            under another mixture (other weights, sources appended) continues (``"continue"``) or is refused.
        seed: seeds the map-style sources' permutations and the keys.
        tail, num_replicas, rank, yield_keys, transform: as ``ShardedStream``'s. A key's index is the record's
            place in the sources concatenated (``ConcatDataset`` order, a stream's shards concatenated).

    Example:
        >>> stream = MixedStream([range(4), range(100, 106)], [1, 1], batch_size=2, num_samples=10)
        >>> [record for record in stream]
        [3, 101, 1, 104, 0, 100, 2, 102, 3, 105]
        >>> state = stream.state_dict()
        >>> (state["epoch"], state["position"])
        (1, 0)
    """

    def __init__(
        self,
        streams: Sequence[Any],
        weights: Any,
        *,
        batch_size: int,
        num_samples: int | None = None,
        schedule: Mapping[Any, Any] | None = None,
        on_change: str = "refuse",
        seed: int = 0,
        tail: str = "pad",
        num_replicas: int | None = None,
        rank: int | None = None,
        yield_keys: bool = False,
        transform: Callable[..., Any] | None = None,
    ) -> None:
        if isinstance(streams, (str, bytes)) or not isinstance(streams, Sequence) or not streams:
            raise TypeError(
                f"streams must be a non-empty list of ShardedStreams or map-style datasets, got {streams!r}"
            )
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.sources = [_checked_source(index, source) for index, source in enumerate(streams)]
        sizes, self._checks, by_rows = zip(*map(_facts, self.sources))
        self._by_rows = np.array(by_rows)  # the sources a first batch reads on their own, row by row
        self.init_delivery(
            batch_size=batch_size, seed=seed, tail=tail, num_replicas=num_replicas, rank=rank,
            yield_keys=yield_keys, transform=transform,
        )  # fmt: skip
        self.mixture = Mixture(  # which checks num_samples
            list(sizes), weights, num_samples=sum(sizes) if num_samples is None else num_samples, schedule=schedule,
            on_change=on_change,
        )  # fmt: skip
        self.offsets = self.mixture.offsets

    @property
    def epoch_size(self) -> int:
        """Positions in an epoch: the mixture's ``num_samples``."""
        return self.mixture.num_samples

    def __repr__(self) -> str:
        return (
            f"MixedStream(<{len(self.sources)} sources>, num_samples={self.epoch_size}, batch_size={self.batch_size})"
        )

    # -- records

    def pass_chunks(self, epoch: int, layout: StreamLayout, worker: int, workers: int) -> Iterator[Iterable[Any]]:
        """This rank's and worker's records of ``epoch`` dealt by ``layout``: one batch first, then blocks
        doubling up to ``CHUNK_RECORDS`` (the first batch waits for its own sources' windows only)."""
        rank, batch = self.rank, self.batch_size
        reading = _Reading(self)
        begin, step = 0, batch * workers
        alone = True  # the first batch: its sources stand mid-way in their orders at any pass but the very first
        while begin < layout.local_length:
            end = min(begin + step, layout.local_length)
            local = layout.worker_locals(worker, workers, batch, begin, end)
            begin, step = end, min(2 * step, max(batch, CHUNK_RECORDS) * workers)
            if local.size:
                yield self._delivered(epoch, layout, layout.slots(rank, local), reading, alone)
                alone = False

    def _delivered(
        self, epoch: int, layout: StreamLayout, slots: np.ndarray, reading: _Reading, alone: bool
    ) -> list[Any]:
        transform = self.transform
        takes_key = getattr(transform, "takes_key", False)
        keyed = self.yield_keys or takes_key
        records, indices = reading.records(epoch, layout.positions(slots), alone, keyed)
        if indices is None:
            return records if transform is None else [transform(record) for record in records]
        keys = [
            SampleKey(index, self.seed, epoch, slot, slot >= layout.size)
            for index, slot in zip(indices.tolist(), slots.tolist())
        ]
        if transform is not None:
            records = [transform(*pair) if takes_key else transform(pair[0]) for pair in zip(records, keys)]
        return list(zip(records, keys)) if self.yield_keys else records

    def epoch_records(self, epoch: int, start: int, stop: int) -> Iterator[Any]:
        """The records at positions [start, stop) of ``epoch``, in order, for every rank together (no ranks,
        batching, padding or outer transform; each source's transform applied): what an order built over
        this stream (``PackedStream``) reads. Each source window is read once on the way."""
        if not 0 <= start <= stop <= self.epoch_size:
            raise ValueError(f"positions must satisfy 0 <= start <= stop <= {self.epoch_size}, got {start}, {stop}")
        reading = _Reading(self)
        for begin in range(start, stop, CHUNK_RECORDS):
            yield from reading.records(epoch, np.arange(begin, min(begin + CHUNK_RECORDS, stop), dtype=np.int64))[0]

    def epoch_indices(self, epoch: int, positions: np.ndarray, orders: dict[Any, Any] | None = None) -> np.ndarray:
        """The index (in the sources concatenated, as a key's) of the record at each position of ``epoch``,
        for every rank together, reading no data: the order that a sampler built over this stream's records
        draws (``PackedStream`` packs it), the same records ``epoch_records`` reads there. ``orders``: a dict
        the caller keeps between calls, holding each source-epoch's order so that its set-up is paid once."""
        orders = {} if orders is None else orders
        sources, source_epochs, inside = self._draws(epoch, np.asarray(positions, dtype=np.int64))
        indices = np.empty(len(inside), dtype=np.int64)
        for source, source_epoch, at in _runs(sources, source_epochs, np.arange(len(inside))):
            order = orders.get((source, source_epoch))
            if order is None:
                stream = self.sources[source]
                if isinstance(stream, ShardedStream):
                    order = stream.order.epoch(source_epoch).records
                else:
                    order = self._map_permutation(source, source_epoch)
                orders[(source, source_epoch)] = order
            indices[at] = self.offsets[source] + order(inside[at])
        return indices

    def _draws(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each draw at ``positions`` of ``epoch``: its source, its source-epoch and its place in that source-epoch."""
        sources, draws = self.mixture.locate(epoch, positions)
        source_epochs, inside = np.divmod(draws, self.mixture.sizes[sources])
        return sources, source_epochs, inside

    def _map_permutation(self, source: int, source_epoch: int) -> FeistelPermutation:
        """The order of map-style source ``source`` in its epoch ``source_epoch``: a seeded permutation of its
        records, its own for each source and source-epoch."""
        seed = derive_seed(Domain.PERMUTATION, self.seed, _TAG, source)
        return FeistelPermutation(len(self.sources[source]), seed, source_epoch)

    # -- state

    def state_at(self, epoch: int, position: int) -> dict[str, Any]:
        """The saved state at ``position`` of ``epoch``: position, identity and the mixture's slot (O(sources))."""
        return {
            "version": MIXED_STATE_VERSION,
            "epoch": epoch,
            "position": position,
            "seed": self.seed,
            "tail": self.tail.value,
            "num_samples": self.epoch_size,
            "records": int(sum(self.mixture.sizes.tolist())),
            "sources": "".join(check[:_CHECK_CHARS] for check in self._checks),
            "sources_digest": _digest(self._checks),
            "mixture": self.mixture.fingerprint(),
            "slot": self.mixture.state_at(epoch, position),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state in O(sources); world size, worker count and batch size may differ, and with
        ``on_change="continue"`` the weights and schedule too, or sources appended. A changed, removed or
        reordered source, another seed, tail or epoch length raises ``IncompatibleStateError`` naming it."""
        saved = _checked_state(state)
        mine = {"seed": self.seed, "tail": self.tail.value, "num_samples": self.epoch_size}  # as state_at writes them
        for name, value in mine.items():
            if saved[name] != value:
                raise IncompatibleStateError(name, saved[name], value, "the state belongs to another mixed stream")
        self._check_sources(saved)
        if saved["position"] > saved["num_samples"]:
            raise IncompatibleStateError(
                "position", saved["position"], f"at most {saved['num_samples']}", "beyond the end of the epoch"
            )
        order = SavedOrder(
            saved["records"], Mixture.name, saved["mixture"], saved["slot"], saved["epoch"], saved["position"]
        )
        resumed = self.mixture.resume_from(order)
        if resumed is None:
            raise IncompatibleStateError(
                "mixture", saved["mixture"], self.mixture.fingerprint(), self.mixture.mismatch_hint()
            )
        self.mixture = resumed
        self.restart_at(saved["epoch"], saved["position"])

    def _check_sources(self, saved: Mapping[str, Any]) -> None:
        """Refuse unless the saved sources come first, in order, unchanged, naming the first that differs."""
        checks = saved["sources"]
        count, left = divmod(len(checks), _CHECK_CHARS)
        if left or not count:
            raise IncompatibleStateError("sources", checks, f"{_CHECK_CHARS} hex characters per source")
        if count > len(self.sources):
            raise IncompatibleStateError(
                "sources", f"{count} sources", f"{len(self.sources)} sources",
                "a mixed stream continues a saved run with its sources first, in order: keep a removed source "
                "with weight 0, and append new ones after the saved ones",
            )  # fmt: skip
        for index in range(count):
            before = checks[index * _CHECK_CHARS : (index + 1) * _CHECK_CHARS]
            if before != self._checks[index][:_CHECK_CHARS]:
                raise IncompatibleStateError(
                    f"sources[{index}]", "the saved source", _describe(self.sources[index]),
                    f"source {index} changed since the save (other shards, counts, contents, seed or window, another "
                    f"size), or the sources were reordered: keep the saved sources first, in order, unchanged",
                )  # fmt: skip
        if _digest(self._checks[:count]) != saved["sources_digest"]:
            raise IncompatibleStateError(
                "sources_digest", saved["sources_digest"], _digest(self._checks[:count]),
                f"one of the {count} saved sources changed since the save",
            )  # fmt: skip


class _Reading:
    """One pass's reads: each source's pieces of its current window (and of the window before), and its
    source-epoch's order."""

    def __init__(self, stream: MixedStream) -> None:
        self.stream = stream
        self.windows: dict[tuple[int, int], EpochWindows] = {}  # (source, source-epoch) -> its windows
        self.pieces: dict[int, dict[tuple[int, int], Spans]] = {}  # source -> (source-epoch, window) -> pieces read
        self.permutations: dict[tuple[int, int], FeistelPermutation] = {}

    def records(
        self, epoch: int, positions: np.ndarray, alone: bool = False, keyed: bool = False
    ) -> tuple[list[Any], np.ndarray | None]:
        """The records at epoch positions, and with ``keyed`` their indices in the sources concatenated (else None);
        ``alone``: read on their own where a source's reader reads rows (a pass's first batch), not with their
        window's pieces."""
        stream = self.stream
        sources, source_epochs, inside = stream._draws(epoch, positions)
        out: list[Any] = [None] * len(positions)
        indices = np.empty(len(positions), dtype=np.int64)
        rest = np.arange(len(positions))
        if alone:  # the draws of every source that reads rows located and read at once, without their windows
            by_rows = stream._by_rows[sources]
            taken, rest = np.flatnonzero(by_rows), np.flatnonzero(~by_rows)
            if taken.size:
                located = self._records_alone(sources[taken], source_epochs[taken], inside[taken], taken, out, keyed)
                if located is not None:
                    indices[taken] = located
        for source, source_epoch, at in _runs(sources[rest], source_epochs[rest], rest):
            found, index = self._source_records(source, source_epoch, inside[at])
            indices[at] = stream.offsets[source] + index
            for slot, record in zip(at.tolist(), found):
                out[slot] = record
        return out, indices if keyed else None

    def _records_alone(
        self,
        sources: np.ndarray,
        source_epochs: np.ndarray,
        inside: np.ndarray,
        slots: np.ndarray,
        out: list[Any],
        keyed: bool,
    ) -> np.ndarray | None:
        """Draws of sources that read rows, each at its place in its source-epoch's order, read on their own: one
        ``locate_many`` for all their source-epochs, one ``shard_rows`` per shard of a source. The records go into
        ``out`` at ``slots``; returned with ``keyed``: their indices in the sources concatenated."""
        stream = self.stream
        order = np.lexsort((source_epochs, sources))  # by (source, source-epoch)
        by_source = sources[order]
        by_epoch = source_epochs[order]
        new = np.concatenate(([True], (by_source[1:] != by_source[:-1]) | (by_epoch[1:] != by_epoch[:-1])))
        groups = np.empty(len(order), dtype=np.int64)
        groups[order] = np.cumsum(new) - 1
        heads = order[new]  # a draw of each (source, source-epoch), in that order
        owners = sources[heads].tolist()
        shuffles = [stream.sources[source].order for source in owners]
        shards, rows = locate_many(shuffles, source_epochs[heads].tolist(), groups, inside)
        read = np.lexsort((shards, sources))  # by (source, shard): each shard of each source read once
        owner, shard = sources[read], shards[read]
        cuts = np.flatnonzero(np.concatenate(([True], (owner[1:] != owner[:-1]) | (shard[1:] != shard[:-1]), [True])))
        rows_read, slots_read = rows[read], slots[read].tolist()
        owned, shard_ids = owner.tolist(), shard.tolist()
        for begin, end in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            source = stream.sources[owned[begin]]
            records = source.gather.shard_rows(shard_ids[begin], rows_read[begin:end])
            if source.transform is not None:
                records = [source.transform(record) for record in records]
            for slot, record in zip(slots_read[begin:end], records):
                out[slot] = record
        if not keyed:
            return None
        offsets = np.concatenate([shuffle.offsets for shuffle in shuffles])
        shard_base = np.cumsum([0] + [len(shuffle.offsets) for shuffle in shuffles])[:-1]
        return stream.offsets[sources] + offsets[shard_base[groups] + shards] + rows

    def _source_records(self, source: int, source_epoch: int, inside: np.ndarray) -> tuple[list[Any], np.ndarray]:
        """Records at positions of a source's source-epoch, and their indices in that source, read from their
        window's pieces."""
        stream = self.stream.sources[source]
        if not isinstance(stream, ShardedStream):
            key = (source, source_epoch)
            permutation = self.permutations.get(key)
            if permutation is None:
                permutation = self.permutations[key] = self.stream._map_permutation(source, source_epoch)
            index = permutation(inside)
            return [stream[i] for i in index.tolist()], index
        windows = self._epoch_windows(source, source_epoch)
        shards, rows = windows.locate(inside)
        window_of = windows.window_of(inside)
        records: list[Any] = [None] * len(inside)
        for window in distinct(window_of).tolist():
            at = np.flatnonzero(window_of == window)
            spans = self._pieces(source, windows, window, shards[at], rows[at])
            for slot, record in zip(at.tolist(), stream.gather.records(spans, None, shards[at], rows[at])):
                records[slot] = record
        if stream.transform is not None:
            records = [stream.transform(record) for record in records]
        return records, stream.order.offsets[shards] + rows

    def _epoch_windows(self, source: int, source_epoch: int) -> EpochWindows:
        key = (source, source_epoch)
        windows = self.windows.get(key)
        if windows is None:
            stream: ShardedStream = self.stream.sources[source]
            self.windows = {k: v for k, v in self.windows.items() if k[0] != source}  # a source moves forward
            windows = self.windows[key] = stream.order.epoch(source_epoch)
        return windows

    def _pieces(self, source: int, windows: EpochWindows, window: int, shards: np.ndarray, rows: np.ndarray) -> Spans:
        """A source window's pieces that hold (shard, row), each piece read once, whole, at the first draw that
        needs it, and kept for the window's next draws; the source's last two windows kept."""
        held = self.pieces.setdefault(source, {})
        stream: ShardedStream = self.stream.sources[source]
        key = (windows.epoch, window)
        spans = held.get(key)
        if spans is None:
            stream.gather.announce(windows, window)
            spans = held[key] = {}
            while len(held) > 2:
                del held[next(iter(held))]
        first_of: dict[int, int] = {}  # each shard's first row here, for the shards whose piece is not read yet
        for shard, row in zip(shards.tolist(), rows.tolist()):
            if shard not in spans:
                first_of.setdefault(shard, row)
        if first_of:
            unread = np.fromiter(first_of, dtype=np.int64, count=len(first_of))
            starts, stops = stream.order.piece_bounds(unread, np.fromiter(first_of.values(), np.int64, len(first_of)))
            bounds = np.stack((starts, stops - 1), axis=1).reshape(-1)
            spans.update(stream.gather.read(np.repeat(unread, 2), bounds, windows.window_shards(window).tolist()))
        return spans


def _runs(sources: np.ndarray, source_epochs: np.ndarray, slots: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """The draws grouped by the (source, source-epoch) they fall in, each group with its ``slots`` (in first-seen
    order)."""
    slots_of: dict[tuple[int, int], list[int]] = {}
    for slot, key in zip(slots.tolist(), zip(sources.tolist(), source_epochs.tolist())):
        slots_of.setdefault(key, []).append(slot)
    return [(source, source_epoch, np.array(at, dtype=np.int64)) for (source, source_epoch), at in slots_of.items()]


def _checked_source(index: int, source: Any) -> Any:
    if isinstance(source, MixedStream):
        raise TypeError(f"streams[{index}] is a MixedStream: mix its sources into one MixedStream instead")
    if isinstance(source, ShardedStream):
        num_replicas, rank = source.given_ranks
        if num_replicas is not None or rank is not None:
            raise ValueError(
                f"streams[{index}] was built with num_replicas={num_replicas}, rank={rank}: a MixedStream deals its "
                f"draws to the ranks itself, so build its source streams without num_replicas and rank, and pass "
                f"them to the MixedStream"
            )
        return source
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            f"streams[{index}] must be a ShardedStream or a map-style dataset (len and __getitem__), got "
            f"{type(source).__name__}"
        )
    return source


def _facts(source: Any) -> tuple[int, str, bool]:
    """A source's size, its identity (a stream's shard list: names, counts, contents; its seed and window; a map-style
    dataset's type and size, its content out of sight), and whether it reads records at rows on their own."""
    if isinstance(source, ShardedStream):
        identity = _stream_identity(source.manifest, source.seed, source.window)
        return source.epoch_size, identity, source.gather.reads_rows
    return len(source), _hashed(f"map\0{type(source).__qualname__}\0{len(source)}"), False


_KEPT_IDENTITIES = 4096  # streams' identities kept at most, then started afresh
_identities: dict[tuple[Any, ...], str] = {}  # (manifest, seed, window, their types) -> the stream's identity


def _stream_identity(manifest: Manifest, seed: int, window: int) -> str:
    """A stream's identity from its shard list's (a frozen value), seed and window: hashed once per distinct three
    (a ``MixedStream`` is built again at every resume over the same streams: 1 us per source)."""
    key = (manifest, seed, window, type(seed), type(window))  # a bool equals an int, and is written otherwise
    found = _identities.get(key)
    if found is None:
        m = manifest
        found = _hashed(f"stream\0{m.shards}\0{m.records}\0{m.digest}\0{m.locator}\0{seed}\0{window}")
        if len(_identities) >= _KEPT_IDENTITIES:
            _identities.clear()  # not an eviction by iteration, which a thread adding at once would break
        _identities[key] = found
    return found


def _hashed(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _digest(checks: Sequence[str]) -> str:
    return hashlib.blake2b("".join(checks).encode(), digest_size=6).hexdigest()


def _describe(source: Any) -> str:
    if isinstance(source, ShardedStream):
        return f"a ShardedStream of {len(source.shards)} shards, {source.epoch_size} records"
    return f"a {type(source).__name__} of {len(source)} records"


def _checked_state(state: Any) -> dict[str, Any]:
    """The saved dict, refused naming the field unless it is exactly a version 1 mixed stream state."""
    if not isinstance(state, Mapping):
        raise IncompatibleStateError("state", type(state).__name__, "a dict from MixedStream.state_dict()")
    version = state.get("version", "<missing>")
    if type(version) is not int or version != MIXED_STATE_VERSION:
        raise IncompatibleStateError("version", version, MIXED_STATE_VERSION, "unknown mixed stream state version")
    for name in sorted(set(state) ^ set(_FIELDS)):
        kind = _FIELDS.get(name)
        raise IncompatibleStateError(
            name,
            state.get(name, "<missing>"),
            "<absent>" if kind is None else kind.__name__,
            "not a field of this version",
        )
    for name, kind in _FIELDS.items():
        value = state[name]
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise IncompatibleStateError(name, value, "a non-negative int" if kind is int else kind.__name__)
    if state["tail"] not in (Tail.PAD.value, Tail.DROP.value):
        raise IncompatibleStateError("tail", state["tail"], [Tail.PAD.value, Tail.DROP.value])
    return dict(state)
