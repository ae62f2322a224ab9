"""A deterministic interleave of D sources at rational weights whose every prefix is within 1 of its target.

With integer weights n_d summing to Q, source d's k-th draw (k = 0, 1, ...) may sit at position i
only inside its quota window: release floor(k*Q/n_d) <= i <= deadline ceil((k+1)*Q/n_d) - 1. A
sequence that keeps every draw inside its window has floor(p*n_d/Q) <= count_d(p) <= ceil(p*n_d/Q) at
every prefix p (Balinski and Young's quota property): within 1 of p*w_d. Such a sequence exists
(Tijdeman's chairman assignment); earliest-deadline-first finds it. A rounding of a per-prefix
apportionment (largest remainder) is not one: it can take a draw back when p grows (Alabama paradox).

After Q positions every count is exactly n_d, so the sequence is periodic: one period is built once,
O(Q) memory (at most ``MAX_PERIOD`` positions), and position p is period p // Q, offset p % Q, in O(1).
"""

from __future__ import annotations

import heapq
import weakref
from fractions import Fraction

import numpy as np

MAX_PERIOD = 1 << 20  # one period's table: at most 6 MiB (source as uint16, draw within the period as uint32)
RESOLUTION = 10**6  # non-integer weights are rounded to millionths: 0.5/0.3/0.2 stays exact
_CHUNK = 1 << 16


def rational_weights(name: str, weights: np.ndarray) -> np.ndarray:
    """Integer weights n_d with the ratios used, reduced by their gcd: the given ones if they are
    integers summing to at most ``MAX_PERIOD``, else the normalised weights rounded to millionths
    (largest remainder, so they sum to exactly 10**6 before the reduction)."""
    total = float(weights.sum())
    if np.all(weights == np.round(weights)) and total <= MAX_PERIOD:
        counts = weights.astype(np.int64)
    else:
        scaled = [Fraction(float(w)) / Fraction(total) * RESOLUTION for w in weights.tolist()]
        counts = np.array([int(s) for s in scaled], dtype=np.int64)
        remainders = np.array([float(s - int(s)) for s in scaled])
        short = RESOLUTION - int(counts.sum())
        counts[np.argsort(-remainders, kind="stable")[:short]] += 1
        lost = np.flatnonzero((counts == 0) & (weights > 0))
        if lost.size:
            d = int(lost[0])
            raise ValueError(
                f"{name} must give every positive weight a share of at least 1/{RESOLUTION} after normalising, "
                f"got {weights[d]} at position {d}: pass integer weights (exact up to a sum of {MAX_PERIOD})"
            )
    divisor = int(np.gcd.reduce(counts[counts > 0]))
    return counts // divisor


class QuotaPeriod:
    """One period of the interleave for integer weights ``counts``: which source each position takes,
    and which of that source's draws in the period it is. Its arrays are read-only: ``quota_period``
    shares one among the mixtures of the same weights."""

    __slots__ = ("__weakref__", "counts", "draws", "period", "sources")

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.array(counts, dtype=np.int64)  # a copy: read-only below, the caller's array stays as it is
        self.period = int(self.counts.sum())
        order, positions = _midpoint_order(self.counts)
        if not _inside_windows(self.counts, order, positions):
            order = _earliest_deadline_first(self.counts)
            positions = _by_source(order)
        dtype = np.uint16 if len(self.counts) <= 1 << 16 else np.uint32
        self.sources = order.astype(dtype)
        starts = (np.cumsum(self.counts) - self.counts).astype(np.uint32)
        draws = np.empty(self.period, dtype=np.uint32)
        draws[positions] = np.arange(self.period, dtype=np.uint32) - starts[self.sources[positions]]
        self.draws = draws
        for array in (self.counts, self.sources, self.draws):
            array.flags.writeable = False

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw number of that source) at each position of the stream (int64 arrays)."""
        cycles, offsets = np.divmod(positions, self.period)
        sources = self.sources[offsets].astype(np.int64)
        return sources, cycles * self.counts[sources] + self.draws[offsets]

    def counts_before(self, position: int) -> np.ndarray:
        """Each source's draws in the first ``position`` positions of the stream, O(Q)."""
        cycles, offset = divmod(position, self.period)
        partial = np.bincount(self.sources[:offset], minlength=len(self.counts)).astype(np.int64)
        return cycles * self.counts + partial


_live: weakref.WeakValueDictionary[bytes, QuotaPeriod] = weakref.WeakValueDictionary()  # counts' bytes -> period


def quota_period(counts: np.ndarray) -> QuotaPeriod:
    """The period of integer weights ``counts``, built once while a mixture holds it: a mixture of the same weights
    built meanwhile (a ``MixedStream`` builds its own at every resume; a change at a resume keeps the saved weights)
    shares it, where building it again is O(Q), most of a mixture's set-up (a period of float weights, 10^6
    positions, takes tenths of a second).

    Example:
        >>> period = quota_period(np.array([1, 2]))
        >>> quota_period(np.array([1, 2])) is period, period.sources.tolist(), period.draws.tolist()
        (True, [1, 0, 1], [0, 0, 1])
    """
    counts = np.asarray(counts, dtype=np.int64)
    key = counts.tobytes()  # exact: one int64 per source
    period = _live.get(key)
    if period is None:
        period = _live[key] = QuotaPeriod(counts)
    return period


def _midpoint_order(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draws sorted by their midpoint (k + 1/2) / n_d (Webster's divisor method), vectorised; it keeps
    the quota windows for most weights, and is checked before use. With it, each draw's position, by
    source, each source's draws in order (``_by_source`` of the order): the sort's inverse, as a
    source's midpoints rise with k, so no second sort."""
    sources = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    draws = np.arange(len(sources), dtype=np.int32) - (np.cumsum(counts) - counts).astype(np.int32)[sources]
    keys = (2.0 * draws + 1) / (2.0 * counts[sources])
    sort = np.lexsort((sources, keys))
    del draws, keys  # the peak memory stays the sort's
    positions = np.empty(len(sort), dtype=np.int32)  # a period is at most 2**20 positions
    positions[sort] = np.arange(len(sort), dtype=np.int32)
    return sources[sort], positions


def _by_source(order: np.ndarray) -> np.ndarray:
    """The positions of ``order`` by source, each source's draws in order."""
    return np.argsort(order, kind="stable")


def _inside_windows(counts: np.ndarray, order: np.ndarray, positions: np.ndarray | None = None) -> bool:
    """Whether every draw of ``order`` lies in its quota window (the prefix bound at every prefix);
    checked in chunks, so the check adds O(chunk) memory to the period's. ``positions``: ``_by_source(order)``
    when the caller has it."""
    period = int(counts.sum())
    positions = _by_source(order) if positions is None else positions
    starts = np.cumsum(counts) - counts
    for start in range(0, period, _CHUNK):
        at = positions[start : start + _CHUNK].astype(np.int64)
        sources = order[at]
        draws = np.arange(start, start + len(at), dtype=np.int64) - starts[sources]
        n = counts[sources]
        inside = (draws * period // n <= at) & (at <= -(-(draws + 1) * period // n) - 1)
        if not inside.all():
            return False
    return True


def _earliest_deadline_first(counts: np.ndarray) -> np.ndarray:
    """The quota sequence by earliest deadline first among released draws, O(Q log D): the fallback
    when the midpoint order leaves a window."""
    period = int(counts.sum())
    n = counts.tolist()
    order = np.empty(period, dtype=np.int64)
    taken = [0] * len(n)
    ready = [(-(-period // n[d]) - 1, d) for d in range(len(n)) if n[d]]
    heapq.heapify(ready)
    waiting: list[tuple[int, int]] = []
    for position in range(period):
        while waiting and waiting[0][0] <= position:
            _, d = heapq.heappop(waiting)
            heapq.heappush(ready, (-(-(taken[d] + 1) * period // n[d]) - 1, d))
        deadline, d = heapq.heappop(ready)
        if deadline < position:  # cannot happen: the windows are feasible (Tijdeman)
            raise RuntimeError(f"quota window missed for source {d} at position {position}")
        order[position] = d
        taken[d] += 1
        if taken[d] < n[d]:
            heapq.heappush(waiting, (taken[d] * period // n[d], d))
    return order
