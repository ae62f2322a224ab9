"""How the rest of an epoch is dealt to ranks and DataLoader workers. Pure integer arithmetic.

A pass starts at ``origin`` (0, or the saved position) and deals the remaining positions
origin, origin+1, ... round-robin to the W ranks: rank r takes origin + r + j*W for its local
index j. The tail evens the ranks out on what *remains*, so the ranks always take equally many
positions, even when a resume changes W mid-epoch:

- ``pad``: ceil(R/W)*W slots for the R remaining positions; slots past the end repeat the
  epoch's last records (mirrored: slot N+i repeats position N-1-i), marked as padding. The
  repeats lie in the last window, which the readers already hold.
- ``drop``: floor(R/W)*W slots; the last R mod W positions are not delivered this epoch.

With an unchanged W and a save at a step boundary (origin a multiple of W) this is exactly the
uninterrupted pass's layout. Inside a rank, local batch b (of ``batch_size`` local indices)
goes to worker b mod n: a ``DataLoader`` takes batches from its workers round-robin, so the
loop sees local batches 0, 1, 2, ... whatever n is, and n may change on resume.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.order.policies import Tail


@dataclass(frozen=True)
class StreamLayout:
    tail: Tail
    size: int  # N, the epoch's positions
    world_size: int
    origin: int  # the first position this pass deals

    @property
    def local_length(self) -> int:
        """Positions each rank takes from ``origin`` to the end of the epoch (equal on every rank)."""
        remaining = self.size - self.origin
        if self.tail is Tail.PAD:
            return -(-remaining // self.world_size)
        return remaining // self.world_size

    def position_after(self, local_count: int) -> int:
        """The epoch position reached once every rank has taken ``local_count`` local indices."""
        if local_count >= self.local_length:
            return self.size
        return self.origin + local_count * self.world_size

    def worker_locals(self, worker: int, workers: int, batch_size: int, start: int, stop: int) -> np.ndarray:
        """The local indices in [start, stop) that belong to ``worker``'s batches, ascending."""
        local = np.arange(start, stop, dtype=np.int64)
        return local[(local // batch_size) % workers == worker]

    def local_range(self, rank: int, first: int, last: int) -> tuple[int, int]:
        """Local indices of ``rank`` whose slots lie in [first, last), clipped to the pass."""
        begin = max(0, -(-(first - self.origin - rank) // self.world_size))
        end = max(0, -(-(last - self.origin - rank) // self.world_size))
        return min(begin, self.local_length), min(end, self.local_length)

    def slots(self, rank: int, local: np.ndarray) -> np.ndarray:
        """The epoch slots of ``rank``'s local indices; slots >= size are padding."""
        return self.origin + rank + local * self.world_size

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """The epoch position whose record fills each slot: padding mirrors back from the end."""
        padding = slots >= self.size
        if not padding.any():
            return slots
        mirrored = self.size - 1 - (slots - self.size) % self.size
        return np.where(padding, mirrored, slots)
