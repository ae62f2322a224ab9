"""The bin-packing rule shared by packed rows and token-budget batches: best-fit decreasing in one window.

One window's records are taken longest first; each goes into the open bin with the least room that
still takes it, or opens a bin. What "room" means is the only difference between the two costs:

- ``padded=False`` (a packed row, or a batch whose cost is its token sum): room is the capacity
  minus the tokens already in, and a record asks for its length.
- ``padded=True`` (a padded batch, cost = longest x count): records arrive longest first, so a
  bin's first record is its longest; room is the count still allowed, ``capacity // first - count``,
  and every record asks for 1.

Best fit keeps the open bins as a sorted list of rooms (``bisect``), O(log bins) to choose and a
short memmove to update per record: a few microseconds per record in CPython (docs/packing.md). Full
bins leave the list, so it holds only bins that can still take the shortest record.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


def pack_window(lengths: np.ndarray, capacity: int, *, padded: bool = False) -> list[np.ndarray]:
    """Bins of one window: each an array of indices into ``lengths`` (ascending), in the order the bins
    were opened (a bin's first record is the longest left at that time). Every index is in exactly one
    bin and each bin's cost is at most ``capacity``; every length must lie in [1, capacity].

    Example:
        >>> [bin.tolist() for bin in pack_window(np.array([5, 3, 4, 2]), 7)]
        [[0, 3], [1, 2]]
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    sizes = np.asarray(lengths, dtype=np.int64)[order].tolist()
    bins: list[list[int]] = []
    rooms: list[int] = []  # ascending; rooms[i] belongs to bins[owners[i]]
    owners: list[int] = []
    for index, size in zip(order, sizes):
        need = 1 if padded else size
        at = bisect_left(rooms, need)
        if at < len(rooms):
            owner = owners.pop(at)
            room = rooms.pop(at) - need
            bins[owner].append(index)
        else:
            owner = len(bins)
            bins.append([index])
            room = capacity // size - 1 if padded else capacity - size
        if room > 0:
            at = bisect_left(rooms, room)
            rooms.insert(at, room)
            owners.insert(at, owner)
    return [np.sort(np.array(members, dtype=np.int64)) for members in bins]


def bin_cost(lengths: np.ndarray, *, padded: bool = False) -> int:
    """What one bin costs: its token sum, or its longest record times its count when padded."""
    if not len(lengths):
        return 0
    return int(lengths.max()) * len(lengths) if padded else int(lengths.sum())


# bin_counts: the same bins counted for many windows at once, in NumPy lock-step (one record of every window per
# step). A window's rooms are a multiset of integers in [1, capacity): a count per value, and above it one bitmap
# per 64x (bit v of a level: value v of the level below is present), so "the smallest room >= need" is a few
# word operations per window, whatever the number of open bins. Room 0 is a scratch slot no query ever reads:
# the step writes there when it has nothing to take out or put in, so every step is the same operations.
_MAX_VECTOR_CAPACITY = 1 << 15  # beyond it a window's room table outgrows the caches: pack_window is faster
_MIN_VECTOR_WINDOWS = 32  # below it a lock-step's NumPy calls cost more than packing each window
_TABLE_CELLS = 1 << 23  # room counts held at once (16 MB of uint16): windows per lock-step batch
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_SHIFT = np.uint64(58)
_DEBRUIJN_TABLE = np.zeros(64, dtype=np.intp)
_DEBRUIJN_TABLE[(((1 << np.arange(64, dtype=object)) * 0x03F79D71B4CB0A89) % (1 << 64) >> 58).astype(np.intp)] = (
    np.arange(64)
)
_BITS = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))
_FROM = ~(_BITS - np.uint64(1))  # _FROM[b]: bits b..63 of a word
_ALL = ~np.uint64(0)


def bin_counts(windows: np.ndarray, capacity: int, *, padded: bool = False) -> np.ndarray:
    """``len(pack_window(row, capacity, padded=padded))`` for every row of ``windows`` (one window's lengths a
    row, each in [1, capacity]), at a small fraction of the cost: an epoch's row count is a sum of these.

    Example:
        >>> bin_counts(np.array([[5, 3, 4, 2], [7, 7, 1, 1]]), 7).tolist()
        [2, 3]
    """
    windows = np.asarray(windows)
    if not windows.size:
        return np.zeros(len(windows), dtype=np.int64)
    if not padded and (capacity > _MAX_VECTOR_CAPACITY or len(windows) < _MIN_VECTOR_WINDOWS):
        return np.array([len(pack_window(row, capacity)) for row in windows], dtype=np.int64)
    # lengths are at most capacity: int32 when it fits (half the memory traffic of the lock-step's reads)
    narrow = windows.astype(np.int32 if capacity < (1 << 31) else np.int64, copy=False)
    longest_first = np.sort(narrow, axis=1)[:, ::-1]  # np.sort copies: the caller's array is left as it is
    if padded:
        return _padded_counts(longest_first, capacity)
    per_batch = max(1, _TABLE_CELLS // capacity)
    return np.concatenate(
        [_best_fit_counts(longest_first[at : at + per_batch], capacity) for at in range(0, len(windows), per_batch)]
    )


def _padded_counts(longest_first: np.ndarray, capacity: int) -> np.ndarray:
    """Padded bins never share a record: the only open bin is the last one opened (every record asks for 1, so
    the least room is any room), so a bin is the next ``capacity // first`` records of the window."""
    count, width = longest_first.shape
    flat = np.ascontiguousarray(longest_first).reshape(-1)
    position = np.arange(count, dtype=np.int64) * width
    end = position + width
    bins = np.zeros(count, dtype=np.int64)
    live = np.arange(count)
    while live.size:
        position[live] += capacity // flat[position[live]]
        bins[live] += 1
        live = live[position[live] < end[live]]
    return bins


def _ctz(words: np.ndarray) -> np.ndarray:
    """The lowest set bit of each (nonzero) word, by de Bruijn multiplication (NumPy 1.24 has no bit count)."""
    low = np.negative(words)
    low &= words
    low *= _DEBRUIJN
    low >>= _DEBRUIJN_SHIFT
    return _DEBRUIJN_TABLE[low.view(np.int64)]


def _best_fit_counts(longest_first: np.ndarray, capacity: int) -> np.ndarray:
    """The unpadded bin count of each row, by best fit in lock-step over the rows.

    A record longer than ``capacity // 2`` finds every open bin's room below it (the bin's first record is at
    least as long), so those records open one bin each and only put their rooms in; the rest take one step each.
    Rows are ordered by how many such records they have, so the rows still packing at a step are a prefix."""
    count, width = longest_first.shape
    alone = longest_first > capacity // 2
    singles = alone.sum(axis=1)
    order = np.argsort(singles, kind="stable")
    longest_first, alone, singles = longest_first[order], alone[order], singles[order]
    widths = []
    levels_width = capacity
    while levels_width > 1:
        levels_width = (levels_width >> 6) + 1
        widths.append(levels_width)
    rooms = np.zeros(count * capacity, dtype=np.uint16 if width < (1 << 16) else np.int64)
    rows, columns = np.nonzero(alone)
    np.add.at(rooms, rows * capacity + capacity - longest_first[rows, columns], 1)
    rooms.reshape(count, capacity)[:, 0] = 0
    present = rooms.reshape(count, capacity) > 0
    levels = []
    for level_width in widths:
        bits = np.zeros((count, level_width * 64), dtype=bool)
        bits[:, : present.shape[1]] = present
        packed = np.packbits(bits, axis=1, bitorder="little").view("<u8").astype(np.uint64)
        levels.append(packed.reshape(-1))
        present = packed != 0
    left = width - singles
    steps = int(left[0])
    if not steps:  # every record alone (capacity 1, or every record longer than half of it)
        return singles.astype(np.int64)[np.argsort(order)]
    columns_at = np.minimum(singles[:, None] + np.arange(steps), width - 1)
    steps_major = np.ascontiguousarray(np.take_along_axis(longest_first, columns_at, axis=1).T)
    live_at = np.searchsorted(-left, -np.arange(steps), side="left")  # rows with more than t records to place
    bases = [np.arange(count, dtype=np.int64) * level_width for level_width in widths]
    room_base = np.arange(count, dtype=np.int64) * capacity
    opened = np.zeros(count, dtype=np.int64)
    top, top_words = len(widths) - 1, levels[-1]
    for step in range(steps):
        live = int(live_at[step])
        need = steps_major[step, :live].astype(np.int64)
        # the smallest room >= need: the word holding need at each level, then down from the first hit
        value = need
        quotients: list[np.ndarray] = []
        words: list[np.ndarray] = []
        for depth in range(top):
            quotient = value >> 6
            word = levels[depth][bases[depth][:live] + quotient]
            word &= _FROM[value & 63]
            quotients.append(quotient)
            words.append(word)
            value = quotient + 1
        word = top_words[:live] & _FROM[value]
        room = _ctz(word)
        found = word != 0
        for depth in range(top - 1, -1, -1):
            hit = words[depth] != 0
            index = np.where(hit, quotients[depth], room)
            word = np.where(hit, words[depth], levels[depth][bases[depth][:live] + index])
            room = (index << 6) + _ctz(word)
            found |= hit
        room *= found
        opened[:live] += ~found
        _take_out(rooms, levels, bases, room_base[:live] + room, room)
        room = np.where(found, room, capacity) - need
        _put_in(rooms, levels, bases, room_base[:live] + room, room)
    bins = np.empty(count, dtype=np.int64)
    bins[order] = singles + opened
    return bins


def _take_out(
    rooms: np.ndarray, levels: list[np.ndarray], bases: list[np.ndarray], cell: np.ndarray, value: np.ndarray
) -> None:
    """One room of value ``value`` out of each live row (its count is at ``cell``); a bit goes when its count does."""
    left = rooms[cell] - 1
    rooms[cell] = left
    cleared = left == 0
    live = len(value)
    for base, level in zip(bases[:-1], levels[:-1]):
        at = base[:live] + (value >> 6)
        word = level[at] & np.where(cleared, ~_BITS[value & 63], _ALL)
        level[at] = word
        cleared &= word == 0
        value = value >> 6
    levels[-1][:live] &= np.where(cleared, ~_BITS[value], _ALL)  # one word a row: a slice, no gather


def _put_in(
    rooms: np.ndarray, levels: list[np.ndarray], bases: list[np.ndarray], cell: np.ndarray, value: np.ndarray
) -> None:
    """One room of value ``value`` into each live row (its count is at ``cell``)."""
    rooms[cell] += 1
    live = len(value)
    for base, level in zip(bases[:-1], levels[:-1]):
        level[base[:live] + (value >> 6)] |= _BITS[value & 63]
        value = value >> 6
    levels[-1][:live] |= _BITS[value]
