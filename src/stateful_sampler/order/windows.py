"""Windows of a pass's shuffle, and where each window's rows (or tokens) start.

Packing reads a pass's uniform shuffle in windows of ``window`` consecutive positions: window k holds
the records at positions [k*window, (k+1)*window), found in O(window) by the Feistel bijection. A
window yields a varying number of units (rows when records are packed whole, tokens when they are
concatenated), so where window k's units start is a prefix sum over the windows before it.

``WindowStarts`` keeps the starts it knows (window 0 starts at 0; a resume brings the start of the
window it resumes in, from the state) and walks forward from the nearest known one, remembering every
start it passes. Reading a pass in order, or resuming in it, costs O(window) per window. The pass's
total, or a unit more than a few windows past every known start, takes every window's units at once
from ``measure_all`` when the order has one (whole-record packing counts a pass's rows in NumPy,
``packing.bin_counts``): O(N) once per pass, but at a small fraction of a walk's cost. That count can run in a
thread (``count_in_background``) while the first windows are walked and read: the walk needs no total, and
whoever asks for the total first takes the thread's result (or counts itself, in a forked child).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import FeistelPermutation

_TAG = 0x5041434B  # "PACK": this module's seeds
_SHUFFLE_BLOCK = 1 << 14  # positions shuffled at once: the Feistel rounds' arrays stay in the L2 cache
_WALK = 4  # windows walked one by one before a question far ahead takes every window's units at once
T = TypeVar("T")


class PassWindows:
    """The records of one pass's windows: the pass's order cut into runs of ``window`` positions.

    The order is this module's uniform shuffle of ``size`` records, or ``draws`` (a strategy's pass order,
    positions -> records, ``size`` of its positions): a record a strategy draws twice sits in two places."""

    def __init__(
        self,
        size: int,
        window: int,
        seed: int,
        pass_index: int,
        draws: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.size = size
        self.window = window
        self.count = -(-size // window)
        self.pass_seed = derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index)
        self._shuffle = FeistelPermutation(size, self.pass_seed, 0) if draws is None else draws

    def records(self, index: int) -> np.ndarray:
        """Window ``index``'s records, in shuffled order."""
        start = index * self.window
        return self._shuffle(np.arange(start, min(start + self.window, self.size), dtype=np.int64))

    def lengths_between(self, lengths: np.ndarray, first: int, last: int) -> np.ndarray:
        """``lengths`` of the records of windows [first, last), one window after the other, in shuffled order;
        shuffled a block of positions at a time, so the cipher's scratch stays in the cache and no array of
        the records is held (the lengths keep the user's dtype: int32 lengths stay 4 bytes a record)."""
        start, stop = first * self.window, min(last * self.window, self.size)
        out = np.empty(stop - start, dtype=lengths.dtype)
        for at in range(start, stop, _SHUFFLE_BLOCK):
            end = min(at + _SHUFFLE_BLOCK, stop)
            records = self._shuffle(np.arange(at, end, dtype=np.int64))
            np.take(lengths, records, out=out[at - start : end - start], mode="clip")  # in range: "raise" buffers
        return out

    def rng(self, index: int) -> np.random.Generator:
        """Randomness of window ``index`` only (the order of its bins), pure in (seed, pass, window)."""
        return np.random.default_rng(derive_seed(Domain.PERMUTATION, self.pass_seed, _TAG, index))


class WindowCache(Generic[T]):
    """The last few windows built, so that rows of one window asked for block by block build it once."""

    def __init__(self, build: Callable[[int], T], kept: int = 4) -> None:
        self._build = build
        self._kept = kept
        self._built: OrderedDict[int, T] = OrderedDict()

    def __call__(self, index: int) -> T:
        value = self._built.get(index)
        if value is None:
            value = self._built[index] = self._build(index)
            if len(self._built) > self._kept:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(index)
        return value


class WindowStarts:
    """Where each window's units start, learnt by walking forward from known starts."""

    def __init__(
        self, count: int, measure: Callable[[int], int], measure_all: Callable[[], np.ndarray] | None = None
    ) -> None:
        self.count = count
        self._measure = measure
        self._measure_all = measure_all
        self._windows = [0]  # ascending window indices with a known start...
        self._starts = [0]  # ...and their starts (ascending too)
        self._total: int | None = None
        self._every: np.ndarray | None = None  # every window's start, then the total, once measure_all ran
        self._counting: _Counting | None = None  # measure_all under way in a thread (``count_in_background``)

    def __getstate__(self) -> dict[str, object]:
        """Pickled (a sampler sent to spawned processes) or copied without a count under way: the copy counts
        again where it needs the total."""
        state = dict(self.__dict__)
        state["_counting"] = None
        return state

    def count_in_background(self) -> bool:
        """Start ``measure_all`` in a daemon thread unless the total is known, or counted or being counted
        already; returns whether a count is under way now. Nothing here waits for it: ``total`` and a
        ``locate`` far ahead take its result when it is done. One count runs in the background at a time in a
        process (each holds about 100 MB of temporaries): while one runs, another pass is counted where asked."""
        if self._total is not None or self._measure_all is None:
            return False
        if self._counting is None or not self._counting.ours():
            self._counting = _Counting.start(self._measure_all)
        return self._counting is not None

    def remember(self, index: int, start: int) -> None:
        """A start known from elsewhere (a saved state); ``index`` may be ``count`` (the total)."""
        if index == self.count:
            self._total = start
            return
        at = bisect_right(self._windows, index)
        if at and self._windows[at - 1] == index:
            return
        self._windows.insert(at, index)
        self._starts.insert(at, start)

    def total(self) -> int:
        """Units in the whole pass: every window's units at once, or a walk over the windows after the last
        known start."""
        if self._total is None and self._measure_all is not None:
            self._measure_every_window()
        if self._total is None:
            index, start = self._windows[-1], self._starts[-1]
            while index < self.count:
                start += self._measure(index)
                index += 1
                if index < self.count:
                    self.remember(index, start)
            self._total = start
        return self._total

    def known_total(self) -> int | None:
        return self._total

    def locate(self, unit: int) -> tuple[int, int]:
        """The window holding ``unit`` and that window's start."""
        if self._every is not None:
            index = int(np.searchsorted(self._every, unit, side="right")) - 1
            if index >= self.count:
                raise IndexError(f"unit {unit} lies beyond the pass's {self._total} units")
            return index, int(self._every[index])
        at = bisect_right(self._starts, unit) - 1
        index, start = self._windows[at], self._starts[at]
        walked = 0
        while True:
            if index >= self.count:
                raise IndexError(f"unit {unit} lies beyond the pass's {start} units")
            if walked == _WALK and self._measure_all is not None:
                self._measure_every_window()
                return self.locate(unit)
            walked += 1
            following = start + self._measure(index)
            if unit < following:
                return index, start
            index, start = index + 1, following
            if index < self.count:
                self.remember(index, start)
            else:
                self._total = start

    def _measure_every_window(self) -> None:
        counting, self._counting = self._counting, None
        units = counting.result() if counting is not None else None
        if units is None:  # no count in the background (or it failed, or this is a forked child): count here
            units = np.asarray(self._measure_all(), dtype=np.int64)  # type: ignore[misc]
        every = np.concatenate(([0], np.cumsum(units)))
        self._every, self._total = every, int(every[-1])


class _Counting:
    """``measure_all`` in a daemon thread of the process that started it. The thread only computes: what it
    found is published by the caller of ``result`` (so the walk's bookkeeping stays in one thread)."""

    _running = threading.BoundedSemaphore(1)  # one count in the background per process

    def __init__(self, measure_all: Callable[[], np.ndarray]) -> None:
        self._pid = os.getpid()
        self._units: np.ndarray | None = None
        self._thread = threading.Thread(
            target=self._run, args=(measure_all,), name="stateful-sampler-count", daemon=True
        )

    @classmethod
    def start(cls, measure_all: Callable[[], np.ndarray]) -> _Counting | None:
        """A count started in the background, or None while another one runs in this process (or where no thread
        can be started: the pass is then counted where it is asked, as without a thread)."""
        if not cls._running.acquire(blocking=False):
            return None
        counting = cls(measure_all)
        try:
            counting._thread.start()
        except RuntimeError:  # "can't start new thread"
            cls._running.release()
            return None
        return counting

    def _run(self, measure_all: Callable[[], np.ndarray]) -> None:
        try:
            self._units = np.asarray(measure_all(), dtype=np.int64)
        except Exception:  # noqa: BLE001 - counted again by ``result``'s caller, which raises it there
            self._units = None
        finally:
            self._running.release()

    def ours(self) -> bool:
        """Whether the thread belongs to this process (a forked child has the object, not the thread)."""
        return self._pid == os.getpid()

    def result(self) -> np.ndarray | None:
        """Every window's units, once the thread is done; None where it failed or is not this process's."""
        if not self.ours():
            return None
        self._thread.join()
        return self._units


def _reset_in_child() -> None:  # a child forked while a count ran has no thread to release it
    _Counting._running = threading.BoundedSemaphore(1)


os.register_at_fork(after_in_child=_reset_in_child)
