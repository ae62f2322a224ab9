"""The two choices every order makes besides its strategy: the tail policy and the permutation."""

from __future__ import annotations

from enum import Enum


class Tail(str, Enum):
    """What happens to the positions that do not fill the last round of W ranks."""

    PAD = "pad"  # wrap around to ceil(L/W)*W; the repeats are marked as padding
    DROP = "drop"  # truncate to floor(L/W)*W; the cut records are reported
    UNEVEN = "uneven"  # every position exactly once; ranks differ by at most one (evaluation)
    CARRY = "carry"  # whole global batches only; the remainder rolls into the next epoch


class Order(str, Enum):
    """The uniform strategy's permutation."""

    FAST = "fast"  # O(block) Feistel bijection, no O(N) array
    TORCH = "torch"  # exactly DistributedSampler's randperm(generator seeded with seed + epoch)
