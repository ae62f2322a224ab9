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

from stateful_sampler.order.mixing import Domain, derive_seed, mix64_array
from stateful_sampler.order.permutation import MAX_SIZE, FeistelPermutation

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
        for window in np.unique(windows).tolist():
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
