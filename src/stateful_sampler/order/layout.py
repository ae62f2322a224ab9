"""Where each position of an epoch comes from, per tail policy, and how ranks share the epoch.

The data is one stream of permutations: pass p occupies stream positions [p*N, (p+1)*N) and
holds the permutation of pass p. An epoch is a run of *global positions* 0..length-1 mapped
onto that stream; rank r takes the global positions r, r+W, r+2W, ... (as torch's
DistributedSampler does), so a step of per-rank batch B consumes one contiguous block of B*W
global positions. Everything here is integer arithmetic: O(1) per question, whatever N is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np


class Tail(str, Enum):
    """What happens to the records that do not fill the last round of W ranks."""

    PAD = "pad"  # wrap around to ceil(N/W)*W; the repeats are marked as padding
    DROP = "drop"  # truncate to floor(N/W)*W; the cut records are reported
    UNEVEN = "uneven"  # every record exactly once; ranks differ by at most one (evaluation)
    CARRY = "carry"  # whole global batches only; the remainder rolls into the next epoch


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
    """One epoch of one policy: its length in global positions and their stream positions."""

    tail: Tail
    size: int
    world_size: int
    stream_start: int  # stream position of global position 0
    length: int
    pass_end: int  # stream position where the epoch's own permutation ends: (epoch + 1) * N

    @classmethod
    def build(
        cls, tail: Tail, size: int, world_size: int, epoch: int, global_batch: int, carry_start: int
    ) -> EpochLayout:
        if tail is Tail.CARRY:
            end = carry_epoch_start(size, global_batch, epoch + 1, epoch, carry_start)
            return cls(tail, size, world_size, carry_start, end - carry_start, (epoch + 1) * size)
        if tail is Tail.PAD:
            length = -(-size // world_size) * world_size
        elif tail is Tail.DROP:
            length = size // world_size * world_size
        else:
            length = size
        return cls(tail, size, world_size, epoch * size, length, (epoch + 1) * size)

    def local_length(self, rank: int) -> int:
        """How many positions rank ``rank`` takes in this epoch."""
        return max(0, -(-(self.length - rank) // self.world_size))

    def local_start(self, rank: int, position: int) -> int:
        """The first local index of ``rank`` at or after global ``position``."""
        return max(0, -(-(position - rank) // self.world_size))

    def position_after(self, rank: int, origin: int, local_stop: int) -> int:
        """The global position reached once ``rank`` has taken its local indices below ``local_stop``.

        Ranks move in lockstep, so after j local indices the run as a whole is at j*W; a pass that
        resumed from an ``origin`` between two such points never reports less than it started with.
        """
        return min(self.length, max(origin, local_stop * self.world_size))

    def global_positions(self, rank: int, local_start: int, local_stop: int) -> np.ndarray:
        """Global positions of ``rank``'s local indices [local_start, local_stop)."""
        local = np.arange(local_start, local_stop, dtype=np.int64)
        return local * self.world_size + rank

    def stream_positions(self, positions: np.ndarray) -> np.ndarray:
        """Stream positions behind global positions; ``pad`` wraps onto the start of its pass."""
        # Only the last round of ranks wraps; skipping the per-element modulo elsewhere saves a
        # noticeable share of iteration time (docs/performance.md).
        if self.tail is Tail.PAD and positions.size and int(positions.max()) >= self.size > 0:
            return self.stream_start + positions % self.size
        return self.stream_start + positions

    def is_padding(self, positions: np.ndarray) -> np.ndarray:
        """Which global positions repeat a record only to even out the ranks."""
        return positions >= self.size if self.tail is Tail.PAD else np.zeros(positions.shape, dtype=bool)

    def unused_stream(self) -> range:
        """Stream positions of the epoch's own permutation that it does not take: ``drop`` cuts them
        for good, ``carry`` hands them to the next epoch (all of them when a global batch exceeds N)."""
        return range(self.stream_start + self.length, max(self.stream_start + self.length, self.pass_end))
