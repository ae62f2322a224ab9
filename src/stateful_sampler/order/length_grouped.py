"""``LengthGrouped``: batches of records of similar length, to cut padding, as HF's ``LengthGroupedSampler``.

Each pass takes a uniform shuffle, cuts it into megabatches of ``megabatch`` global batches of
consecutive positions, and sorts every megabatch by length, longest first (stable: ties keep their
shuffled order). Every record appears once per pass, a position's record depends on its megabatch
only, so a resume sorts at most one megabatch, and a pass keeps its last few sorted megabatches.

Megabatches are counted in GLOBAL batches (per-rank batch times ranks), which the sampler it is given
to knows: ``LengthGrouped(lengths)`` takes B x W from ``StatefulSampler(..., batch_size=B)`` on W ranks
(``for_sampler``). A per-rank value passed by hand used to be accepted silently (on 8 ranks x 16,
51% of padded tokens were padding against 8.1%); an explicit ``batch_size=`` is now only for a sampler
without one, and one that contradicts the sampler's B x W is refused naming both. Rank r takes positions r, r + W, ..., so the ranks' batches of
one step are strided slices of one global batch, which lies in one sorted megabatch: every rank's batch
of a step has similar lengths. It shapes the order, so it is in the fingerprint: an elastic resume keeps
the order when it keeps the global batch (2 ranks x 4 -> 4 ranks x 2).

``longest_first=True`` puts the dataset's longest record at position 0 of every pass (the others are
shuffled around it), so the first step holds the longest batch and an out-of-memory error surfaces at
once, as HF does by swapping the longest record to the front.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

from stateful_sampler.checks import check_bool, check_int, check_optional_int
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.strategy import PassOrder, Strategy, check_length, id_array

_TAG = 0x4C454E47  # "LENG": this module's seeds
_KEPT = 4  # sorted megabatches a pass keeps: a block of positions spans a few of them


class LengthGrouped(Strategy):
    """Each pass: a shuffle whose megabatches of ``megabatch * batch_size`` positions are sorted by length.

    Args:
        lengths: one length (a non-negative integer, e.g. tokens) per record.
        batch_size: the global batch; leave it out to take B x W from the sampler (only a sampler
            without ``batch_size`` needs it, and a contradicting value is refused).
        megabatch: global batches per megabatch (HF's ``mega_batch_mult``); 1 sorts each batch alone.
        longest_first: the dataset's longest record at position 0 of every pass.
    """

    name = "length-grouped"

    def __init__(
        self, lengths: Any, *, batch_size: int | None = None, megabatch: int = 50, longest_first: bool = False
    ) -> None:
        self.lengths = id_array("lengths", lengths)
        self.batch_size = check_optional_int("batch_size", batch_size, minimum=1)
        self.megabatch = check_int("megabatch", megabatch, minimum=1)
        self.longest_first = check_bool("longest_first", longest_first)
        self._digest = hashlib.blake2b(self.lengths.tobytes(), digest_size=16).hexdigest()  # hashed once
        self.longest = int(np.argmax(self.lengths)) if self.lengths.size else 0

    def __repr__(self) -> str:
        first = ", longest_first=True" if self.longest_first else ""
        options = f"batch_size={self.batch_size}, megabatch={self.megabatch}{first}"
        return f"LengthGrouped(<{len(self.lengths)} lengths>, {options})"

    @property
    def span(self) -> int:
        """Positions per megabatch."""
        if self.batch_size is None:
            raise ValueError(
                "LengthGrouped needs the global batch: give its sampler batch_size=B (or batch_size= here)"
            )
        return self.megabatch * self.batch_size

    def for_sampler(self, batch_size: int | None, world_size: int) -> LengthGrouped:
        """Take the global batch B x W from the sampler; refuse an explicit ``batch_size`` that contradicts it."""
        if batch_size is None:
            if self.batch_size is None:
                raise ValueError(
                    "LengthGrouped groups by global batch: give the sampler batch_size=B (the per-rank batch), "
                    "or LengthGrouped(batch_size=...) for a sampler without one"
                )
            return self
        global_batch = batch_size * world_size
        if self.batch_size is None:
            bound = copy.copy(self)
            bound.__dict__.pop("_fingerprint", None)
            bound.batch_size = global_batch
            return bound
        if self.batch_size != global_batch:
            raise ValueError(
                f"LengthGrouped(batch_size={self.batch_size}) contradicts the sampler's global batch "
                f"batch_size={batch_size} x {world_size} ranks = {global_batch}: leave batch_size out of "
                f"LengthGrouped, it takes the global batch from the sampler"
            )
        return self

    def check(self, size: int) -> None:
        check_length("lengths", self.lengths, size)

    def pass_length(self, size: int, pass_index: int) -> int:
        return size

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        return _LengthGroupedPass(self, size, derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index))

    def _identity(self) -> tuple[Any, ...]:
        return (self._digest, len(self.lengths), self.batch_size, self.megabatch, self.longest_first)


class _LengthGroupedPass:
    """One pass: the shuffle, and its sorted megabatches as they are asked for."""

    def __init__(self, strategy: LengthGrouped, size: int, pass_seed: int) -> None:
        self._strategy = strategy
        self._size = size
        rest = size - 1 if strategy.longest_first and size else size
        self._shuffle = FeistelPermutation(rest, pass_seed, 0)
        self._sorted: OrderedDict[int, np.ndarray] = OrderedDict()

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        span = self._strategy.span
        megabatches, inside = np.divmod(positions, span)
        first, last = int(megabatches.min(initial=0)), int(megabatches.max(initial=0))
        if first == last:
            return self._megabatch(first)[inside]
        records = np.empty_like(positions)
        for megabatch in np.unique(megabatches):
            at = megabatches == megabatch
            records[at] = self._megabatch(int(megabatch))[inside[at]]
        return records

    def _megabatch(self, index: int) -> np.ndarray:
        """Megabatch ``index``'s records, longest first; ties keep their shuffled order."""
        records = self._sorted.get(index)
        if records is None:
            span = self._strategy.span
            shuffled = self._shuffled(np.arange(index * span, min((index + 1) * span, self._size), dtype=np.int64))
            records = shuffled[np.argsort(-self._strategy.lengths[shuffled], kind="stable")]
            self._sorted[index] = records
            if len(self._sorted) > _KEPT:
                self._sorted.popitem(last=False)
        return records

    def _shuffled(self, positions: np.ndarray) -> np.ndarray:
        """The uniform order, or with ``longest_first`` the longest record then the others shuffled."""
        strategy = self._strategy
        if not strategy.longest_first:
            return self._shuffle(positions)
        if not self._shuffle.size:  # the longest record is the only one
            return np.full_like(positions, strategy.longest)
        others = self._shuffle(np.maximum(positions - 1, 0))
        others += others >= strategy.longest
        return np.where(positions == 0, strategy.longest, others)
