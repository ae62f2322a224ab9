"""The shard-and-window order of a sharded dataset: a pure function of (seed, epoch, position).

Each epoch permutes the shards and groups consecutive shards of that order into groups of
``window * spread`` shards. Each shard is cut into ``spread`` contiguous pieces, and a group's
``spread`` windows take one piece of every shard of the group each (shard t's piece for window i is
piece ``(i + r_t) mod spread``, ``r_t`` a seeded rotation, so no window gets every shard's first rows).
Each window's records are permuted with their own bijection. A window therefore holds about
``window`` shards' records, as many as ``spread = 1`` does, drawn from ``window * spread`` shards:
the memory is the same, and a batch mixes ``spread`` times more shards. ``spread = 1`` is the order of
whole shards, windows of ``window`` consecutive shards (the order before ``spread`` existed).

Position p of the epoch lies in the window whose record range holds p, so a reader only needs one
window's pieces at a time. Setting up an epoch costs O(S * spread) (one permutation of the S shards,
the pieces' sizes and a prefix sum over the windows); locating a position costs two binary searches
plus one Feistel evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed, derive_seeds, mix64_array
from stateful_sampler.order.permutation import MAX_SIZE, FeistelPermutation, permute_many

# Words that keep the shard and window permutations and the pieces' rotation apart from each other and
# from the map-style sampler's record permutation (which is keyed by the bare seed).
_SHARD_WORD = 0x5348415244  # "SHARD"
_WINDOW_WORD = 0x57494E444F57  # "WINDOW"
_PIECE_WORD = 0x5049454345  # "PIECE"
# A stream's spread unless told otherwise: a window of k shards' records mixes 8k shards (docs/streaming.md,
# "Shuffle quality": at k = 8 on 64 class-sorted shards, batch-mates as mixed as a full shuffle's).
DEFAULT_SPREAD = 8


class ShardedShuffle:
    """The order of records over shards with ``counts[i]`` records each: windows of about ``window``
    shards' records, each drawn from ``window * spread`` shards (``spread`` pieces per shard).

    Example:
        >>> order = ShardedShuffle([4, 4, 4, 4], window=1, seed=0, spread=2).epoch(0)
        >>> order.windows, order.window_starts.tolist()  # 2 groups of 2 shards, 2 windows of 2 pieces each
        (4, [0, 4, 8, 12, 16])
        >>> shards, rows = order.locate(np.arange(4))  # window 0: two rows of each shard of the first group
        >>> sorted(set(shards.tolist())) == sorted(order.window_shards(0).tolist()), len(set(shards.tolist()))
        (True, 2)
    """

    def __init__(self, counts: Sequence[int], window: int, seed: int, spread: int = 1) -> None:
        self.counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if self.counts.size == 0 or int(self.counts.min()) < 0:
            raise ValueError(f"counts must be a non-empty list of non-negative ints, got {list(counts)[:8]}")
        self.size = int(self.counts.sum())
        if not 0 < self.size < MAX_SIZE:
            raise ValueError(f"the shards must hold between 1 and 2**62 - 1 records, got {self.size}")
        if window < 1:
            raise ValueError(f"window must be at least 1 shard, got {window}")
        if spread < 1:
            raise ValueError(f"spread must be at least 1 piece per shard, got {spread}")
        self.window = window
        self.spread = spread
        self.seed = seed
        # Global record index of a shard's row 0: shards in the order given, the map-style view.
        self.offsets = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        self._shard_seed = derive_seed(Domain.PERMUTATION, seed, _SHARD_WORD)

    @property
    def group(self) -> int:
        """Shards whose pieces make up ``spread`` consecutive windows."""
        return self.window * self.spread

    def piece_bounds(self, shards: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[start, stop) of the piece of shard ``shards[i]`` that holds its row ``rows[i]``: the rows of that shard
        one window takes (the whole shard at ``spread = 1``), in every epoch. A reader that serves a window's
        positions slowly (``MixedStream``'s sources) reads these, not whole shards.

        Example:
            >>> ShardedShuffle([10, 4], 1, 0, spread=3).piece_bounds(np.array([0, 0, 1]), np.array([0, 5, 3]))
            (array([0, 3, 2]), array([3, 6, 4]))
        """
        counts = self.counts[shards]
        piece = ((np.asarray(rows, dtype=np.int64) + 1) * self.spread - 1) // counts
        return piece * counts // self.spread, (piece + 1) * counts // self.spread

    def epoch(self, epoch: int) -> EpochWindows:
        """The epoch's shard order and windows, O(S * spread)."""
        shards = len(self.counts)
        order = FeistelPermutation(shards, self._shard_seed, epoch)(np.arange(shards, dtype=np.int64))
        return EpochWindows(self, epoch, order)


class EpochWindows:
    """One epoch: the shard order, the pieces of each slot and each window's first position."""

    def __init__(self, shuffle: ShardedShuffle, epoch: int, shard_order: np.ndarray) -> None:
        self.shuffle = shuffle
        self.epoch = epoch
        self.shard_order = shard_order
        spread, group, slots = shuffle.spread, shuffle.group, len(shard_order)
        self._slot_counts = shuffle.counts[shard_order]
        if spread == 1:
            self._rotation = np.zeros(slots, dtype=np.int64)
        else:
            key = derive_seed(Domain.PERMUTATION, shuffle.seed, _PIECE_WORD, epoch)
            mixed = mix64_array(np.arange(slots, dtype=np.uint64), key, np.empty(slots, dtype=np.uint64))
            self._rotation = (mixed % np.uint64(spread)).astype(np.int64)
        # sizes[t, i]: the records slot t gives to window i of its group; a window's size is its column's sum.
        _, sizes = self._pieces_of(np.arange(slots)[:, None], np.arange(spread)[None, :])
        groups = -(-slots // group)
        padded = np.zeros((groups * group, spread), dtype=np.int64)
        padded[:slots] = sizes
        window_sizes = padded.reshape(groups, group, spread).sum(axis=1).reshape(-1)
        self.window_starts = np.concatenate(([0], np.cumsum(window_sizes)))
        self._window_seed = derive_seed(Domain.PERMUTATION, shuffle.seed, _WINDOW_WORD, epoch)
        self._permutations: dict[int, FeistelPermutation] = {}
        self._layouts: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def windows(self) -> int:
        return len(self.window_starts) - 1

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        """The window holding each position (empty windows are skipped by ``side="right"``)."""
        return np.searchsorted(self.window_starts, positions, side="right") - 1

    def window_shards(self, window: int) -> np.ndarray:
        """The shards a window takes a piece of, in slot order (its group's shards)."""
        group = self.shuffle.group
        first = window // self.shuffle.spread * group
        return self.shard_order[first : first + group]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row) of each position in [0, size): what the order puts there."""
        positions = np.asarray(positions, dtype=np.int64)
        windows = self.window_of(positions)
        shards = np.empty_like(positions)
        rows = np.empty_like(positions)
        for window in distinct(windows).tolist():
            inside = windows == window
            placed = self._permutation(window)(positions[inside] - int(self.window_starts[window]))
            piece_starts, piece_shards, piece_rows = self._layout(window)
            pieces = np.searchsorted(piece_starts, placed, side="right") - 1
            shards[inside] = piece_shards[pieces]
            rows[inside] = piece_rows[pieces] + placed - piece_starts[pieces]
        return shards, rows

    def records(self, positions: np.ndarray) -> np.ndarray:
        """Global record indices (shards concatenated in the order given) at ``positions``."""
        shards, rows = self.locate(positions)
        return self.shuffle.offsets[shards] + rows

    def _pieces_of(self, slots: np.ndarray, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first row, size) of the piece slot t gives to window i of its group, broadcast over both."""
        spread = self.shuffle.spread
        piece = (windows + self._rotation[slots]) % spread
        counts = self._slot_counts[slots]
        first = piece * counts // spread
        return first, (piece + 1) * counts // spread - first

    def _layout(self, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A window's pieces in slot order: where each starts in the window, its shard and its first row."""
        layout = self._layouts.get(window)
        if layout is None:
            group, spread = self.shuffle.group, self.shuffle.spread
            first_slot = window // spread * group
            slots = np.arange(first_slot, min(first_slot + group, len(self.shard_order)))
            first, sizes = self._pieces_of(slots, np.int64(window % spread))
            layout = (np.concatenate(([0], np.cumsum(sizes)[:-1])), self.shard_order[slots], first)
            self._layouts = {window: layout}  # a reader moves forward: keep only the last
        return layout

    def _permutation(self, window: int) -> FeistelPermutation:
        permutation = self._permutations.get(window)
        if permutation is None:
            size = int(self.window_starts[window + 1] - self.window_starts[window])
            permutation = FeistelPermutation(size, self._window_seed, window)
            self._permutations = {window: permutation}  # a reader moves forward: keep only the last
        return permutation


def locate_many(
    shuffles: Sequence[ShardedShuffle], epochs: Sequence[int], groups: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of each ``positions[i]`` in ``shuffles[g].epoch(epochs[g])``, g = ``groups[i]``, bit for bit as
    its ``locate``: a few positions in each of many orders (a mixed stream's first batch after a resume, over its
    sources) in a few NumPy calls over all of them, where setting up each epoch on its own costs tens of NumPy calls
    apiece. O(sum of S * spread), with no sort.

    Example:
        >>> a, b = ShardedShuffle([4, 6], 1, 3, spread=2), ShardedShuffle([5], 1, 4)
        >>> [found.tolist() for found in locate_many([a, b], [2, 0], np.array([0, 1, 0]), np.array([9, 4, 0]))]
        [[1, 0, 1], [4, 4, 2]]
        >>> [found.tolist() for found in a.epoch(2).locate(np.array([9, 0]))], b.epoch(0).locate(np.array([4]))
        ([[1, 1], [4, 2]], (array([0]), array([4])))
    """
    count = len(shuffles)
    groups = np.asarray(groups, dtype=np.int64)
    if not count or not groups.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    epoch = np.asarray(epochs, dtype=np.int64)
    seeds = np.fromiter((shuffle.seed for shuffle in shuffles), np.uint64, count)
    spread = np.fromiter((shuffle.spread for shuffle in shuffles), np.int64, count)
    group_shards = np.fromiter((shuffle.group for shuffle in shuffles), np.int64, count)
    shards_of = np.fromiter((len(shuffle.counts) for shuffle in shuffles), np.int64, count)
    # Every order's slots, concatenated: the shard order (its Feistel permutation of the shards), each slot's count
    # and the rotation of its pieces, as ``EpochWindows`` sets them up.
    slot_order = np.repeat(np.arange(count), shards_of)
    slot_base = _starts(shards_of)
    slot = np.arange(len(slot_order)) - slot_base[slot_order]
    shard_seeds = np.fromiter((shuffle._shard_seed for shuffle in shuffles), np.uint64, count)
    shard_order = permute_many(shards_of[slot_order], shard_seeds[slot_order], epoch[slot_order], slot)
    slot_counts = np.concatenate([shuffle.counts for shuffle in shuffles])[slot_base[slot_order] + shard_order]
    piece_keys = derive_seeds(Domain.PERMUTATION, seeds, _PIECE_WORD, epoch)[slot_order]
    mixed = mix64_array(slot.astype(np.uint64) ^ piece_keys, 0, np.empty(len(slot), dtype=np.uint64))
    rotation = (mixed % spread[slot_order].astype(np.uint64)).astype(np.int64)  # 0 at spread 1, as there
    # Every order's windows, and each window's pieces in slot order (its group's slots): window-major, so that a
    # window's pieces and the windows follow each other as the positions do.
    windows_of = -(-shards_of // group_shards) * spread
    window_order = np.repeat(np.arange(count), windows_of)
    window_base = _starts(windows_of)
    local_window = np.arange(len(window_order)) - window_base[window_order]
    window_spread = spread[window_order]
    first_slot = local_window // window_spread * group_shards[window_order]
    width = np.minimum(group_shards[window_order], shards_of[window_order] - first_slot)
    pair_base = _starts(width)
    pair_window = np.repeat(np.arange(len(width)), width)
    pair_slot = np.arange(len(pair_window)) + (slot_base[window_order] + first_slot - pair_base)[pair_window]
    pair_spread = window_spread[pair_window]
    piece = ((local_window % window_spread)[pair_window] + rotation[pair_slot]) % pair_spread
    counts = slot_counts[pair_slot]
    first = piece * counts // pair_spread
    sizes = (piece + 1) * counts // pair_spread - first
    piece_starts = _starts(sizes)  # global: every order's windows one after the other
    window_starts = piece_starts[pair_base]
    window_sizes = np.add.reduceat(sizes, pair_base)
    # The positions: their window, their place in it (its Feistel permutation), and the piece that holds it.
    records_before = _starts(np.fromiter((shuffle.size for shuffle in shuffles), np.int64, count))
    at = np.asarray(positions, dtype=np.int64) + records_before[groups]
    windows = np.searchsorted(window_starts, at, side="right") - 1
    window_seeds = derive_seeds(Domain.PERMUTATION, seeds, _WINDOW_WORD, epoch)[groups]
    placed = window_starts[windows] + permute_many(
        window_sizes[windows], window_seeds, windows - window_base[groups], at - window_starts[windows]
    )
    pieces = np.searchsorted(piece_starts, placed, side="right") - 1
    return shard_order[pair_slot[pieces]], first[pieces] + placed - piece_starts[pieces]


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending: ``np.unique`` without its first call's import of ``numpy.ma`` (0.1-0.25 s of a
    process's first resume).

    Example:
        >>> distinct(np.array([3, 1, 3, 0])).tolist()
        [0, 1, 3]
    """
    ordered = np.sort(np.asarray(values).reshape(-1))
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Where each run of ``sizes`` begins when they are laid end to end."""
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts
