"""``StatefulSampler``: a checkpointable, exactly resumable drop-in for ``DistributedSampler``.

Each epoch's order is a pure function of (seed, epoch, N), and the position in it is a single
integer, so saving is a handful of ints and resuming is arithmetic, not a replay. The sampler
subclasses ``DistributedSampler`` only so that Lightning leaves it in place under DDP; none of
the parent's state or RNG is used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain, repeat
from operator import length_hint
from typing import Any, Callable, Iterator, Sized

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from stateful_sampler.checks import check_bool, check_choice, check_int, check_optional_int
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.layout import EpochLayout, Tail, carry_epoch_start
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.orders import Order, StreamRecords
from stateful_sampler.state import STATE_VERSION, SamplerState

_FIRST_BLOCK = 1024  # small, so the first batch after a resume is quick
_MAX_BLOCK = 1 << 14  # amortises NumPy's per-call cost while the Feistel scratch arrays stay in L2 cache

PassStartHook = Callable[["StatefulSampler"], None]
_pass_start_hooks: list[PassStartHook] = []


def add_pass_start_hook(hook: PassStartHook) -> Callable[[], None]:
    """Call ``hook(sampler)`` when any pass starts, before it reads its epoch and position.

    A pass starts at the first ``next()`` of ``iter(sampler)``, which a ``DataLoader`` with
    workers reaches inside ``iter(loader)``; this is the last moment to restore state into a
    sampler that was built after the checkpoint was read. Returns a function that removes it.
    """
    _pass_start_hooks.append(hook)
    return lambda: _pass_start_hooks.remove(hook)


@dataclass(frozen=True)
class _Cursor:
    epoch: int
    position: int  # global positions of the epoch consumed
    carry_start: int  # stream position where the epoch starts (carry only)


@dataclass
class _Pass:
    """One iteration over the rest of an epoch, and how far it has drawn."""

    origin: _Cursor
    layout: EpochLayout
    rank: int
    local_start: int
    block_start: int
    block: Iterator[Any]
    block_length: int = 0
    finished: bool = False

    def position_after(self, local_count: int) -> int:
        local_stop = min(self.local_start + local_count, self.layout.local_length(self.rank))
        return self.layout.position_after(self.rank, self.origin.position, local_stop)

    def drawn_position(self) -> int:
        taken = self.block_length - length_hint(self.block)
        return self.position_after(self.block_start + taken - self.local_start)


class StatefulSampler(DistributedSampler):
    """Yields this rank's share of each epoch's order, from the saved position onwards.

    Args:
        data_source: a sized dataset or the number of records N.
        shuffle: permute each epoch (``False`` gives 0..N-1).
        seed: the order's seed, an int in [0, 2**63) (an int64: keys carry it through collate).
        num_replicas, rank: the ranks; default to the process group, or 1 and 0 without one.
        tail: ``"pad"``, ``"drop"``, ``"uneven"`` or ``"carry"`` (see ``Tail``).
        order: ``"fast"`` (O(block) bijection) or ``"torch"`` (exactly ``DistributedSampler``).
        batch_size: per-rank batch; needed by ``carry`` and to count consumed batches.
        yield_keys: yield ``SampleKey`` s instead of indices (see ``KeyedDataset``).
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        tail: str = "pad",
        order: str = "fast",
        batch_size: int | None = None,
        yield_keys: bool = False,
    ) -> None:
        self.dataset = data_source
        self.size = _dataset_size(data_source)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed, maximum=(1 << 63) - 1)
        self.tail = check_choice("tail", tail, Tail)
        self.order = check_choice("order", order, Order)
        self.batch_size = check_optional_int("batch_size", batch_size, minimum=1)
        self.yield_keys = check_bool("yield_keys", yield_keys)
        self._num_replicas = check_optional_int("num_replicas", num_replicas, minimum=1)
        self._rank = check_optional_int("rank", rank)
        self.rank  # noqa: B018 - validates rank against num_replicas now when both are known
        self._records = StreamRecords(self.order, self.shuffle, self.seed, self.size)
        self._cursor = _Cursor(epoch=0, position=0, carry_start=0)
        self._pass: _Pass | None = None

    # -- the ranks, resolved late: a sampler built before init_process_group still shards right

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        if self._num_replicas is not None:
            return self._num_replicas
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:  # type: ignore[override]
        world_size = self.num_replicas
        if self._rank is not None:
            rank = self._rank
        else:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if rank >= world_size:
            raise ValueError(f"rank must lie in [0, num_replicas) = [0, {world_size}), got {rank}")
        if self.tail is Tail.DROP and 0 < self.size < world_size:
            raise ValueError(
                f"tail='drop' with {self.size} records on num_replicas={world_size} ranks would drop "
                f"every record: use tail='pad' or 'uneven', or fewer ranks"
            )
        return rank

    # -- DistributedSampler's public attributes, derived rather than stored

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self._cursor.epoch

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        return self.tail is Tail.DROP

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self._layout(self._cursor).length

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        return len(self)

    def __len__(self) -> int:
        """This rank's indices in the current epoch, counted from its start (as Lightning expects).

        The current epoch is the one a pass is drawing, or has drawn to its end, until ``set_epoch``
        or the next pass: DataLoader workers can draw a short epoch whole before training reads
        ``len(loader)``, and under ``carry`` the next epoch's length differs."""
        layout = self._pass.layout if self._pass is not None else self._layout(self._cursor)
        return layout.local_length(self.rank)

    # -- epochs

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start; the current epoch keeps its position (Lightning calls this again
        on resume, after the restored mid-epoch position is in place)."""
        epoch = check_int("epoch", epoch)
        if epoch != self._cursor.epoch or (self._pass is not None and self._pass.finished):
            self._commit(_Cursor(epoch, 0, self._carry_start(epoch)))

    def _carry_start(self, epoch: int) -> int:
        if self.tail is not Tail.CARRY:
            return 0
        return carry_epoch_start(self.size, self._global_batch(), epoch, self._cursor.epoch, self._cursor.carry_start)

    def _global_batch(self) -> int:
        return (self.batch_size or 1) * self.num_replicas

    def _layout(self, cursor: _Cursor) -> EpochLayout:
        return EpochLayout.build(
            self.tail, self.size, self.num_replicas, cursor.epoch, self._global_batch(), cursor.carry_start
        )

    def _commit(self, cursor: _Cursor) -> None:
        """Set where the next pass starts, and detach any pass under way from the state."""
        self._cursor = cursor
        self._pass = None

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        """A lazy pass: epoch and position are read at the first ``next()``, not here.

        ``chain`` hands out each block's items in C; the generator behind it only resumes once
        per block, which halves the per-index cost of a generator that yields every item."""
        return chain.from_iterable(self._pass_blocks())

    def _pass_blocks(self) -> Iterator[Iterator[Any]]:
        for hook in tuple(_pass_start_hooks):
            hook(self)
        origin = self._cursor
        layout = self._layout(origin)
        rank = self.rank
        local_start = layout.local_start(rank, origin.position)
        local_stop = layout.local_length(rank)
        current = _Pass(origin, layout, rank, local_start, local_start, iter(()))
        self._pass = current
        block = _FIRST_BLOCK
        while current.block_start + current.block_length < local_stop:
            start = current.block_start + current.block_length
            stop = min(start + block, local_stop)
            drawn, items = self._items(layout, rank, start, stop)
            current.block_start, current.block_length, current.block = start, stop - start, drawn
            yield items
            block = min(2 * block, _MAX_BLOCK)
        if self._pass is current:
            # A completed pass moves on, so a forgotten set_epoch never replays the same order.
            current.finished = True
            self._cursor = _Cursor(origin.epoch + 1, 0, layout.stream_start + layout.length if self.tail is Tail.CARRY else 0)

    def _items(self, layout: EpochLayout, rank: int, start: int, stop: int) -> tuple[Iterator[int], Iterator[Any]]:
        """A block's records as an iterator whose ``length_hint`` counts what was drawn, and the
        items to yield: those records, or keys made from them as they are drawn (made up front,
        a block of keys outlives the young GC generation and costs about 6x more per key)."""
        positions = layout.global_positions(rank, start, stop)
        streams = layout.stream_positions(positions)
        records = iter(self._records(streams).tolist())
        if not self.yield_keys:
            return records, records
        passes = (streams // max(self.size, 1)).tolist()
        padding = layout.is_padding(positions).tolist()
        return records, map(SampleKey, records, repeat(self.seed), passes, positions.tolist(), padding)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's whole order for an epoch (default: the current one), without moving the cursor."""
        layout = self.layout(epoch)
        positions = layout.global_positions(self.rank, 0, layout.local_length(self.rank))
        return self._records(layout.stream_positions(positions))

    def dropped_indices(self, epoch: int | None = None) -> list[int]:
        """Records that ``tail='drop'`` leaves out of an epoch (default: the current one)."""
        return self.unused_indices(epoch) if self.tail is Tail.DROP else []

    def unused_indices(self, epoch: int | None = None) -> list[int]:
        """Records of an epoch's own permutation that the epoch does not take: cut for good under
        ``drop``, rolled over into the next epoch under ``carry``, none otherwise."""
        unused = self.layout(epoch).unused_stream()
        return self._records(np.arange(unused.start, unused.stop, dtype=np.int64)).tolist()

    def layout(self, epoch: int | None = None) -> EpochLayout:
        """An epoch's layout (default: the current one): its length, padding and carried positions,
        for tools such as the coverage audit that must answer from the sampler's own arithmetic."""
        return self._layout(self._cursor if epoch is None else self._cursor_at(epoch))

    def _cursor_at(self, epoch: int) -> _Cursor:
        epoch = check_int("epoch", epoch)
        return _Cursor(epoch, 0, self._carry_start(epoch))

    # -- state

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The state to save, as a JSON-serialisable dict of a few hundred bytes.

        With no argument: the position this sampler has *drawn* up to. That is exact when nothing
        runs ahead of training (``num_workers=0``) and inside torchdata's ``StatefulDataLoader``,
        which snapshots sampler state as each batch's indices are fetched.

        With ``consumed_batches=k``: the position after the first k batches of the current pass,
        which is what a training loop has consumed whatever ``DataLoader`` workers prefetched.
        Count the batches of the loop over the loader (``enumerate(loader, 1)``); needs
        ``batch_size``.
        """
        if consumed_batches is None:
            cursor = self._cursor
            if self._pass is not None and not self._pass.finished:
                cursor = replace(self._pass.origin, position=self._pass.drawn_position())
        else:
            if self.batch_size is None:
                raise ValueError("state_dict(consumed_batches=...) needs StatefulSampler(..., batch_size=B)")
            consumed = check_int("consumed_batches", consumed_batches) * self.batch_size
            current = self._pass or self._pass_from(self._cursor)
            cursor = replace(current.origin, position=current.position_after(consumed))
        return self._state(cursor).to_dict()

    def _pass_from(self, cursor: _Cursor) -> _Pass:
        layout = self._layout(cursor)
        start = layout.local_start(self.rank, cursor.position)
        return _Pass(cursor, layout, self.rank, start, start, iter(()))

    def _state(self, cursor: _Cursor) -> SamplerState:
        return SamplerState(
            version=STATE_VERSION,
            size=self.size,
            seed=self.seed,
            shuffle=self.shuffle,
            tail=self.tail.value,
            order=self.order.value,
            epoch=cursor.epoch,
            position=cursor.position,
            carry_start=cursor.carry_start,
            world_size=self.num_replicas,
            batch_size=self.batch_size,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state in O(1). World size and batch size may differ from the run
        that saved it; another dataset size, seed, shuffle, tail or order raises
        ``IncompatibleStateError`` and leaves this sampler as it was."""
        saved = SamplerState.from_dict(state)
        saved.check_continues(self._state(self._cursor))
        self._commit(_Cursor(saved.epoch, saved.position, saved.carry_start))


def _dataset_size(data_source: Any) -> int:
    if isinstance(data_source, bool):
        raise TypeError(f"data_source must be a sized dataset or an int, got bool {data_source!r}")
    if isinstance(data_source, int) or isinstance(data_source, np.integer):
        size = data_source
    elif hasattr(data_source, "__len__"):
        size = len(data_source)
    else:
        raise TypeError(f"data_source must be a sized dataset or an int, got {type(data_source).__name__}")
    return check_int("data_source (its length N)", size, maximum=MAX_SIZE - 1)
