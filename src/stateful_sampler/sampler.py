"""``StatefulSampler``: a checkpointable, exactly resumable drop-in for ``DistributedSampler``.

Each epoch's order is a pure function of (seed, epoch, N), and the position in it is a single
integer, so saving is a handful of ints and resuming is arithmetic, not a replay. The sampler
subclasses ``DistributedSampler`` only so that Lightning leaves it in place under DDP; none of
the parent's state or RNG is used.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sized
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain, repeat
from operator import length_hint
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

# private: torch exposes no public type for a DataLoader's iterator; the sampler tells its own (workers or not)
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from stateful_sampler.checks import check_bool, check_choice, check_int, check_optional_int
from stateful_sampler.errors import DoubleShardingError, IncompatibleStateError, PrefetchedStateError
from stateful_sampler.hooks import (
    ConsumedSource,  # noqa: F401 - re-exported, the registry lives in hooks
    PassStartHook,  # noqa: F401 - re-exported, the registry lives in hooks
    add_pass_start_hook,  # noqa: F401 - re-exported, the registry lives in hooks
    consumed_count,
    pass_starting,
    set_consumed_source,  # noqa: F401 - re-exported, the registry lives in hooks
)
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.layout import MAX_BATCH, MAX_EPOCH, MAX_RANKS, EpochLayout, carry_epoch_start
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.policies import Order, Tail
from stateful_sampler.order.strategy import SavedOrder, Strategy, Uniform
from stateful_sampler.ranks import process_rank, process_world_size
from stateful_sampler.records import MAX_TORCH_SIZE, PassRecords
from stateful_sampler.resharding import refuse_resharding
from stateful_sampler.state import STATE_VERSION, SamplerState

_FIRST_BLOCK = 1024  # small, so the first batch after a resume is quick
_MAX_BLOCK = 1 << 14  # amortises NumPy's per-call cost while the Feistel scratch arrays stay in L2 cache

_DRIVER_DEPTH = 8  # frames searched for the DataLoader iterator that starts a pass


@dataclass(frozen=True)
class _Cursor:
    """Where the next pass starts: the epoch, the global positions of it consumed (the next pass's
    segment starts there), and the epoch's end where it is already fixed."""

    epoch: int
    position: int
    carry_start: int  # stream position where the epoch starts (carry only)
    end: int | None = None  # None: laid out on the current ranks and batch size from ``position``


@dataclass
class _Pass:
    """One iteration over the rest of an epoch, and how far it has drawn. ``exact`` (when given) lays the pass out
    the first time ``layout`` is asked for: a pass whose length is still being counted draws its first positions
    below the floor of its length without it (``StatefulSampler._pass_blocks``), and anything that asks for the layout
    (a state, a length, a certificate) waits for that count."""

    origin: _Cursor
    known_layout: EpochLayout | None
    rank: int
    block_start: int
    block: Iterator[Any]
    block_length: int = 0
    finished: bool = False
    prefetches: bool = False  # drawn by a multi-process DataLoader iterator: drawn runs ahead of consumed
    snapshots: bool = False  # drawn by torchdata's StatefulDataLoader, which snapshots state per fetch
    driver: Any = None  # a weak reference to the DataLoader iterator drawing the pass, if any
    drawn_blocks: tuple[tuple[int, np.ndarray], ...] = ()  # the last two blocks drawn: local start, records
    exact: Any = None  # () -> EpochLayout, where ``known_layout`` is None

    @property
    def layout(self) -> EpochLayout:
        if self.known_layout is None:
            self.known_layout = self.exact()
        return self.known_layout

    def loop_ended(self) -> bool:
        """Whether the loop over this pass saw its end: torchdata's iterator knows (a partial last batch
        asks the sampler past its end before the loop has it); for any other driver, the pass's end."""
        iterator = self.driver() if self.driver is not None else None
        if self.snapshots and iterator is not None and hasattr(iterator, "_finished"):
            # private: torchdata's StatefulDataLoader iterator says only through _finished that its pass ended
            return bool(iterator._finished)
        return self.finished

    def drawn(self) -> int:
        """Local positions drawn so far (all of them once the pass has ended)."""
        return self.block_start + self.block_length - length_hint(self.block)

    def cursor_after(self, local_count: int) -> _Cursor:
        """The cursor once this rank has taken ``local_count`` positions of the pass."""
        position = self.layout.position_after(self.rank, local_count)
        return replace(self.origin, position=position, end=self.layout.length)


class StatefulSampler(DistributedSampler):
    """Yields this rank's share of each epoch's order, from the saved position onwards.

    Args:
        data_source: a sized dataset or the number of records N (an int or a 0-d integer tensor).
        num_replicas, rank: the ranks; default to the process group, or 1 and 0 without one.
        shuffle: permute each epoch (``False`` gives 0..N-1; default ``True``, or a ``Uniform``
            strategy's own).
        seed: the order's seed, an int in [0, 2**63) (an int64: keys carry it through collate).
        drop_last: ``DistributedSampler``'s flag: ``True`` is ``tail="drop"``, ``False`` ``"pad"``.
            The first five arguments are positional as ``DistributedSampler(dataset, num_replicas,
            rank, shuffle, seed, drop_last)`` takes them.
        tail: ``"pad"`` (default), ``"drop"``, ``"uneven"`` or ``"carry"`` (see ``Tail``).
        order: ``"fast"`` (O(block) bijection) or ``"torch"`` (exactly ``DistributedSampler``).
        batch_size: per-rank batch; needed by ``carry``; otherwise a ``ResumableLoader`` takes it from
            its ``DataLoader``.
        yield_keys: yield ``SampleKey`` s instead of indices (see ``KeyedDataset``).
        strategy: the order of each pass (``Uniform()`` by default; see ``order.strategy``);
            ``shuffle`` and ``order`` apply to ``Uniform`` only.

    Example:
        >>> sampler = StatefulSampler(10, seed=1, num_replicas=2, rank=0, batch_size=2)
        >>> first = list(sampler)[:2]                           # the loop consumes one batch...
        >>> state = sampler.state_dict(consumed_batches=1)      # ...and saves
        >>> resumed = StatefulSampler(10, seed=1, num_replicas=2, rank=0, batch_size=2)
        >>> resumed.load_state_dict(state)
        >>> first + list(resumed) == list(StatefulSampler(10, seed=1, num_replicas=2, rank=0))
        True
    """

    def __init__(
        self,
        data_source: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool | None = None,
        *,
        tail: str | None = None,
        order: str = "fast",
        batch_size: int | None = None,
        yield_keys: bool = False,
        strategy: Strategy | None = None,
    ) -> None:
        self.dataset = data_source  # type: ignore[assignment]  # an int N or any Sized, wider than DistributedSampler's Dataset
        self.size = _dataset_size(data_source)
        shuffle = _resolve_shuffle(shuffle, strategy)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed, maximum=(1 << 63) - 1)
        self.tail = _resolve_tail(tail, drop_last)
        self.order = check_choice("order", order, Order)
        self.batch_size = check_optional_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH)
        self.yield_keys = check_bool("yield_keys", yield_keys)
        self._num_replicas = check_optional_int("num_replicas", num_replicas, minimum=1, maximum=MAX_RANKS)
        self._rank = check_optional_int("rank", rank, maximum=MAX_RANKS - 1)
        if self.tail is Tail.CARRY and self.batch_size is None:
            raise ValueError("tail='carry' needs batch_size: an epoch is whole global batches of batch_size * W")
        if self.order is Order.TORCH and self.shuffle and self.size > MAX_TORCH_SIZE:
            raise ValueError(
                f"order='torch' holds randperm(N) in memory: N must be at most {MAX_TORCH_SIZE}, got {self.size}; "
                f"use order='fast' (O(block) memory)"
            )
        self.strategy = _checked_strategy(strategy, self.size, self.shuffle, self.order, self.tail)
        self.strategy = self.strategy.for_sampler(self.batch_size, self.num_replicas)
        self._records = PassRecords(self.strategy, self.order, self.seed, self.size)
        self._cursor = _Cursor(epoch=0, position=0, carry_start=0)
        self._pass: _Pass | None = None
        self._latest: object | None = None  # the newest iterator's token: only its pass moves the state
        self._ended: EpochLayout | None = None  # the layout of the last epoch a pass of this object finished
        self._check_ranks(self.strategy.known_passes())

    # -- the ranks, resolved late: a sampler built before init_process_group still shards right

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self._num_replicas if self._num_replicas is not None else process_world_size()

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self._rank if self._rank is not None else process_rank()

    def _check_ranks(self, passes: range | None = None) -> None:
        """Checked at construction (over every pass whose length is known up front) and at each pass
        start: the process group may come later."""
        world_size, rank = self.num_replicas, self.rank
        if rank >= world_size:
            raise ValueError(f"rank must lie in [0, num_replicas) = [0, {world_size}), got {rank}")
        if self.tail is not Tail.DROP:
            return  # only drop needs the pass's length here (a packed pass's is a walk over its windows)
        for epoch in passes if passes is not None else (self._cursor.epoch,):
            length = self._records.pass_length(epoch)
            if 0 < length < world_size:
                raise ValueError(
                    f"tail='drop' with {length} records on num_replicas={world_size} ranks would drop every record "
                    f"(epoch {epoch}): use tail='pad' or 'uneven', or fewer ranks"
                )

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

    @property
    def generator(self) -> None:
        """No generator: the order is a pure function of (seed, epoch). Accelerate's
        ``prepare_data_loader`` sets one on a sampler it is about to shard again across processes."""
        return None

    @generator.setter
    def generator(self, value: Any) -> None:
        raise DoubleShardingError(
            f"accelerator.prepare shards the batches of a StatefulSampler that already shards over "
            f"num_replicas={self.num_replicas}: each rank would see half its share or less; prepare the loader with "
            f"stateful_sampler.accelerate.prepare_loader(accelerator, loader)"
        )

    def __len__(self) -> int:
        """This rank's indices in the current epoch, counted from its start (as Lightning expects);
        after an elastic resume, the consumed part counts as if these ranks had taken it.

        The current epoch is the one training is in: the pass under way; once the pass has ended, the
        next epoch (as a sampler restored from ``state_dict()`` says), unless a wrapping
        ``ResumableLoader`` is still handing out batches that workers drew before the end."""
        layout = self._current_layout()
        rank = self.rank
        return layout.local_before(rank) + layout.local_length(rank)

    def _current_layout(self) -> EpochLayout:
        """The rest of the current epoch from the position ``state_dict()`` saves, laid out as a
        restored sampler lays it out (so live and restored agree); the pass under way from its start
        where that position is unknown (workers drew ahead and no loader counts)."""
        cursor = self._rest_cursor()
        return self._pass.layout if cursor is None else self._layout(cursor)  # type: ignore[union-attr]

    def _rest_cursor(self) -> _Cursor | None:
        """The cursor a sampler restored from ``state_dict()`` now would have; None where it is unknown."""
        current = self._pass
        if current is None:
            return self._cursor
        consumed = None if current.snapshots else consumed_count(self)
        if consumed is not None:
            return current.cursor_after(consumed)
        if current.finished and current.loop_ended():
            return self._cursor
        if current.finished:  # inside torchdata's loop, after a partial last batch: nothing more of the epoch
            return current.cursor_after(current.drawn())
        if current.prefetches and not current.snapshots:
            return None
        return current.cursor_after(current.drawn())

    def remaining_length(self) -> int:
        """The indices this rank has left in the current epoch, from the position ``state_dict()``
        saves (a restored sampler's next pass yields exactly these). A training loop that resumed
        mid-epoch runs ``ceil(remaining_length() / batch_size)`` more batches in it."""
        return self._current_layout().local_length(self.rank)

    def remaining_length_later(self) -> Callable[[], int] | None:
        """``remaining_length()`` as of now, as a function to call when the number is needed, where the current
        pass's length is still being counted (``Strategy.counting_floor``: packed rows of a large epoch); None
        where it is known (ask ``remaining_length()``). A loader that counts a pass's batches at ``iter()`` only
        for ``len()`` thus serves the first batches before the count is done."""
        cursor = self._rest_cursor()
        if cursor is None or self._floor_layout(cursor) is None:
            return None
        return partial(_local_length, self, cursor, self.rank)

    def pass_length(self) -> int:
        """The indices this rank's pass yields: the one under way, counted from its start, or else
        the next one (for a framework that counts a pass's batches while it runs)."""
        current = self._pass if self._pass is not None and not self._pass.finished else None
        layout = current.layout if current is not None else self._layout(self._cursor)
        return layout.local_length(self.rank)

    # -- epochs

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start; the current epoch keeps its position (Lightning calls this again
        on resume, after the restored mid-epoch position is in place)."""
        epoch = check_int("epoch", epoch, maximum=MAX_EPOCH)
        refuse_resharding(self, sys._getframe(1))  # Accelerate's dispatcher calls this on every rank, first
        if epoch != self._cursor.epoch or (self._pass is not None and self._pass.finished):
            self._commit(_Cursor(epoch, 0, self._carry_start(epoch)))

    def _carry_start(self, epoch: int) -> int:
        """Where ``epoch`` starts under ``carry``: after the current epoch as it is laid out now (a
        resume with another global batch moved its end), then whole global batches from there."""
        if self.tail is not Tail.CARRY:
            return 0
        cursor = self._cursor
        if epoch == cursor.epoch:
            return cursor.carry_start
        current = self._layout(cursor)
        end = current.stream_start + current.length
        return carry_epoch_start(self._records.pass_length(0), self._global_batch(), epoch, cursor.epoch + 1, end)

    def _global_batch(self) -> int:
        return (self.batch_size or 1) * self.num_replicas

    def _layout(self, cursor: _Cursor) -> EpochLayout:
        return EpochLayout.build(
            self.tail,
            self._records.pass_length(cursor.epoch),
            self.num_replicas,
            cursor.epoch,
            self._global_batch(),
            cursor.carry_start,
            cursor.position,
            cursor.end,
        )

    def _floor_layout(self, cursor: _Cursor) -> EpochLayout | None:
        """Where the length of the pass starting at ``cursor`` is still being counted (``Strategy.counting_floor``),
        the layout of the positions it surely has; else None (and where even the first positions need the length:
        ``carry`` places an epoch by the lengths before it, and an end once fixed is kept).

        Below the floor every position is the pass's own, no padding: a pass's length decides only where the
        ranks' shares end and, past the records, what is padding. So a pass draws those while the count runs."""
        if self.tail is Tail.CARRY or cursor.end is not None:
            return None
        floor = self._records.counting_floor(cursor.epoch)
        if floor is None or floor <= cursor.position:
            return None
        return EpochLayout(
            self.tail, floor, self.num_replicas, cursor.epoch, cursor.epoch * floor, cursor.position, floor
        )

    def _commit(self, cursor: _Cursor) -> None:
        """Set where the next pass starts, and detach any pass under way from the state."""
        self._cursor = cursor
        self._pass = None

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        """A lazy pass: epoch and position are read at the first ``next()``, not here (Lightning
        iterates before it calls ``set_epoch`` on a resumed epoch, #21938). The previous pass is
        settled at once (see ``settle``), so a state taken between ``iter()`` and the first batch
        describes the new pass.

        ``chain`` hands out each block's items in C; the generator behind it only resumes once
        per block, which halves the per-index cost of a generator that yields every item."""
        self.settle()
        token = self._latest = object()
        return chain.from_iterable(self._pass_blocks(token))

    @property
    def pass_begun(self) -> bool:
        """Whether a pass began since the last ``set_epoch`` (to another epoch), ``load_state_dict`` or
        ``settle``: a pass under way, or drawn to its end and not yet settled."""
        return self._pass is not None

    def settle(self) -> None:
        """Detach the pass under way; a new pass continues from where ``state_dict()`` would have said
        this one got to (so a restored sampler and the live one agree): the drawn position, the epoch's
        end once drawn whole. A pass a multi-process ``DataLoader`` drew ahead of training restarts from
        the committed position instead, since what training consumed is unknown here."""
        current = self._pass
        if current is not None and not current.prefetches and not (current.finished and current.loop_ended()):
            self._commit(current.cursor_after(current.drawn()))
        self._pass = None

    def _pass_blocks(self, token: object) -> Iterator[Iterator[Any]]:
        """The blocks of one pass. An iterator replaced by a newer ``iter()`` before its first
        ``next()`` still yields its order (as two iterators of ``DistributedSampler`` both do), but
        detached: the state and the epoch follow the newest iterator only."""
        attached = self._latest is token
        refuse_resharding(self, sys._getframe(1))
        prefetches, snapshots, driver = _pass_driver(sys._getframe(1))
        if attached:
            pass_starting(self)
        self._check_ranks()
        origin = self._cursor
        rank = self.rank
        floor = self._floor_layout(origin)
        layout = None if floor is not None else self._layout(origin)
        current = _Pass(origin, layout, rank, 0, iter(()), prefetches=prefetches, snapshots=snapshots, driver=driver,
                        exact=partial(self._layout, origin))  # fmt: skip
        if attached:
            self._pass = current
        block = _FIRST_BLOCK
        while True:
            start = current.block_start + current.block_length
            if current.known_layout is None and floor is not None and start < floor.local_length(rank):
                layout, local_stop = floor, floor.local_length(rank)  # below the floor: the count runs on
            else:
                layout = current.layout
                local_stop = layout.local_length(rank)
            if start >= local_stop:
                break
            stop = min(start + block, local_stop)
            drawn, items, records = self._items(layout, rank, start, stop)
            current.block_start, current.block_length, current.block = start, stop - start, drawn
            current.drawn_blocks = (*current.drawn_blocks[-1:], (start, records))
            yield items
            block = min(2 * block, _MAX_BLOCK)
        layout = current.layout
        if self._pass is current:
            # A completed pass moves on, so a forgotten set_epoch never replays the same order.
            current.finished = True
            self._ended = layout
            end = layout.stream_start + layout.length if self.tail is Tail.CARRY else 0
            self._cursor = _Cursor(origin.epoch + 1, 0, end)

    def _items(
        self, layout: EpochLayout, rank: int, start: int, stop: int
    ) -> tuple[Iterator[int], Iterator[Any], np.ndarray]:
        """A block's records as an iterator whose ``length_hint`` counts what was drawn, the
        items to yield (those records, or keys made from them as they are drawn: made up front,
        a block of keys outlives the young GC generation and costs about 6x more per key), and the
        records' array (``drawn_records``)."""
        positions = layout.global_positions(rank, start, stop)
        offsets = layout.pass_offsets(positions)
        array = self._records(layout.epoch, offsets)
        records = iter(array.tolist())
        if not self.yield_keys:
            return records, records, array
        passes = (offsets // max(layout.size, 1) + layout.epoch).tolist()
        padding = (layout.is_padding(positions) | self._records.repeats(layout.epoch, offsets)).tolist()
        return records, map(SampleKey, records, repeat(self.seed), passes, positions.tolist(), padding), array

    @property
    def pass_layout(self) -> EpochLayout | None:
        """The layout of the pass under way, from where it began (``layout()`` lays out the rest of the
        epoch from the position a state would save); ``None`` when no pass is under way."""
        return self._pass.layout if self._pass is not None else None

    def drawn_records(self, layout: EpochLayout, local_position: int) -> tuple[int, np.ndarray] | None:
        """The block of records the pass of ``layout`` drew that holds this rank's ``local_position``:
        its first local position and its records (the pass keeps its last two blocks), so that a tool
        following training (the certificate) reads the order without computing it again; ``None`` when
        that pass is not the one under way or the block is not held."""
        current = self._pass
        if current is None or current.layout is not layout:
            return None
        for start, records in current.drawn_blocks:
            if start <= local_position < start + records.size:
                return start, records
        return None

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's order for an epoch (default: the rest of the current one, from the position
        ``state_dict()`` saves), without moving the cursor."""
        layout = self.layout(epoch)
        positions = layout.global_positions(self.rank, 0, layout.local_length(self.rank))
        return self._records(layout.epoch, layout.pass_offsets(positions))

    def dropped_indices(self, epoch: int | None = None) -> list[int]:
        """Records that ``tail='drop'`` leaves out of an epoch (default: the current one)."""
        return self.unused_indices(epoch) if self.tail is Tail.DROP else []

    def unused_indices(self, epoch: int | None = None) -> list[int]:
        """Records of an epoch's own permutation that the epoch does not take: cut for good under
        ``drop``, rolled over into the next epoch under ``carry``, none otherwise."""
        layout = self.layout(epoch)
        unused = layout.unused_offsets()
        return self._records(layout.epoch, np.arange(unused.start, unused.stop, dtype=np.int64)).tolist()

    def layout(self, epoch: int | None = None) -> EpochLayout:
        """An epoch's layout (default: the current one, as it is or was drawn, resumed segment
        included): its length, padding and carried positions, for tools such as the coverage audit
        that must answer from the sampler's own arithmetic."""
        current = self._current_layout()
        if epoch is None or epoch == current.epoch:
            return current
        if self._ended is not None and epoch == self._ended.epoch:
            return self._ended  # as this object drew it (a resumed segment included), not laid out afresh
        return self._layout(self._cursor_at(epoch))

    def _cursor_at(self, epoch: int) -> _Cursor:
        epoch = check_int("epoch", epoch, maximum=MAX_EPOCH)
        if epoch == self._cursor.epoch:
            return self._cursor
        return _Cursor(epoch, 0, self._carry_start(epoch))

    # -- state

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The state to save, as a JSON-serialisable dict of a few hundred bytes.

        With no argument: the position training consumed. A wrapping ``ResumableLoader`` says it;
        otherwise it is the position drawn up to, which is exact when nothing runs ahead of training
        (``num_workers=0``) and inside torchdata's ``StatefulDataLoader`` (which snapshots sampler
        state as each batch's indices are fetched). Drawn whole, an epoch saves ``position =
        epoch_end`` (resumes to nothing more of it, then the next epoch); once the pass has ended (the
        loop saw its end), the next epoch's start. Mid-pass under a multi-process ``DataLoader`` with no
        ``ResumableLoader`` around it, the consumed position is unknown: ``PrefetchedStateError``.

        With ``consumed_batches=k``: the position after the first k batches of the current pass,
        which is what a training loop has consumed whatever ``DataLoader`` workers prefetched.
        Count the batches of the loop over the loader (``enumerate(loader, 1)``); needs
        ``batch_size``, and k may not pass the pass's last batch.
        """
        if consumed_batches is None:
            return self._saved_state(self._consumed_cursor())
        if self.batch_size is None:
            raise ValueError("state_dict(consumed_batches=...) needs StatefulSampler(..., batch_size=B)")
        local_length = self._current_pass().layout.local_length(self.rank)
        batches = -(-local_length // self.batch_size)
        consumed = check_int("consumed_batches", consumed_batches)
        if consumed > batches:
            raise ValueError(
                f"consumed_batches must be at most {batches}, the batches of the current pass "
                f"({local_length} indices in batches of {self.batch_size}), got {consumed}: count the batches "
                f"of this pass over the loader, not a global step"
            )
        return self._saved_state(self._cursor_after_local(consumed * self.batch_size))

    def state_after(self, consumed: int) -> dict[str, Any]:
        """The state once training consumed ``consumed`` of this rank's positions of the pass under way (else
        of the next pass), capped at the pass's: what ``ResumableLoader`` saves, whatever workers prefetched.

        Example:
            >>> sampler = StatefulSampler(10, batch_size=4)
            >>> sampler.state_after(4) == sampler.state_dict(consumed_batches=1)
            True
        """
        consumed = check_int("consumed", consumed)
        local = min(consumed, self._current_pass().layout.local_length(self.rank))
        return self._saved_state(self._cursor_after_local(local))

    def extra_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The fields a subclass adds to each state it saves (a row sampler's ``packing`` anchor), given the
        sampler's own ``state`` at that position: the extension point of ``state_dict`` and ``state_after``,
        so that whatever saves the state (the sampler, ``ResumableLoader``) saves them. The subclass's
        ``load_state_dict`` takes them off again before it calls this one's. None here."""
        return {}

    def _saved_state(self, cursor: _Cursor) -> dict[str, Any]:
        """The state dict saved at ``cursor``: the one place a saved state is made, with ``extra_state``'s fields."""
        state = self._state(cursor).to_dict()
        extra = self.extra_state(state)
        for name in extra:
            if name in state:
                raise TypeError(
                    f"{type(self).__name__}.extra_state() returned {name!r}, a field of the sampler's own state: "
                    f"name the fields it adds otherwise"
                )
        state.update(extra)
        return state

    def _current_pass(self) -> _Pass:
        """The pass under way (or ended), else the one the cursor would start."""
        if self._pass is not None:
            return self._pass
        return _Pass(self._cursor, self._layout(self._cursor), self.rank, 0, iter(()))

    def _cursor_after_local(self, local_count: int) -> _Cursor:
        """The cursor once this rank has consumed ``local_count`` positions of the current pass."""
        return self._current_pass().cursor_after(local_count)

    def _consumed_cursor(self) -> _Cursor:
        cursor = self._rest_cursor()
        if cursor is None:
            drawn = self._pass.drawn()  # type: ignore[union-attr]
            raise PrefetchedStateError(
                f"sampler.state_dict() mid-pass under a DataLoader with workers: they drew {drawn} of this rank's "
                f"positions ahead of training, which consumed an unknown part of them. Wrap the loader in "
                f"ResumableLoader and save loader.state_dict() (or sampler.state_dict() then: the loader tells it), "
                f"pass sampler.state_dict(consumed_batches=k) with the batches the loop consumed, or use torchdata's "
                f"StatefulDataLoader"
            )
        return cursor

    def _state(self, cursor: _Cursor, with_strategy_state: bool = True) -> SamplerState:
        strategy_state = None
        if with_strategy_state:
            strategy_state = self.strategy.state_at(
                *self._pass_offset(cursor.epoch, cursor.position, cursor.carry_start)
            )
        return SamplerState(
            version=STATE_VERSION,
            size=self.size,
            seed=self.seed,
            shuffle=self.shuffle,
            tail=self.tail.value,
            order=self.order.value,
            strategy=self.strategy.name,
            strategy_fingerprint=self.strategy.fingerprint(),
            epoch=cursor.epoch,
            position=cursor.position,
            carry_start=cursor.carry_start,
            epoch_end=self._layout(cursor).length,
            world_size=self.num_replicas,
            batch_size=self.batch_size,
            strategy_state=strategy_state,
        )

    def _pass_offset(self, epoch: int, position: int, carry_start: int) -> tuple[int, int]:
        """The pass and the offset into it that a cursor reads next: ``carry`` reads on through passes of one
        length from its stream start; the other tails stay in the epoch's pass (padding reads nothing new)."""
        length = self._records.pass_length(epoch)
        if self.tail is Tail.CARRY:
            return divmod(carry_start + position, length) if length else (epoch, 0)
        return epoch, min(position, length)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state in O(1): the rest of the saved epoch is laid out on this
        sampler's ranks and batch size (docs/core.md, "Elastic resume"). Another dataset size,
        seed, shuffle, tail or order raises ``IncompatibleStateError`` and leaves this sampler as
        it was. The strategy decides first (``Strategy.resume_from``): one that takes the state as a
        continuation of its order (a ``Mixture(on_change="continue")`` given another mixture's state,
        sources appended) replaces this sampler's strategy, and the saved size and fingerprint may differ."""
        saved = SamplerState.from_dict(state)
        pass_index, offset = self._pass_offset(saved.epoch, saved.position, saved.carry_start)
        order = SavedOrder(
            saved.size, saved.strategy, saved.strategy_fingerprint, saved.strategy_state, pass_index, offset
        )
        strategy = self.strategy.resume_from(order) if saved.strategy == self.strategy.name else None
        if strategy is None and saved.strategy_state is not None and self.strategy.state_at(0, 0) is None:
            raise IncompatibleStateError(
                "strategy_state", saved.strategy_state, None, f"{self.strategy!r} saves no state of its own"
            )
        records = self._records if strategy is None else PassRecords(strategy, self.order, self.seed, self.size)
        pass_length = records.pass_length(saved.epoch)
        saved_length = pass_length if strategy is None else strategy.saved_pass_length(self.size, saved.epoch)
        current = self._state(self._cursor, with_strategy_state=False)
        saved.check_continues(current, saved_length, self.strategy.mismatch_hint(), strategy is not None)
        if strategy is not None:
            self.strategy, self._records = strategy, records
        position = saved.position
        if saved.finished and saved.world_size == self.num_replicas:
            position = end = saved.epoch_end  # the live ranks' own end: every rank reports the same len()
        elif saved.finished:
            position = end = _finished_end(self.tail, position, pass_length, self.num_replicas)
        elif (saved.world_size, saved.batch_size, saved_length) == (self.num_replicas, self.batch_size, pass_length):
            end = saved.epoch_end  # the saving run's own layout: exact even from a mid-batch position
        else:
            end = None  # the rest of the epoch is laid out on these ranks, this batch size and this pass length
        self._commit(_Cursor(saved.epoch, position, saved.carry_start, end))
        self._ended = None


def _local_length(sampler: StatefulSampler, cursor: _Cursor, rank: int) -> int:
    """What ``remaining_length()`` said at ``cursor`` (``remaining_length_later``): the layout is a function of it."""
    return sampler._layout(cursor).local_length(rank)


def _finished_end(tail: Tail, position: int, pass_length: int, world_size: int) -> int:
    """A finished epoch's end laid out on another world size. ``pad`` rounds the records up to a
    multiple of the ranks, as its padding does, so every rank reports the same ``len()``; the other
    tails keep the positions taken (no more than N: past it only padding was left)."""
    if tail is Tail.CARRY:
        return position
    records = min(position, pass_length)
    return -(-records // world_size) * world_size if tail is Tail.PAD else records


def _pass_driver(frame: Any) -> tuple[bool, bool, Any]:
    """(prefetches, snapshots, driver) for the pass the caller's frame starts: whether a
    multi-process DataLoader iterator draws it (ahead of training), whether that iterator is
    torchdata's ``StatefulDataLoader``, which saves the sampler's state as it fetches, and a weak
    reference to it. Read once per pass."""
    snapshots = False
    for _ in range(_DRIVER_DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if owner is not None:
            snapshots = snapshots or type(owner).__module__.startswith("torchdata.")
            # private: the DataLoader iterator's types and worker count (torch has no public accessor)
            if isinstance(owner, _BaseDataLoaderIter):
                workers = isinstance(owner, _MultiProcessingDataLoaderIter) or getattr(owner, "_num_workers", 0) > 0
                return workers, snapshots, weakref.ref(owner)
        frame = frame.f_back
    return False, snapshots, None


def _resolve_tail(tail: Any, drop_last: Any) -> Tail:
    """``tail``, or ``DistributedSampler``'s ``drop_last`` (``True`` is ``tail="drop"``); a contradiction is refused."""
    if drop_last is None:
        return check_choice("tail", "pad" if tail is None else tail, Tail)
    drop_last = check_bool("drop_last", drop_last)
    implied = Tail.DROP if drop_last else Tail.PAD
    if tail is None:
        return implied
    chosen = check_choice("tail", tail, Tail)
    if (chosen is Tail.DROP) != drop_last:
        raise ValueError(
            f"drop_last={drop_last} contradicts tail={chosen.value!r}: drop_last=True is tail='drop', "
            f"drop_last=False any other tail; pass tail alone"
        )
    return chosen


def _resolve_shuffle(shuffle: Any, strategy: Any) -> Any:
    """``shuffle``, defaulting to the ``Uniform`` strategy's own (``True`` otherwise); a contradiction is refused."""
    if not isinstance(strategy, Uniform):
        return True if shuffle is None else shuffle
    if shuffle is None:
        return strategy.shuffle
    if shuffle != strategy.shuffle:
        raise ValueError(
            f"shuffle={shuffle!r} contradicts strategy={strategy!r}: pass one of them (the strategy's shuffle is its own)"
        )
    return shuffle


def _dataset_size(data_source: Any) -> int:
    """N from a dataset's length or an int; a str's length is no dataset size, so it is refused."""
    if isinstance(data_source, (bool, str, bytes)):
        raise TypeError(
            f"data_source must be a sized dataset or an int, got {type(data_source).__name__} {data_source!r}"
        )
    if isinstance(data_source, (torch.Tensor, np.ndarray)) and data_source.ndim == 0:
        value = np.asarray(data_source)
        if value.dtype.kind not in "iu":
            raise TypeError(f"data_source as a 0-d tensor must hold an integer, got {data_source!r}")
        size: int | np.integer[Any] = int(value)
    elif isinstance(data_source, (int, np.integer)):
        size = data_source
    elif hasattr(data_source, "__len__"):
        size = len(data_source)
    else:
        raise TypeError(f"data_source must be a sized dataset or an int, got {type(data_source).__name__}")
    return check_int("data_source (its length N)", size, maximum=MAX_SIZE - 1)


def _checked_strategy(strategy: Any, size: int, shuffle: bool, order: Order, tail: Tail) -> Strategy:
    """The sampler's strategy, checked against N and the options that only some strategies take."""
    if strategy is None:
        return Uniform(shuffle)
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"strategy must be a Strategy such as Uniform() or Weighted(...), got {type(strategy).__name__}"
        )
    if isinstance(strategy, Uniform):
        return Uniform(shuffle)
    if not shuffle:
        raise ValueError(f"shuffle=False applies to the Uniform strategy only, not to {strategy!r}")
    if order is not Order.FAST:
        raise ValueError(f"order={order.value!r} applies to the Uniform strategy only, not to {strategy!r}")
    if tail is Tail.CARRY and strategy.passes_vary:
        raise ValueError(f"tail='carry' needs passes of one length, but {strategy!r} varies them by epoch")
    strategy.check(size)
    return strategy
