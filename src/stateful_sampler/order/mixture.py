"""``Mixture``: several datasets drawn at set weights, each walking its own reshuffled passes.

The data is a ``ConcatDataset``: source d owns records [offset_d, offset_d + sizes[d]). The stream
of draws runs on across epochs (epoch e holds stream positions e*num_samples ... (e+1)*num_samples - 1);
which source each stream position takes is the quota interleave of ``quota.py``, so at every prefix
of the stream each source's count is within 1 of its target share. Source d's k-th draw is record
k % size_d of its source-epoch k // size_d, a permutation of its own seeded by (seed, d, source-epoch):
a small source repeats, reshuffled each time; a large one continues where the last epoch stopped.

``schedule`` changes the weights from given epochs on. The stream then restarts its interleave at each
change (the prefix bound holds from the start of each constant-weight segment), while every source's
draws continue: no record of a source-epoch is drawn twice or skipped because the weights moved. The
draws before each segment are counted once at construction (O(Q) per segment), so a resume is O(1).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
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
        schedule: ``{epoch: weights}``: from that epoch on (until the next entry), these weights.
    """

    name = "mixture"

    def __init__(
        self, sizes: Any, weights: Any, *, num_samples: int, schedule: Mapping[int, Any] | None = None
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
        changes = dict(schedule or {})
        for epoch in changes:
            check_int("schedule epoch", epoch, minimum=1)
        self._starts = [0, *sorted(changes)]
        given = [weights, *(changes[epoch] for epoch in self._starts[1:])]
        names = ["weights", *(f"schedule[{epoch}]" for epoch in self._starts[1:])]
        self._periods = [
            QuotaPeriod(rational_weights(name, self._per_source(name, w))) for name, w in zip(names, given)
        ]
        self._draws_before = self._segment_draws()
        self._permutations = RaggedPermutation(self.sizes)

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
            length = (self._starts[index] - self._starts[index - 1]) * self.num_samples
            if length >= _MAX_STREAM:
                raise ValueError(
                    f"schedule epochs times num_samples must stay below 2**62, got epoch {self._starts[index]}"
                )
            draws.append(draws[-1] + self._periods[index - 1].counts_before(length))
        return draws

    def __repr__(self) -> str:
        return f"Mixture(<{len(self.sizes)} sources>, num_samples={self.num_samples})"

    def weights_at(self, epoch: int) -> np.ndarray:
        """The normalised weights epoch ``epoch`` draws at (exactly those the prefix bound refers to)."""
        counts = self._periods[self._segment(epoch)].counts
        return counts / counts.sum()

    def segment_start(self, epoch: int) -> int:
        """The first epoch of the constant-weight segment holding ``epoch``."""
        return self._starts[self._segment(epoch)]

    def draws_before(self, epoch: int) -> np.ndarray:
        """How many times each source was drawn before ``epoch`` starts (O(Q))."""
        segment = self._segment(epoch)
        length = (epoch - self._starts[segment]) * self.num_samples
        return self._draws_before[segment] + self._periods[segment].counts_before(length)

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, that source's draw number) at positions of an epoch: what the audit counts."""
        segment = self._segment(epoch)
        start = (epoch - self._starts[segment]) * self.num_samples
        sources, draws = self._periods[segment].locate(positions + start)
        return sources, draws + self._draws_before[segment][sources]

    def _segment(self, epoch: int) -> int:
        return bisect_right(self._starts, epoch) - 1

    def check(self, size: int) -> None:
        total = sum(self.sizes.tolist())
        if total != size:
            raise ValueError(f"sizes must add up to the dataset's N = {size}, got {total}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.num_samples

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        segment = self._segment(pass_index)
        start = (pass_index - self._starts[segment]) * self.num_samples
        if start + self.num_samples > _MAX_STREAM:
            raise ValueError(f"epoch times num_samples must stay below 2**62, got epoch {pass_index}")
        return _MixturePass(self, seed, pass_index)

    def mismatch_hint(self) -> str:
        return (
            "a Mixture's sizes, weights, num_samples and schedule are its identity: to add or remove a source, "
            "start a new mixture from this step (docs/mixtures.md, 'Changing a mixture's sources')"
        )

    def _identity(self) -> tuple[Any, ...]:
        segments = ((start, period.counts) for start, period in zip(self._starts, self._periods))
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
