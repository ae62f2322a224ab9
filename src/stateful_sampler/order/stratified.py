"""``Stratified``: every stretch of a pass holds the classes in proportion, or every class equally.

``proportional``: a permutation of all N records per pass. At every prefix length p of the pass, class c's
count is within 1 of p * n_c / N (each batch is a small copy of the whole). Which class sits at each position
is the same every pass and is fixed at construction (``proportional_slots``: vectorised, with earliest deadline
first over the few stretches that need it; about 2 s at N = 10^7 with skewed classes, one int per position
held); each pass then shuffles each class's records by its own Feistel permutation, so a position costs O(1)
and a resume is O(1).

``balanced``: every aligned window of C positions (kC ... kC + C - 1) holds each class once, in an order
shuffled per window. Class c's draws continue across passes: its draw number in pass e, window k is
e * (num_samples / C) + k, and draw d is rank d mod n_c of class c's permutation d // n_c, each permutation
reshuffled. Small classes therefore repeat within a pass; nothing is set up per pass.
"""

from __future__ import annotations

import heapq
from enum import Enum
from typing import Any

import numpy as np

from stateful_sampler.checks import check_choice, check_optional_int
from stateful_sampler.order.classes import ClassTable
from stateful_sampler.order.mixing import MASK64, Domain, derive_seed, mix64_array
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.strategy import PassOrder, Strategy, check_length, id_array

_TAG = 0x53545254  # "STRT": this module's seeds
_WINDOW_TAG = 0x57494E44  # "WIND": the class order inside each balanced window


MAX_PROPORTIONAL = 1 << 31  # N * N / n_c stays within int64 in the window arithmetic


class Mode(str, Enum):
    PROPORTIONAL = "proportional"  # every prefix a small copy of the class distribution
    BALANCED = "balanced"  # every window of C positions one record of each class


class Stratified(Strategy):
    """Orders records by their class ``labels`` (non-negative integer ids, one per record).

    ``mode="proportional"``: each pass is a permutation of all N records with every prefix within one record
    per class of the class distribution. ``mode="balanced"``: each aligned window of C positions holds one
    record of each of the C classes; ``num_samples`` positions per pass, by default C times the largest class,
    and otherwise rounded up to a multiple of C.
    """

    name = "stratified"

    def __init__(self, labels: Any, *, mode: str = "proportional", num_samples: int | None = None) -> None:
        self.labels = id_array("labels", labels)
        self.mode = check_choice("mode", mode, Mode)
        num_samples = check_optional_int("num_samples", num_samples, minimum=1, maximum=MAX_SIZE - 1)
        if num_samples is not None and self.mode is Mode.PROPORTIONAL:
            raise ValueError(
                f"num_samples applies to mode='balanced' only: a proportional pass is a permutation of all "
                f"{len(self.labels)} records, got num_samples={num_samples}"
            )
        if self.mode is Mode.PROPORTIONAL and len(self.labels) > MAX_PROPORTIONAL:
            raise ValueError(
                f"labels: mode='proportional' orders at most 2**31 records (its window arithmetic is int64), "
                f"got {len(self.labels)}; use mode='balanced'"
            )
        self._table = ClassTable(self.labels)
        classes = len(self._table)
        if self.mode is Mode.BALANCED:
            wanted = classes * int(self._table.sizes.max(initial=0)) if num_samples is None else num_samples
            self.num_samples: int | None = -(-wanted // max(classes, 1)) * classes
            if self.num_samples >= MAX_SIZE:  # rounded up to whole windows of the classes, past a pass's bound
                raise ValueError(
                    f"num_samples rounded up to a multiple of the {classes} classes is {self.num_samples}, at or "
                    f"past 2**62 positions a pass: give fewer"
                )
            self._slots: np.ndarray | None = None
        else:
            self.num_samples = None
            self._slots = proportional_slots(self._table.sizes)

    def __repr__(self) -> str:
        return f"Stratified({len(self.labels)} labels, {len(self._table)} classes, mode={self.mode.value!r})"

    def check(self, size: int) -> None:
        check_length("labels", self.labels, size)

    def pass_length(self, size: int, pass_index: int) -> int:
        return size if self.num_samples is None else self.num_samples

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        key = derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index if self._slots is not None else 0)
        if self._slots is not None:
            return lambda positions: self._proportional(positions, key, pass_index)
        window_key = derive_seed(Domain.PERMUTATION, seed, _WINDOW_TAG, pass_index)
        # Class c's draws before this pass, as (permutation, rank): Python ints, since pass * windows may pass
        # int64; a permutation number is only a word mixed into the key, so it is kept modulo 2**64.
        before = pass_index * (self.num_samples // max(len(self._table), 1))  # type: ignore[operator]
        sizes = self._table.sizes.tolist()
        permutations = np.array([before // n & MASK64 for n in sizes], dtype=np.uint64)
        ranks = np.array([before % n for n in sizes], dtype=np.int64)
        return lambda positions: self._balanced(positions, key, window_key, permutations, ranks)

    def _proportional(self, positions: np.ndarray, key: int, pass_index: int) -> np.ndarray:
        table = self._table
        slots = self._slots[positions].astype(np.int64)  # type: ignore[index]
        classes = np.searchsorted(table.starts, slots, side="right") - 1
        ranks = slots - table.starts[classes]
        return table.draws(classes, np.full_like(classes, pass_index), ranks, key)

    def _balanced(self, positions: np.ndarray, key: int, window_key: int, permutations: np.ndarray,
                  ranks: np.ndarray) -> np.ndarray:  # fmt: skip
        table = self._table
        classes_per_window = len(table)
        windows, slots = np.divmod(positions, classes_per_window)
        classes = window_classes(windows, slots, classes_per_window, window_key)
        sizes = table.sizes[classes]
        laps, rank = np.divmod(ranks[classes] + windows, sizes)  # window k is class c's draw k of this pass
        return table.draws(classes, permutations[classes] + laps.astype(np.uint64), rank, key)

    def _identity(self) -> tuple[Any, ...]:
        return (self.labels, self.mode.value, self.num_samples)


def window_classes(windows: np.ndarray, slots: np.ndarray, classes: int, key: int) -> np.ndarray:
    """The class at slot ``slots`` of window ``windows``: each window orders the C classes by a hash of
    (window, class), a uniform shuffle per window that any position computes from its own window in O(C)."""
    unique_windows, inverse = np.unique(windows, return_inverse=True)
    words = (unique_windows.astype(np.uint64)[:, None] * np.uint64(classes)) + np.arange(classes, dtype=np.uint64)
    order = np.argsort(mix64_array(words, key, np.empty_like(words)), axis=1)
    return order[inverse.ravel(), slots]


def proportional_slots(sizes: np.ndarray) -> np.ndarray:
    """For each position of a proportional pass, ``starts[c] + k``: draw k of class c sits there.

    Draw k of class c may sit at positions floor(k N / n_c) ... ceil((k + 1) N / n_c) - 1, which keeps
    floor(p n_c / N) <= count_c(p) <= ceil(p n_c / N) at every prefix p. The midpoint order (draws sorted by
    (k + 1/2) / n_c, vectorised) keeps these windows for most class sizes, and otherwise leaves them at few,
    scattered positions (next to a large class, by a position or two). Earliest deadline first among released
    draws, which keeps the windows whenever they can be kept (and they always can: Tijdeman's chairman
    assignment theorem), then reorders a short stretch around each such position, widened until it succeeds;
    over all N positions, a loop in Python, only as the last resort.
    """
    total = int(sizes.sum())
    dtype = np.int32 if total < 2**31 else np.int64
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    classes = np.repeat(np.arange(len(sizes)), sizes)
    draws = np.arange(total, dtype=np.int64) - starts[classes]
    slots = np.lexsort((classes, (2 * draws + 1) / (2.0 * sizes[classes]))).astype(dtype)  # (class, draw) by position
    del classes, draws
    outside = _outside_positions(slots, sizes, starts)
    margin = 2
    while outside.size and margin <= _WIDEST_STRETCH:
        outside = _reorder_stretches(slots, sizes, starts, outside, margin)
        margin *= 4
    if not outside.size:
        return slots
    runs = {c: [first, size] for c, (first, size) in enumerate(zip(starts.tolist(), sizes.tolist()))}
    if not _earliest_deadline_first(total, sizes.tolist(), starts.tolist(), runs, 0, slots):
        # Cannot happen: the windows can always be kept, and then EDF keeps them.
        raise RuntimeError(f"no proportional order kept every class within 1 of its share for class sizes {sizes}")
    return slots


_WIDEST_STRETCH = 1 << 12  # positions either side of a draw outside its window, before the whole pass is redone


def _windows(slots: np.ndarray, sizes: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class, release and deadline of each draw in ``slots``."""
    total = int(sizes.sum())
    slots = slots.astype(np.int64)
    classes = np.searchsorted(starts, slots, side="right") - 1
    draws, n = slots - starts[classes], sizes[classes]
    return classes, draws * total // n, -(-(draws + 1) * total // n) - 1


def _outside_positions(slots: np.ndarray, sizes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The positions whose draw sits outside its window, checked a chunk at a time (O(chunk) temporaries)."""
    chunk, found = 1 << 16, []
    for start in range(0, len(slots), chunk):
        _, release, deadline = _windows(slots[start : start + chunk], sizes, starts)
        positions = np.arange(start, start + len(release), dtype=np.int64)
        found.append(positions[(positions < release) | (positions > deadline)])
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def _reorder_stretches(slots: np.ndarray, sizes: np.ndarray, starts: np.ndarray, outside: np.ndarray,
                       margin: int) -> np.ndarray:  # fmt: skip
    """Reorder, by earliest deadline first, the stretch of ``margin`` positions either side of each position in
    ``outside`` (overlapping stretches merged), in place; the positions of ``outside`` whose stretch failed."""
    low = np.maximum(outside - margin, 0)
    high = np.minimum(outside + margin + 1, len(slots))
    first = np.flatnonzero(np.concatenate(([True], low[1:] > high[:-1])))
    begins, ends = low[first], np.maximum.reduceat(high, first)
    lengths = ends - begins
    positions = np.repeat(begins - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    stretch_slots = slots[positions]
    stretch_classes = _windows(stretch_slots, sizes, starts)[0].tolist()
    stretch_slots, total = stretch_slots.tolist(), int(sizes.sum())
    size_of, start_of = sizes.tolist(), starts.tolist()
    failed, offset = [], 0
    for begin, end in zip(begins.tolist(), ends.tolist()):
        runs: dict[int, list[int]] = {}  # class -> [first slot, count] in the stretch
        for c, slot in zip(
            stretch_classes[offset : offset + end - begin], stretch_slots[offset : offset + end - begin]
        ):
            run = runs.setdefault(c, [slot, 0])
            run[1] += 1
        offset += end - begin
        order = np.empty(end - begin, dtype=slots.dtype)
        if _earliest_deadline_first(total, size_of, start_of, runs, begin, order):
            slots[begin:end] = order
        else:
            failed.append(outside[(outside >= begin) & (outside < end)])
    return np.concatenate(failed) if failed else np.empty(0, dtype=np.int64)


def _earliest_deadline_first(total: int, sizes: list[int], starts: list[int], runs: dict[int, list[int]], begin: int,
                             out: np.ndarray) -> bool:  # fmt: skip
    """Fill ``out`` (positions begin, begin + 1, ...) by earliest deadline first among released draws, class c
    taking its ``runs[c] = [first slot, count]`` draws in order. False if a position finds no released draw or a
    draw misses its deadline (only a stretch can fail: over a whole pass, the windows can always be kept)."""
    ready: list[tuple[int, int]] = []  # (deadline, class) of each class's next draw, released
    waiting: list[tuple[int, int]] = []  # (release, class)
    push, pop = heapq.heappush, heapq.heappop
    next_slot = {c: run[0] for c, run in runs.items()}
    stop = {c: run[0] + run[1] for c, run in runs.items()}

    def queue(c: int, position: int) -> None:
        draw = next_slot[c] - starts[c]
        release = draw * total // sizes[c]
        if release <= position:
            push(ready, (-(-(draw + 1) * total // sizes[c]) - 1, c))
        else:
            push(waiting, (release, c))

    for c in runs:
        queue(c, begin)
    for position in range(begin, begin + len(out)):
        while waiting and waiting[0][0] <= position:
            _, c = pop(waiting)
            push(ready, (-(-(next_slot[c] - starts[c] + 1) * total // sizes[c]) - 1, c))
        if not ready or ready[0][0] < position:
            return False
        _, c = pop(ready)
        out[position - begin] = next_slot[c]
        next_slot[c] += 1
        if next_slot[c] < stop[c]:
            queue(c, position)
    return True
