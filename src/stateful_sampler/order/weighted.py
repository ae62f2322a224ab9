"""``Weighted``: records drawn in proportion to their weights, each position a pure function of (seed, pass, position).

With replacement (torch's ``WeightedRandomSampler``): position p of pass e draws from one 64-bit counter
``u = mix64(p ^ key(seed, e))``, split by ``divmod(u, N)`` into a column and a uniform, and resolved by an
alias table (Vose) built once at construction in O(N). Any block of positions costs O(block): no pass set-up,
so a resume anywhere is O(1).

Without replacement: Efraimidis–Spirakis, the pass's order is the records sorted by ``E_i / w_i`` (compared
as logarithms), with ``E_i = -log(u_i)`` exponential from ``u_i = mix64(i ^ key)``; its first ``num_samples``
records are a weighted sample without replacement in the order drawn. The sort is the pass's set-up,
O(N log N) once per pass (seconds at N = 10^7, one int per record held while the pass is read); a resume
pays it once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stateful_sampler.checks import check_bool, check_optional_int
from stateful_sampler.order.mixing import Domain, derive_seed, mix64_array
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.strategy import PassOrder, Strategy, check_length, weight_array

_TAG = 0x57474854  # "WGHT": this module's seeds
_TWO_TO_64 = 2.0**64


class Weighted(Strategy):
    """Records drawn with probability proportional to ``weights`` (one per record).

    ``num_samples``: positions per pass (default: N with replacement; the records of positive weight
    without). ``replacement=False`` draws each record at most once per pass, so ``num_samples`` is at most
    the count of positive weights.
    """

    name = "weighted"

    def __init__(self, weights: Any, *, num_samples: int | None = None, replacement: bool = True) -> None:
        self.weights = weight_array("weights", weights)
        self.replacement = check_bool("replacement", replacement)
        self.num_samples = check_optional_int("num_samples", num_samples, minimum=1, maximum=MAX_SIZE - 1)
        positive = int(np.count_nonzero(self.weights))
        if not self.replacement and self.num_samples is not None and self.num_samples > positive:
            raise ValueError(
                f"num_samples must be at most {positive}, the records of positive weight, without replacement; "
                f"got {self.num_samples}"
            )
        self._positive = positive
        self._prob: np.ndarray | None
        self._alias: np.ndarray | None
        self._prob, self._alias = alias_table(self.weights) if self.replacement else (None, None)

    def __repr__(self) -> str:
        return f"Weighted({len(self.weights)} weights, num_samples={self.num_samples}, replacement={self.replacement})"

    def check(self, size: int) -> None:
        check_length("weights", self.weights, size)

    def pass_length(self, size: int, pass_index: int) -> int:
        if self.num_samples is not None:
            return self.num_samples
        return size if self.replacement else self._positive

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        key = derive_seed(Domain.PERMUTATION, seed, _TAG, pass_index)
        if self.replacement:
            return _AliasDraws(self._prob, self._alias, key)  # type: ignore[arg-type]
        order = _weighted_permutation(self.weights, key, self.pass_length(size, pass_index))
        return lambda positions: order[positions].astype(np.int64)

    def _identity(self) -> tuple[Any, ...]:
        return (self.weights, self.num_samples, self.replacement)


class _AliasDraws:
    """One pass's draws with replacement: O(1) per position, no set-up."""

    __slots__ = ("_alias", "_key", "_prob", "_size")

    def __init__(self, prob: np.ndarray, alias: np.ndarray, key: int) -> None:
        self._prob, self._alias, self._key, self._size = prob, alias, key, np.uint64(len(prob))

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        words = np.asarray(positions, dtype=np.int64).view(np.uint64)
        counters = mix64_array(words, self._key, np.empty_like(words))
        # The quotient and the remainder of one 64-bit draw are independent up to N / 2**64.
        quotient, column = np.divmod(counters, self._size)
        uniform = quotient.astype(np.float64) * (float(self._size) / _TWO_TO_64)
        column = column.astype(np.int64)
        return np.where(uniform < self._prob[column], column, self._alias[column]).astype(np.int64, copy=False)


def alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table in O(N), vectorised: column i keeps record i with probability ``prob[i]`` and
    gives the rest to ``alias[i]``, so a uniform column and a uniform threshold draw record j with
    probability ``weights[j] / sum(weights)``.

    This is Vose's pairing in a fixed order (the small columns first, then the large ones as each falls
    below 1), computed from prefix sums instead of a loop: the large columns give their surplus in turn,
    small column i is filled by the first large column whose cumulative surplus reaches the deficit before
    i, and a large column that gave more than its surplus is itself filled by the next large column.
    """
    size = len(weights)
    scaled = weights / weights.max()  # first to at most 1: a sum of huge weights would overflow, of tiny ones underflow
    scaled *= size / scaled.sum()
    index_type = np.int32 if size < 2**31 else np.int64
    prob = np.ones(size)
    alias = np.arange(size, dtype=index_type)
    small = np.flatnonzero(scaled < 1.0)
    large = np.flatnonzero(scaled >= 1.0)
    if not small.size or not large.size:
        return prob, alias  # all columns full (equal weights, up to rounding)
    deficit = np.cumsum(1.0 - scaled[small])  # after each small column
    surplus = np.cumsum(scaled[large] - 1.0)  # after each large column
    before = np.concatenate(([0.0], deficit[:-1]))  # the same floats as ``deficit``: the two searches agree
    donor = np.minimum(np.searchsorted(surplus, before, side="left"), large.size - 1)
    prob[small] = scaled[small]
    alias[small] = large[donor]
    # Large column k stops giving at the first small column whose cumulative deficit passes its cumulative
    # surplus; what it gave beyond its surplus comes from large column k + 1.
    stop = np.searchsorted(deficit, surplus[:-1], side="right")
    stops = np.flatnonzero(stop < small.size)
    prob[large[stops]] = np.clip(1.0 - (deficit[stop[stops]] - surplus[stops]), 0.0, 1.0)  # rounding: -1e-16
    alias[large[stops]] = large[stops + 1]
    return prob, alias


def _weighted_permutation(weights: np.ndarray, key: int, length: int) -> np.ndarray:
    """The first ``length`` records of one pass's Efraimidis–Spirakis order (records of zero weight sort last);
    a stable sort, so the rare equal keys tie by record and the order is the same on every platform."""
    records = np.arange(len(weights), dtype=np.uint64)
    counters = mix64_array(records, key, records)
    uniform = ((counters >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    with np.errstate(divide="ignore"):
        keys = np.log(-np.log(uniform)) - np.log(weights)  # log(E / w): no overflow for tiny weights; 0 -> inf
    order = np.argsort(keys, kind="stable")[:length]
    return order.astype(np.int32 if len(weights) < 2**31 else np.int64)
