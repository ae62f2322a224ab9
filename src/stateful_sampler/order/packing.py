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
