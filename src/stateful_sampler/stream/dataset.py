"""``ShardedStream``: an ``IterableDataset`` over shards in the shard-and-window order, exactly resumable.

Which record fills each epoch position is fixed by (seed, epoch, position) alone
(``order.shards``); ranks and workers only decide who delivers it (``stream.layout``). So the
state is an epoch and a position, a resume is arithmetic, and a resume may change the worker
count, the world size and the batch size. A reader reads one window at a time: per window, each
shard it needs is read once, for the span of rows its positions fall on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from stateful_sampler.checks import check_bool, check_choice, check_int, check_optional_int
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.policies import Tail
from stateful_sampler.order.shards import EpochWindows, ShardedShuffle
from stateful_sampler.stream.layout import StreamLayout
from stateful_sampler.stream.readers import ShardReader, ShardReadError
from stateful_sampler.stream.state import STREAM_STATE_VERSION, Manifest, StreamState


@dataclass(frozen=True)
class _Cursor:
    epoch: int
    position: int


class ShardedStream(IterableDataset):
    """Yields this rank's and this worker's records of each epoch's shard-and-window order.

    Args:
        shards: shard names (paths), in a fixed order: their order is part of the order's identity.
        reader: a ``ShardReader`` (``ParquetReader``, or your own).
        batch_size: per-rank batch; pass the same to ``DataLoader``, which groups each worker's
            records into batches (worker w delivers the rank's batches w, w+n, ...).
        window: k, the shards shuffled together; memory and IO per reader are one window's.
        seed: an int in [0, 2**63).
        counts: records per shard; read from the reader once when not given.
        tail: ``"pad"`` (marked repeats even out the ranks) or ``"drop"``.
        num_replicas, rank: default to the process group, or 1 and 0 without one.
        yield_keys: yield ``(record, SampleKey)``; the key's index is the global record index
            (shards concatenated in the order given) and ``is_padding`` marks repeats.
        transform: applied to each record in the worker, e.g. to build tensors.
    """

    def __init__(
        self,
        shards: Sequence[str | os.PathLike[str]],
        reader: ShardReader,
        *,
        batch_size: int,
        window: int = 8,
        seed: int = 0,
        counts: Sequence[int] | None = None,
        tail: str = "pad",
        num_replicas: int | None = None,
        rank: int | None = None,
        yield_keys: bool = False,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if isinstance(shards, (str, os.PathLike)) or not shards:
            raise TypeError(f"shards must be a non-empty list of shard names, got {shards!r}")
        if not isinstance(reader, ShardReader):
            raise TypeError(f"reader must have count(shard) and read(shard, start, stop), got {type(reader).__name__}")
        self.shards = [os.fspath(shard) for shard in shards]
        self.reader = reader
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.window = check_int("window", window, minimum=1)
        self.seed = check_int("seed", seed, maximum=(1 << 63) - 1)
        self.tail = check_choice("tail", tail, Tail)
        if self.tail not in (Tail.PAD, Tail.DROP):
            raise ValueError(f"tail must be 'pad' or 'drop' for a stream, got {tail!r}")
        self.yield_keys = check_bool("yield_keys", yield_keys)
        self.transform = transform
        self._num_replicas = check_optional_int("num_replicas", num_replicas, minimum=1)
        self._rank = check_optional_int("rank", rank)
        self.rank  # noqa: B018 - validates rank against num_replicas now when both are known
        if counts is None:
            counts = [reader.count(shard) for shard in self.shards]
        if len(counts) != len(self.shards):
            raise ValueError(f"counts must give one count per shard ({len(self.shards)}), got {len(counts)}")
        self.counts = [check_int(f"counts[{i}] ({self.shards[i]!r})", count) for i, count in enumerate(counts)]
        self.order = ShardedShuffle(self.counts, self.window, self.seed)
        self.manifest = Manifest.of(self.shards, self.counts)
        self._cursor = _Cursor(0, 0)

    # -- ranks, resolved late like StatefulSampler's

    @property
    def num_replicas(self) -> int:
        if self._num_replicas is not None:
            return self._num_replicas
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        world_size = self.num_replicas
        rank = self._rank if self._rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
        if rank >= world_size:
            raise ValueError(f"rank must lie in [0, num_replicas) = [0, {world_size}), got {rank}")
        return rank

    def __getstate__(self) -> dict[str, Any]:
        """Workers started by spawn or forkserver have no process group: they get the ranks the
        main process resolved when the DataLoader pickled the dataset for them."""
        state = self.__dict__.copy()
        state["_num_replicas"], state["_rank"] = self.num_replicas, self.rank
        return state

    # -- epochs and length

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def position(self) -> int:
        """The epoch position the next pass starts from."""
        return self._cursor.position

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start; the current epoch keeps its (restored) position."""
        epoch = check_int("epoch", epoch)
        if epoch != self._cursor.epoch:
            self._cursor = _Cursor(epoch, 0)

    def layout(self) -> StreamLayout:
        """The current pass's deal of the rest of the epoch to the ranks."""
        world_size = self.num_replicas
        if self.tail is Tail.DROP and self.order.size < world_size:
            raise ValueError(
                f"tail='drop' with {self.order.size} records on num_replicas={world_size} ranks would drop "
                f"every record: use tail='pad' or fewer ranks"
            )
        return StreamLayout(self.tail, self.order.size, world_size, self._cursor.position)

    def __len__(self) -> int:
        """This rank's records from the current position to the end of the epoch."""
        return self.layout().local_length

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        return self.iter_worker(0, 1) if info is None else self.iter_worker(info.id, info.num_workers)

    def iter_worker(self, worker: int, workers: int) -> Iterator[Any]:
        """What DataLoader worker ``worker`` of ``workers`` yields: its batches, window by window."""
        layout = self.layout()
        rank = self.rank
        windows = self.order.epoch(self._cursor.epoch)
        starts = windows.window_starts.tolist()
        first = int(windows.window_of(np.array([min(layout.origin, layout.size - 1)]))[0])
        # Each window's slots, then the padding slots past the end: a reader holds one window at a time.
        spans = [(starts[w], starts[w + 1]) for w in range(first, windows.windows)] + [(layout.size, 2**62)]
        for window, (begin, end) in enumerate(spans, first):
            if window < windows.windows:
                self._enter_window(windows, window)
            local = layout.worker_locals(worker, workers, self.batch_size, *layout.local_range(rank, begin, end))
            if local.size:
                yield from self._deliver(windows, layout, rank, local)

    def _enter_window(self, windows: EpochWindows, window: int) -> None:
        """Tell a reader that fetches ahead (``ShardCache``) this window's shards and the next one's."""
        enter = getattr(self.reader, "enter_window", None)
        if enter is not None:
            names = [[self.shards[s] for s in windows.window_shards(w).tolist()] for w in (window, window + 1)]
            enter(names[0], names[1])

    def _deliver(self, windows: EpochWindows, layout: StreamLayout, rank: int, local: np.ndarray) -> Iterator[Any]:
        slots = layout.slots(rank, local)
        shards, rows = windows.locate(layout.positions(slots))
        records = self._fetch(shards, rows)
        if self.transform is not None:
            records = [self.transform(record) for record in records]
        if not self.yield_keys:
            yield from records
            return
        indices = (self.order.offsets[shards] + rows).tolist()
        for record, index, slot in zip(records, indices, slots.tolist()):
            yield record, SampleKey(index, self.seed, windows.epoch, slot, slot >= layout.size)

    def _fetch(self, shards: np.ndarray, rows: np.ndarray) -> list[Any]:
        """The records at (shard, row), reading each shard once for the span of rows needed."""
        records: list[Any] = [None] * len(rows)
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            needed = rows[where]
            start, stop = int(needed.min()), int(needed.max()) + 1
            name = self.shards[shard]
            try:
                span = self.reader.read(name, start, stop)
            except ShardReadError:
                raise
            except Exception as error:
                raise ShardReadError(f"could not read rows {start}..{stop - 1} of shard {name!r}: {error}") from error
            if len(span) != stop - start:
                raise ShardReadError(
                    f"shard {name!r} returned {len(span)} records for rows {start}..{stop - 1}, expected "
                    f"{stop - start}: it holds fewer than the {self.counts[shard]} records counted at start"
                )
            for slot, row in zip(where.tolist(), (needed - start).tolist()):
                records[slot] = span[row]
        return records

    # -- state

    def state_dict(self, consumed_batches: int) -> dict[str, Any]:
        """The state after the training loop consumed ``consumed_batches`` batches of the current pass.

        Count the loop's batches (``enumerate(loader, 1)``), not what workers prefetched; every rank
        has consumed the same count, so the state is the same on every rank.
        """
        consumed = check_int("consumed_batches", consumed_batches) * self.batch_size
        return self._state(self._cursor.epoch, self.layout().position_after(consumed)).to_dict()

    def _state(self, epoch: int, position: int) -> StreamState:
        return StreamState(
            version=STREAM_STATE_VERSION,
            shards=self.manifest.shards,
            records=self.manifest.records,
            digest=self.manifest.digest,
            locator=self.manifest.locator,
            seed=self.seed,
            window=self.window,
            tail=self.tail.value,
            epoch=epoch,
            position=position,
            world_size=self.num_replicas,
            batch_size=self.batch_size,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state in O(1); world size, worker count and batch size may differ.
        Another shard list, seed, window or tail raises ``IncompatibleStateError``."""
        saved = StreamState.from_dict(state)
        saved.check_continues(self._state(self._cursor.epoch, 0), self.shards, self.counts)
        self._cursor = _Cursor(saved.epoch, saved.position)
