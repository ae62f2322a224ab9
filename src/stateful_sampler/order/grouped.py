"""``Grouped``: whole groups (sequences, utterances, videos) shuffled, each group's records kept together.

Each pass permutes the G groups; a group's records then sit in consecutive positions of the pass, in
ascending index order (``shuffle_within=True``: in a per-group, per-pass shuffled order). Set-up per
pass is O(G) (the permuted group sizes and their prefix sums), a position is found by a binary search
over them, O(log G), so a resume costs O(G), never O(N).

Ranks stride through a pass (rank r of W takes positions r, r+W, ...), so by default a group's
records are dealt round-robin over the ranks. ``lanes=W`` keeps each group whole on one of W ranks,
for stateful sequence models: the groups are split once into W balanced lanes, a pass interleaves
the lanes position by position, and slot p % W of the stride walks one lane. The lanes are fixed at
construction because a pass's length may not depend on the seed; each pass shuffles the groups inside
every lane and which slot takes which lane. Every lane is as long as the longest one, so shorter lanes
wrap onto their own first records (repeats, marked as padding) and every rank takes the same
number of steps.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from stateful_sampler.checks import check_bool, check_int
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.ragged import RaggedPermutation
from stateful_sampler.order.strategy import PassOrder, Strategy, id_array

_TAG = 0x47525550  # "GRUP": this module's seeds
_WITHIN = 0x57544849  # "WTHI": the shuffle inside groups
_LANES = 0x4C414E45  # "LANE": which stride slot takes which lane


class Grouped(Strategy):
    """Each pass: the groups in a shuffled order, each group's records consecutive.

    Args:
        groups: one group id (a non-negative integer) per record: a list, NumPy array or 1-D tensor.
        shuffle_within: shuffle the records inside each group, differently every pass.
        lanes: keep every group whole on one of ``lanes`` ranks (set it to the world size); 1 deals
            each group's records round-robin over the ranks.
    """

    name = "grouped"

    def __init__(self, groups: Any, *, shuffle_within: bool = False, lanes: int = 1) -> None:
        ids = id_array("groups", groups)
        self.shuffle_within = check_bool("shuffle_within", shuffle_within)
        self.lanes = check_int("lanes", lanes, minimum=1)
        self._size = len(ids)
        # Hashed once here, not at every save, and without a copy of the ids.
        self._digest = hashlib.blake2b(np.ascontiguousarray(ids).data, digest_size=16).hexdigest()
        self._sizes, self._starts, self._members = _group_table(ids)
        if self.lanes > max(len(self._sizes), 1):
            raise ValueError(f"lanes must be at most the number of groups ({len(self._sizes)}), got {self.lanes}")
        self._within = RaggedPermutation(self._sizes) if self.shuffle_within else None
        self._lane_groups, self._lane_bounds = _balanced_lanes(self._sizes, self.lanes)
        ends = np.concatenate(([0], np.cumsum(self._sizes[self._lane_groups]))).astype(np.int64)
        self._lane_sizes = ends[self._lane_bounds[1:]] - ends[self._lane_bounds[:-1]]
        self._lane_length = int(self._lane_sizes.max(initial=0))

    def __repr__(self) -> str:
        options = (", shuffle_within=True" if self.shuffle_within else "") + (
            f", lanes={self.lanes}" if self.lanes > 1 else ""
        )
        return f"Grouped(<{len(self._sizes)} groups of {self._size} records>{options})"

    @property
    def num_groups(self) -> int:
        return len(self._sizes)

    def check(self, size: int) -> None:
        if self._size != size:  # check_length's message; the ids themselves are not kept
            raise ValueError(f"groups must have one entry per record: length {size}, got {self._size}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.lanes * self._lane_length

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        return _GroupedPass(self, derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index))

    def _identity(self) -> tuple[Any, ...]:
        return (self._digest, self._size, self.shuffle_within, self.lanes)


class _GroupedPass:
    """One pass's set-up, O(G): the groups in pass order lane by lane, and where each one ends."""

    def __init__(self, strategy: Grouped, pass_seed: int) -> None:
        self._strategy = strategy
        self._within_seed = derive_seed(Domain.PERMUTATION, pass_seed, _WITHIN)
        lanes = strategy.lanes
        bounds = strategy._lane_bounds
        order = np.empty_like(strategy._lane_groups)
        for lane in range(lanes):
            start, stop = int(bounds[lane]), int(bounds[lane + 1])
            shuffle = FeistelPermutation(stop - start, pass_seed, lane)
            order[start:stop] = strategy._lane_groups[start + shuffle(np.arange(stop - start, dtype=np.int64))]
        self._groups = order
        self._ends = np.cumsum(strategy._sizes[order])
        lane_sizes = strategy._lane_sizes
        self._lane_starts = np.concatenate(([0], np.cumsum(lane_sizes)[:-1])).astype(np.int64)
        slots = FeistelPermutation(lanes, derive_seed(Domain.PERMUTATION, pass_seed, _LANES), 0)
        self._slot_lane = slots(np.arange(lanes, dtype=np.int64))  # stride slot -> the lane it walks

    def repeats(self, positions: np.ndarray) -> np.ndarray:
        """Which pass positions walk a short lane again (its own first records, only to keep every
        rank's step count equal): marked as padding, so they can be masked."""
        strategy = self._strategy
        lanes = strategy.lanes
        if lanes == 1:
            return np.zeros(positions.shape, dtype=bool)
        lane = self._slot_lane[positions % lanes]
        return (positions // lanes) >= strategy._lane_sizes[lane]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        strategy = self._strategy
        lanes = strategy.lanes
        if lanes == 1:
            offsets = positions
        else:
            lane = self._slot_lane[positions % lanes]
            offsets = self._lane_starts[lane] + (positions // lanes) % strategy._lane_sizes[lane]
        at = np.searchsorted(self._ends, offsets, side="right")
        groups = self._groups[at]
        sizes = strategy._sizes[groups]
        inside = offsets - (self._ends[at] - sizes)
        if strategy._within is not None:
            inside = strategy._within(self._within_seed, groups, inside)
        slots = strategy._starts[groups] + inside
        return slots if strategy._members is None else strategy._members[slots]


def _group_table(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Groups numbered by ascending id: their sizes, where each starts, and the records by group.

    When every group is one run of records (sequences stored one after another), a group's records are
    start + offset and no O(N) table is kept: O(G) memory, found from the run boundaries alone."""
    boundaries = np.flatnonzero(ids[1:] != ids[:-1]) + 1 if len(ids) else np.empty(0, dtype=np.int64)
    run_starts = np.concatenate(([0], boundaries)).astype(np.int64) if len(ids) else boundaries
    run_ids = ids[run_starts]
    if len(np.unique(run_ids)) == len(run_ids):
        order = np.argsort(run_ids, kind="stable")
        run_sizes = np.diff(np.append(run_starts, len(ids)))
        return run_sizes[order].astype(np.int64), run_starts[order], None
    _, inverse, sizes = np.unique(ids, return_inverse=True, return_counts=True)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    return sizes.astype(np.int64), starts, np.argsort(inverse.reshape(-1), kind="stable").astype(np.int64)


def _balanced_lanes(sizes: np.ndarray, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """The groups dealt to ``lanes`` lanes, largest first, in snake order (0..W-1, W-1..0, ...), so lane
    totals differ by at most the largest group; returned lane by lane, with each lane's bounds."""
    count = len(sizes)
    by_size = np.argsort(-sizes, kind="stable")
    turn, place = np.divmod(np.arange(count, dtype=np.int64), lanes)
    lane_of = np.empty(count, dtype=np.int64)
    lane_of[by_size] = np.where(turn % 2 == 0, place, lanes - 1 - place)
    grouped = np.argsort(lane_of, kind="stable").astype(np.int64)
    bounds = np.searchsorted(lane_of[grouped], np.arange(lanes + 1), side="left").astype(np.int64)
    return grouped, bounds
