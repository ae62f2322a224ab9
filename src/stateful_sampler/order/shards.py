"""The shard-and-window order of a sharded dataset: a pure function of (seed, epoch, position).

Each epoch permutes the shards, groups consecutive shards of that order into windows of ``k``
shards, and permutes each window's records with its own bijection. Position p of the epoch
lies in the window whose record range holds p, so a reader only ever needs the ``k`` shards
of one window at a time, and ``k`` is the knob between shuffle quality and memory/IO.

Setting up an epoch costs O(S) (one permutation of the S shards and a prefix sum of their
counts); locating a position costs O(log S) (two binary searches) plus one Feistel evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import MAX_SIZE, FeistelPermutation

# Words that keep the shard and window permutations apart from each other and from the map-style
# sampler's record permutation (which is keyed by the bare seed).
_SHARD_WORD = 0x5348415244  # "SHARD"
_WINDOW_WORD = 0x57494E444F57  # "WINDOW"


class ShardedShuffle:
    """The order of records over shards with ``counts[i]`` records each, in windows of ``window`` shards."""

    def __init__(self, counts: Sequence[int], window: int, seed: int) -> None:
        self.counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if self.counts.size == 0 or int(self.counts.min()) < 0:
            raise ValueError(f"counts must be a non-empty list of non-negative ints, got {list(counts)[:8]}")
        self.size = int(self.counts.sum())
        if not 0 < self.size < MAX_SIZE:
            raise ValueError(f"the shards must hold between 1 and 2**62 - 1 records, got {self.size}")
        if window < 1:
            raise ValueError(f"window must be at least 1 shard, got {window}")
        self.window = window
        self.seed = seed
        # Global record index of a shard's row 0: shards in the order given, the map-style view.
        self.offsets = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        self._shard_seed = derive_seed(Domain.PERMUTATION, seed, _SHARD_WORD)

    def epoch(self, epoch: int) -> EpochWindows:
        """The epoch's shard order and windows, O(S)."""
        shards = len(self.counts)
        order = FeistelPermutation(shards, self._shard_seed, epoch)(np.arange(shards, dtype=np.int64))
        return EpochWindows(self, epoch, order)


class EpochWindows:
    """One epoch: the shard order, each slot's first position, and each window's first position."""

    def __init__(self, shuffle: ShardedShuffle, epoch: int, shard_order: np.ndarray) -> None:
        self.shuffle = shuffle
        self.epoch = epoch
        self.shard_order = shard_order
        self.slot_starts = np.concatenate(([0], np.cumsum(shuffle.counts[shard_order])))
        windows = -(-len(shard_order) // shuffle.window)
        bounds = np.minimum(np.arange(windows + 1) * shuffle.window, len(shard_order))
        self.window_starts = self.slot_starts[bounds]
        self._window_seed = derive_seed(Domain.PERMUTATION, shuffle.seed, _WINDOW_WORD, epoch)
        self._permutations: dict[int, FeistelPermutation] = {}

    @property
    def windows(self) -> int:
        return len(self.window_starts) - 1

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        """The window holding each position (empty windows are skipped by ``side="right"``)."""
        return np.searchsorted(self.window_starts, positions, side="right") - 1

    def window_shards(self, window: int) -> np.ndarray:
        """The shards of one window, in slot order."""
        k = self.shuffle.window
        return self.shard_order[window * k : (window + 1) * k]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row) of each position in [0, size): what the order puts there."""
        positions = np.asarray(positions, dtype=np.int64)
        windows = self.window_of(positions)
        placed = np.empty_like(positions)
        for window in np.unique(windows).tolist():
            inside = windows == window
            start = int(self.window_starts[window])
            placed[inside] = start + self._permutation(window)(positions[inside] - start)
        slots = np.searchsorted(self.slot_starts, placed, side="right") - 1
        return self.shard_order[slots], placed - self.slot_starts[slots]

    def records(self, positions: np.ndarray) -> np.ndarray:
        """Global record indices (shards concatenated in the order given) at ``positions``."""
        shards, rows = self.locate(positions)
        return self.shuffle.offsets[shards] + rows

    def _permutation(self, window: int) -> FeistelPermutation:
        permutation = self._permutations.get(window)
        if permutation is None:
            size = int(self.window_starts[window + 1] - self.window_starts[window])
            permutation = FeistelPermutation(size, self._window_seed, window)
            self._permutations = {window: permutation}  # a reader moves forward: keep only the last
        return permutation
