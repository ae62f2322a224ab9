"""``Mixture``: several datasets drawn at set weights, each walking its own reshuffled passes.

The data is a ``ConcatDataset``: source d owns records [offset_d, offset_d + sizes[d]). The stream
of draws runs on across epochs (epoch e holds stream positions e*num_samples ... (e+1)*num_samples - 1);
which source each stream position takes is the quota interleave of ``quota.py``, so at every prefix
of the stream each source's count is within 1 of its target share. Source d's k-th draw is record
k % size_d of its source-epoch k // size_d, a permutation of its own seeded by (seed, d, source-epoch):
a small source repeats, reshuffled each time; a large one continues where the last epoch stopped.

``schedule`` changes the weights from given stream positions on: a key ``e`` is (e, 0), a key
``(e, position)`` is stream position e*num_samples + position. The stream restarts its interleave at
each change (the prefix bound holds from the start of each constant-weight segment), while every
source's draws continue: no record of a source-epoch is drawn twice or skipped because the weights
moved. The draws before each segment are counted once at construction (O(Q) per segment), so a resume
is O(1).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from numbers import Integral
from typing import Any

import numpy as np

from stateful_sampler.checks import check_int
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.quota import QuotaPeriod, rational_weights
from stateful_sampler.order.ragged import RaggedPermutation
from stateful_sampler.order.strategy import PassOrder, Strategy, id_array, weight_array

_TAG = 0x4D495854  # "MIXT": this module's seeds
_MAX_STREAM = 1 << 62  # stream positions and draw numbers stay int64


class Mixture(Strategy):
    """Epochs of ``num_samples`` draws from D concatenated sources at ``weights``.

    Args:
        sizes: records per source (all positive), in ``ConcatDataset`` order.
        weights: one non-negative weight per source, not all zero; normalised. Integers summing to at
            most 2**20 are exact ratios; other weights are rounded to millionths (``weights_at`` shows
            the ones used, against which the prefix bound is exact).
        num_samples: the epoch length (required: a mixture has no natural one).
        schedule: ``{key: weights}``: from that key on (until the next entry), these weights; a key is
            an epoch ``e`` (its start) or a pair ``(e, position)`` with ``0 <= position < num_samples``.

    Example:
        >>> mixture = Mixture([4, 6], [1, 1], num_samples=10, schedule={(0, 6): [1, 0]})
        >>> mixture.locate(0, np.arange(10))[0].tolist()
        [0, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    """

    name = "mixture"

    def __init__(
        self, sizes: Any, weights: Any, *, num_samples: int, schedule: Mapping[Any, Any] | None = None
    ) -> None:
        self.sizes = id_array("sizes", sizes)
        empty = np.flatnonzero(self.sizes == 0)
        if not self.sizes.size or empty.size:
            where = f"source {int(empty[0])} has 0 records" if empty.size else "no sources"
            raise ValueError(f"sizes must hold at least one source, each of at least 1 record, got {where}")
        total = sum(self.sizes.tolist())  # Python ints: a sum past int64 would wrap to another total
        if total >= MAX_SIZE:
            raise ValueError(f"sizes must add up to fewer than 2**62 records (a dataset's N), got {total}")
        self.num_samples = check_int("num_samples", num_samples, minimum=1)
        self.offsets = np.cumsum(self.sizes) - self.sizes
        changes: dict[int, tuple[Any, Any]] = {}  # stream position -> (the key as given, its weights)
        for key, value in dict(schedule or {}).items():
            start = self._stream_position(key)
            if start in changes:
                raise ValueError(
                    f"schedule keys must be distinct stream positions, got {changes[start][0]!r} and {key!r} "
                    f"(both stream position {start})"
                )
            changes[start] = (key, value)
        self._starts = [0, *sorted(changes)]  # stream positions where each constant-weight segment starts
        self._keys = [0, *(self._label(start) for start in self._starts[1:])]
        given = [weights, *(changes[start][1] for start in self._starts[1:])]
        names = ["weights", *(f"schedule[{changes[start][0]!r}]" for start in self._starts[1:])]
        self._periods = [
            QuotaPeriod(rational_weights(name, self._per_source(name, w))) for name, w in zip(names, given)
        ]
        self._draws_before = self._segment_draws()
        self._permutations = RaggedPermutation(self.sizes)

    def _stream_position(self, key: Any) -> int:
        """A schedule key's stream position: ``e`` is (e, 0); ``(e, position)`` is e*num_samples + position."""
        if isinstance(key, tuple):
            integral = all(isinstance(v, Integral) and not isinstance(v, bool) for v in key)
            if len(key) != 2 or not integral or key[0] < 0 or not 0 <= key[1] < self.num_samples or key == (0, 0):
                raise ValueError(
                    f"schedule keys must be an epoch >= 1 or a pair (epoch, position) of non-negative ints with "
                    f"position < num_samples = {self.num_samples}, not (0, 0), got {key!r}"
                )
            epoch, position = int(key[0]), int(key[1])
        else:
            epoch, position = check_int("schedule epoch", key, minimum=1), 0
        start = epoch * self.num_samples + position
        if start >= _MAX_STREAM:
            raise ValueError(f"schedule keys must sit below stream position 2**62, got {key!r}")
        return start

    def _label(self, start: int) -> int | tuple[int, int]:
        """A segment start as the fingerprint names it: its epoch when it starts one (as before pairs
        existed, so those fingerprints are unchanged), else (epoch, position)."""
        epoch, position = divmod(start, self.num_samples)
        return epoch if position == 0 else (epoch, position)

    def _per_source(self, name: str, weights: Any) -> np.ndarray:
        array = weight_array(name, weights)
        if len(array) != len(self.sizes):
            raise ValueError(f"{name} must have one entry per source: {len(self.sizes)} sources, got {len(array)}")
        with np.errstate(over="ignore"):
            overflows = not np.isfinite(array.sum())
        if overflows:
            array = array / array.max()  # the same ratios, with a sum that does not overflow
        return array

    def _segment_draws(self) -> list[np.ndarray]:
        """Each source's draws before each constant-weight segment: the counts carried across a change."""
        draws = [np.zeros(len(self.sizes), dtype=np.int64)]
        for index in range(1, len(self._starts)):
            length = self._starts[index] - self._starts[index - 1]
            draws.append(draws[-1] + self._periods[index - 1].counts_before(length))
        return draws

    def __repr__(self) -> str:
        return f"Mixture(<{len(self.sizes)} sources>, num_samples={self.num_samples})"

    def weights_at(self, epoch: int, position: int = 0) -> np.ndarray:
        """The normalised weights at ``position`` of epoch ``epoch`` (exactly those the prefix bound refers to)."""
        counts = self._periods[self._segment(epoch * self.num_samples + position)].counts
        return counts / counts.sum()

    def segment_starts(self) -> list[tuple[int, int]]:
        """Each constant-weight segment's first (epoch, position), in stream order."""
        return [divmod(start, self.num_samples) for start in self._starts]

    def segment_start(self, epoch: int) -> int:
        """The first epoch of the constant-weight segment holding ``epoch``, for schedules whose segments
        start at epochs; a change inside an epoch is refused (``segment_starts`` gives positions)."""
        segment = self._segment(epoch * self.num_samples)
        inside = bisect_right(self._starts, (epoch + 1) * self.num_samples - 1) != segment + 1
        first, position = divmod(self._starts[segment], self.num_samples)
        if position or inside:
            raise ValueError(
                f"epoch {epoch} of this mixture has no single epoch-aligned segment: a schedule key is a pair "
                "(epoch, position); use segment_starts()"
            )
        return first

    def draws_before(self, epoch: int, position: int = 0) -> np.ndarray:
        """How many times each source was drawn before ``position`` of epoch ``epoch`` (O(Q))."""
        stream = epoch * self.num_samples + position
        segment = self._segment(stream)
        return self._draws_before[segment] + self._periods[segment].counts_before(stream - self._starts[segment])

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, that source's draw number) at positions of an epoch: what the audit counts. Each
        position's segment is found on its stream position, so a change inside the epoch is honoured."""
        stream = np.asarray(positions, dtype=np.int64) + epoch * self.num_samples
        segments = np.searchsorted(self._starts, stream, side="right") - 1
        sources = np.empty(stream.shape, dtype=np.int64)
        draws = np.empty(stream.shape, dtype=np.int64)
        for segment in np.unique(segments).tolist():  # few: a block spans few changes
            at = segments == segment
            found, drawn = self._periods[segment].locate(stream[at] - self._starts[segment])
            sources[at], draws[at] = found, drawn + self._draws_before[segment][found]
        return sources, draws

    def _segment(self, stream: int) -> int:
        return bisect_right(self._starts, stream) - 1

    def check(self, size: int) -> None:
        total = sum(self.sizes.tolist())
        if total != size:
            raise ValueError(f"sizes must add up to the dataset's N = {size}, got {total}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.num_samples

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        if (pass_index + 1) * self.num_samples > _MAX_STREAM:
            raise ValueError(f"epoch times num_samples must stay below 2**62, got epoch {pass_index}")
        return _MixturePass(self, seed, pass_index)

    def mismatch_hint(self) -> str:
        return (
            "a Mixture's sizes, weights, num_samples and schedule are its identity: to add or remove a source, "
            "start a new mixture from this step (docs/mixtures.md, 'Changing a mixture's sources')"
        )

    def _identity(self) -> tuple[Any, ...]:
        segments = ((key, period.counts) for key, period in zip(self._keys, self._periods))
        return (self.sizes, self.num_samples, *segments)


class _MixturePass:
    """One epoch's records; its set-up is nothing but the epoch's place in the stream."""

    def __init__(self, mixture: Mixture, seed: int, pass_index: int) -> None:
        self._mixture = mixture
        self._seed = seed
        self._pass_index = pass_index

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Records at positions of the epoch: source and draw from the interleave, then the draw's
        record in that source's own permutation of its source-epoch."""
        mixture = self._mixture
        sources, draws = mixture.locate(self._pass_index, positions)
        source_epochs, inside = np.divmod(draws, mixture.sizes[sources])
        records = np.empty_like(inside)
        for source_epoch in np.unique(source_epochs):  # few: a block spans few passes of any large source
            at = source_epochs == source_epoch
            seed = derive_seed(Domain.PERMUTATION, self._seed, _TAG, int(source_epoch))
            records[at] = mixture._permutations(seed, sources[at], inside[at])
        return mixture.offsets[sources] + records
