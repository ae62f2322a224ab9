"""Where each position of an epoch comes from, per tail policy, and how ranks share the epoch.

The data is one stream of permutations: pass p occupies stream positions [p*N, (p+1)*N) and
holds the permutation of pass p. An epoch is a run of *global positions* 0..length-1 mapped
onto that stream. The ranks stride through a *segment* of it: rank r takes the global positions
s+r, s+r+W, s+r+2W, ... from the segment start s (0 for an epoch begun from its start, as torch's
DistributedSampler does), so a step of per-rank batch B consumes one contiguous block of B*W
global positions. A resume starts a new segment at the saved position, laid out on the ranks and
batch size of the resumed run: this is what makes a resume elastic (docs/core.md).

Stream positions are kept relative to the epoch's own pass (``epoch * N`` itself may pass int64
for huge N); everything here is integer arithmetic, O(1) per question, whatever N is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.order.policies import Tail

MAX_EPOCH = (1 << 62) - 1  # keys carry the pass index as an int64, and a pass index seeds a permutation
MAX_RANKS = 1 << 30  # with MAX_BATCH: a global batch below 2**60, so pass-relative offsets fit int64
MAX_BATCH = 1 << 30


def carry_epoch_start(size: int, global_batch: int, epoch: int, anchor_epoch: int = 0, anchor_start: int = 0) -> int:
    """Stream offset where ``epoch`` starts under ``carry``.

    Epoch e+1 starts after the whole global batches that fit before the end of pass e:
    s(e+1) = s(e) + G*floor(((e+1)*N - s(e)) / G), which telescopes to
    s(e) = s(a) + G*floor((e*N - s(a)) / G) from any known epoch start s(a) (the anchor). The
    anchor lets a run that changed its global batch keep the boundaries it already crossed.
    """
    if epoch == anchor_epoch:
        return anchor_start
    if epoch < anchor_epoch:
        anchor_start = 0
    return anchor_start + global_batch * ((epoch * size - anchor_start) // global_batch)


@dataclass(frozen=True)
class EpochLayout:
    """One epoch of one policy as the current ranks take it: its length in global positions, the
    segment the ranks stride through, and the stream positions behind them."""

    tail: Tail
    size: int
    world_size: int
    epoch: int
    stream_start: int  # stream position of global position 0
    segment_start: int  # global position where the ranks' striding begins (a resume's position)
    length: int

    @classmethod
    def build(
        cls,
        tail: Tail,
        size: int,
        world_size: int,
        epoch: int,
        global_batch: int,
        carry_start: int,
        segment_start: int = 0,
        end: int | None = None,
    ) -> EpochLayout:
        """The epoch whose positions below ``segment_start`` were consumed before (by any ranks and
        batch size), with the rest laid out on ``world_size`` ranks; an ``end`` already known (the
        saving run's, on the same ranks and batch size, or where the epoch finished) is kept.

        The rest always gives every rank the same count, except under ``uneven``: ``pad`` rounds the
        remaining records up with marked repeats, ``drop`` cuts them down, ``carry`` keeps the whole
        global batches that fit before the end of the epoch's pass and rolls the rest over.
        """
        stream_start = carry_start if tail is Tail.CARRY else epoch * size
        if end is None:
            end = segment_start + _remaining(tail, size, world_size, epoch, global_batch, carry_start, segment_start)
        return cls(tail, size, world_size, epoch, stream_start, segment_start, end)

    def local_length(self, rank: int) -> int:
        """How many positions rank ``rank`` takes in this epoch's segment."""
        return max(0, -(-(self.length - self.segment_start - rank) // self.world_size))

    def local_before(self, rank: int) -> int:
        """How many positions before the segment rank ``rank`` would have taken, striding from 0 on
        these ranks: with the segment, the rank's count for the whole epoch."""
        return max(0, -(-(self.segment_start - rank) // self.world_size))

    def position_after(self, rank: int, local_count: int) -> int:
        """The global position reached once ``rank`` has taken its first ``local_count`` positions.

        Ranks move in lockstep, so after j local positions the run as a whole is at s + j*W. A rank
        that has taken its whole share reports the epoch's end: under ``uneven`` the longer ranks take
        their last position in the same step, so every rank reports the same end. Nothing taken is
        the segment's start, even on a rank with no positions in it.
        """
        if local_count >= self.local_length(rank) and local_count > 0:
            return self.length
        return self.segment_start + local_count * self.world_size

    def global_positions(self, rank: int, local_start: int, local_stop: int) -> np.ndarray:
        """Global positions of ``rank``'s local indices [local_start, local_stop) of the segment."""
        local = np.arange(local_start, local_stop, dtype=np.int64)
        return local * self.world_size + (self.segment_start + rank)

    def pass_offsets(self, positions: np.ndarray) -> np.ndarray:
        """Stream positions behind global positions, relative to the start of the epoch's own pass
        (negative for carry's remainder of earlier passes); ``pad`` wraps onto its pass's start."""
        # Only the last round of ranks wraps; skipping the per-element modulo elsewhere saves a
        # noticeable share of iteration time (docs/performance.md).
        if self.tail is Tail.PAD and positions.size and int(positions.max()) >= self.size > 0:
            return positions % self.size
        offset = self.stream_start - self.epoch * self.size
        return positions + offset if offset else positions

    def is_padding(self, positions: np.ndarray) -> np.ndarray:
        """Which global positions repeat a record only to even out the ranks."""
        return positions >= self.size if self.tail is Tail.PAD else np.zeros(positions.shape, dtype=bool)

    def pads(self, rank: int, local_start: int, local_stop: int) -> bool:
        """Whether ``rank``'s local indices [local_start, local_stop) hold a padding repeat: ``is_padding``
        without its arrays, for a caller that marks padding only where there is some."""
        last = self.segment_start + rank + (local_stop - 1) * self.world_size
        return self.tail is Tail.PAD and local_stop > local_start and last >= self.size

    def unused_offsets(self) -> range:
        """Pass-relative stream positions of the epoch's own permutation that it does not take:
        ``drop`` cuts them for good, ``carry`` hands them to the next epoch (all of them when a global
        batch exceeds N)."""
        if self.tail not in (Tail.DROP, Tail.CARRY):
            return range(0)
        end = self.stream_start - self.epoch * self.size + self.length
        return range(end, max(end, self.size))


def _remaining(
    tail: Tail, size: int, world_size: int, epoch: int, global_batch: int, carry_start: int, segment_start: int
) -> int:
    """Global positions the ranks take from ``segment_start`` to the epoch's end."""
    if tail is Tail.CARRY:
        left_in_pass = (epoch + 1) * size - carry_start - segment_start
        return global_batch * (max(0, left_in_pass) // global_batch)
    records = max(0, size - segment_start)
    if tail is Tail.PAD:
        return -(-records // world_size) * world_size
    if tail is Tail.DROP:
        return records // world_size * world_size
    return records
