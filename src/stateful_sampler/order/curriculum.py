"""``Curriculum``: easy records first, harder bands joining as training goes on.

Each pass takes its active bands in ascending order (band 0 = easiest), each band's records in a
shuffled order that changes every pass. ``schedule`` (the pacing function) says how many bands pass
p takes; records of the other bands are left out of it. A band's shuffle is one Feistel bijection
per pass, so a position costs a binary search over the bands and O(1) after it; set-up per pass is
O(bands), and a resume never touches the N records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.strategy import PassOrder, Strategy, id_array

Schedule = Sequence[int] | Callable[[int], int]

_TAG = 0x43555252  # "CURR": this module's seeds
FINGERPRINTED_EPOCHS = 64  # a callable schedule is fingerprinted by its values on epochs 0..63


class Curriculum(Strategy):
    """Each pass: the active bands in ascending order, each band shuffled anew.

    Args:
        bands: one band id (a non-negative integer, 0 = easiest) per record. The bands are the ids
            present, in ascending order; ids with no record are no band.
        schedule: how many bands pass (epoch) e takes: a list (entry e for epoch e, the last entry
            for every later epoch) or a callable ``epoch -> int``, pure in the epoch; ``None``: all.
    """

    name = "curriculum"

    def __init__(self, bands: Any, *, schedule: Schedule | None = None) -> None:
        ids = id_array("bands", bands)
        self._size = len(ids)
        # Hashed once here, not at every save, and without a copy of the ids.
        self._digest = hashlib.blake2b(np.ascontiguousarray(ids).data, digest_size=16).hexdigest()
        # One stable sort, a radix sort for the usual few small ids: the records band by band.
        keys = ids.astype(np.min_scalar_type(int(ids.max(initial=0))), copy=False)
        self._members = np.argsort(keys, kind="stable").astype(np.int64, copy=False)
        in_order = keys[self._members]
        self._ends = np.append(np.flatnonzero(in_order[1:] != in_order[:-1]) + 1, len(ids)).astype(np.int64)
        if not len(ids):
            self._ends = self._ends[:0]  # band b holds sorted slots [ends[b-1], ends[b])
        self.num_bands = len(self._ends)
        self._schedule = schedule
        self._listed: tuple[int, ...] | None = None
        if schedule is None:
            self.passes_vary = False
        elif callable(schedule):
            self.passes_vary = True  # unknowable for a callable: carry is refused
        elif isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not len(schedule):
            raise TypeError(f"schedule must be a non-empty list of band counts or a callable, got {schedule!r}")
        else:
            self._listed = tuple(self._checked(epoch, value) for epoch, value in enumerate(schedule))
            self.passes_vary = len({int(self._ends[count - 1]) for count in self._listed}) > 1

    def __repr__(self) -> str:
        schedule = "" if self._schedule is None else f", schedule={_schedule_name(self._schedule)}"
        return f"Curriculum(<{self.num_bands} bands of {self._size} records>{schedule})"

    def active_bands(self, pass_index: int) -> int:
        """How many bands pass ``pass_index`` takes."""
        if self._listed is not None:
            return self._listed[min(pass_index, len(self._listed) - 1)]
        if self._schedule is None:
            return self.num_bands
        return self._checked(pass_index, self._schedule(pass_index))  # type: ignore[operator]

    def check(self, size: int) -> None:
        if self._size != size:  # check_length's message; the ids themselves are not kept
            raise ValueError(f"bands must have one entry per record: length {size}, got {self._size}")

    def known_passes(self) -> range:
        return range(len(self._listed)) if self._listed is not None else range(1)

    def pass_length(self, size: int, pass_index: int) -> int:
        active = self.active_bands(pass_index)
        return int(self._ends[active - 1]) if active else 0

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        active = self.active_bands(pass_index)
        pass_seed = derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index)
        shuffles = [FeistelPermutation(self._band_size(band), pass_seed, band) for band in range(active)]
        return _CurriculumPass(self._ends[:active], self._members, shuffles)

    def _band_size(self, band: int) -> int:
        return int(self._ends[band] - (self._ends[band - 1] if band else 0))

    def _checked(self, epoch: int, value: Any) -> int:
        """A band count from the schedule, in [1, number of bands] (0 bands is an empty epoch)."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= self.num_bands:
            raise ValueError(
                f"schedule must give between 1 and {self.num_bands} active bands (the bands present), "
                f"got {value!r} for epoch {epoch}"
            )
        return int(value)

    def _identity(self) -> tuple[Any, ...]:
        if self._schedule is None or self._listed is not None:
            schedule: Any = self._listed
        else:
            values = tuple(self.active_bands(epoch) for epoch in range(FINGERPRINTED_EPOCHS))
            schedule = (_schedule_name(self._schedule), values)
        return (self._digest, self._size, schedule)


class _CurriculumPass:
    """One pass: which band a position falls in (binary search), then that band's shuffle."""

    def __init__(self, ends: np.ndarray, members: np.ndarray, shuffles: list[FeistelPermutation]) -> None:
        self._ends = ends
        self._starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        self._members = members
        self._shuffles = shuffles

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        bands = np.searchsorted(self._ends, positions, side="right")
        first, last = int(bands.min(initial=0)), int(bands.max(initial=0))
        if first == last:  # the usual block lies inside one band
            return self._members[self._starts[first] + self._shuffles[first](positions - self._starts[first])]
        slots = np.empty_like(positions)
        for band in range(first, last + 1):
            inside = bands == band
            slots[inside] = self._starts[band] + self._shuffles[band](positions[inside] - self._starts[band])
        return self._members[slots]


def _schedule_name(schedule: Schedule) -> str:
    if callable(schedule):
        return f"{getattr(schedule, '__module__', '?')}.{getattr(schedule, '__qualname__', type(schedule).__name__)}"
    return repr(list(schedule))
