"""A pass's windows as this rank's and worker's parts, and a resume's first batch read over the windows it spans.

A pass reads one window at a time (``WindowPart``: its local indices, its worker's slots built when first asked). A
resume's first batch may span two windows: ``take_first_batch`` takes those windows' first slots, and ``FirstBatch``
locates and reads them at once, so a shard both windows draw from is read once, and the rest of each window is
located only after the batch is out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stateful_sampler.order.shards import EpochWindows
from stateful_sampler.stream.gather import WindowGather
from stateful_sampler.stream.layout import StreamLayout


@dataclass(eq=False)
class WindowPart:
    """A window's local indices [begin, end) of a rank, and their slots of one worker (``slots_in``): all of them
    (``slots``) when the window's chunks are read, or only the first few (``head``) for a resume's first batch, which
    then waits for its own slots only (a window of 10^7 records holds about a million). ``alone``: how many of them
    are that batch's, whose records ``first`` reads with the other windows' shares of it."""

    window: int
    begin: int
    end: int
    slots_in: Callable[[int, int], np.ndarray]
    alone: int = 0
    first: FirstBatch | None = None
    _slots: np.ndarray | None = None

    @property
    def slots(self) -> np.ndarray:
        if self._slots is None:
            self._slots = self.slots_in(self.begin, self.end)
        return self._slots

    def head(self, count: int, reach: int) -> np.ndarray:
        """The first ``count`` slots (all, when there are fewer), from the first ``reach`` local indices, which hold
        ``count`` of the worker's where the window has them (the whole window's slots kept when they are all)."""
        if self.begin + reach < self.end:
            return self.slots_in(self.begin, self.begin + reach)[:count]
        return self.slots[:count]


class FirstBatch:
    """A resume's first batch over the windows it spans (each window's ``head`` of slots), located and read at once
    when the first of them asks for its share: a shard that two windows draw from is read once, and only the
    batch's own positions are located (a window's others at its first chunk after the batch)."""

    def __init__(
        self,
        gather: WindowGather,
        windows: EpochWindows,
        layout: StreamLayout,
        heads: list[tuple[WindowPart, np.ndarray]],
    ) -> None:
        self._gather, self._windows, self._layout, self._heads = gather, windows, layout, heads
        self._shares: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]] = {}

    def of(self, part: WindowPart) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
        """(slot, shard, row, record) of each of ``part``'s ``alone`` slots of the batch."""
        if not self._shares:
            shards, rows = self._windows.locate(self._layout.positions(np.concatenate([h for _, h in self._heads])))
            records = self._gather.records_at_rows(shards, rows)
            begin = 0
            for held, head in self._heads:
                end = begin + len(head)
                self._shares[held.window] = (head, shards[begin:end], rows[begin:end], records[begin:end])
                begin = end
        return self._shares[part.window]


def window_parts(
    windows: EpochWindows, layout: StreamLayout, rank: int, batch_size: int, worker: int, workers: int
) -> Iterator[WindowPart]:
    """Each window's part of ``rank`` and ``worker`` from the pass's first window on, then the padding's past the
    end: a reader holds one window at a time."""
    starts = windows.window_starts.tolist()
    first = int(windows.window_of(np.array([min(layout.origin, layout.size - 1)]))[0])
    spans = [(starts[w], starts[w + 1]) for w in range(first, windows.windows)] + [(layout.size, 2**62)]

    def slots_in(begin: int, end: int) -> np.ndarray:
        return layout.slots(rank, layout.worker_locals(worker, workers, batch_size, begin, end))

    for window, (begin, end) in enumerate(spans, first):
        yield WindowPart(window, *layout.local_range(rank, begin, end), slots_in)


def take_first_batch(
    gather: WindowGather,
    windows: EpochWindows,
    layout: StreamLayout,
    parts: Iterator[WindowPart],
    batch_size: int,
    workers: int,
) -> list[WindowPart]:
    """The windows of ``parts`` that the pass's first batch spans, taken from it, each with its share of the
    batch (``alone``), which ``FirstBatch`` reads for all of them at once."""
    # Local indices that hold a batch of each worker from any start: two rounds of the workers' batches.
    reach = 2 * batch_size * workers
    heads: list[tuple[WindowPart, np.ndarray]] = []
    wanted = batch_size
    while wanted:
        part = next(parts, None)
        if part is None:  # a pass shorter than a batch
            break
        head = part.head(wanted, reach)
        part.alone, wanted = len(head), wanted - len(head)
        heads.append((part, head))
    batch = FirstBatch(gather, windows, layout, heads)
    for part, _ in heads:
        part.first = batch
    return [part for part, _ in heads]
