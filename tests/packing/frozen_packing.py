"""Best-fit decreasing of one window, frozen as ``order/packing.py`` defined it in 0.2: the reference the
vectorised counts (``bin_counts``) and today's ``pack_window`` must keep agreeing with."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


def reference_pack_window(lengths: np.ndarray | list[int], capacity: int, padded: bool) -> list[list[int]]:
    """Bins of indices into ``lengths``, each ascending, in the order they were opened."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    sizes = np.asarray(lengths, dtype=np.int64)[order].tolist()
    bins: list[list[int]] = []
    rooms: list[int] = []
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
    return [sorted(members) for members in bins]
