"""Per-record randomness for ``ShardedStream`` transforms, seeded from the record's key.

A stream's transform runs in whichever worker of whichever rank delivers the record, and a resume
may change both; a transform that draws from the process's RNGs therefore draws other numbers after
a resume. Seeded from (seed, epoch, index) instead, as ``SeededDataset`` seeds a map-style sample,
a record draws the same augmentation whoever delivers it and when. A padding repeat has its
record's key words, so it draws the same augmentation too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateful_sampler.checks import check_int
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.mixing import Domain, derive_seed, extend_seed
from stateful_sampler.seeding.generators import SampleRNG

_MAX_SEED = 2**63 - 1


class KeyedTransform:
    """``ShardedStream(..., transform=KeyedTransform(fn))`` calls ``fn(record, key)`` with the record's
    ``SampleKey`` (index, seed, epoch, position, is_padding)."""

    takes_key = True

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, record: Any, key: SampleKey) -> Any:
        return self.fn(record, key)


class SeededTransform(KeyedTransform):
    """``ShardedStream(..., transform=SeededTransform(fn))`` calls ``fn(record, rng)``, ``rng`` a ``SampleRNG``
    (``rng.numpy``, ``rng.torch``) seeded from (seed, epoch, record index): the same draws for a record
    after a resume at any worker count and world size.

    ``seed``: the augmentation's own seed in [0, 2**63); None takes the stream's. The record seed is the one
    ``SeededDataset`` gives the same (seed, epoch, index), so a record draws alike on either path.

    Example:
        >>> def augment(record, rng):  # doctest: +SKIP
        ...     return record["x"] + rng.numpy.normal()
        >>> stream = ShardedStream(paths, ParquetReader(), batch_size=32, transform=SeededTransform(augment))  # doctest: +SKIP
    """

    def __init__(self, fn: Callable[[Any, SampleRNG], Any], seed: int | None = None) -> None:
        super().__init__(fn)
        self.seed = None if seed is None else check_int("seed", seed, maximum=_MAX_SEED)
        self._prefix = (-1, -1, 0)  # (seed, epoch, derive_seed(Domain.SAMPLE, seed, epoch)) of the last key

    def record_seed(self, key: SampleKey) -> int:
        seed = key.seed if self.seed is None else self.seed
        prefix = self._prefix  # one read and one write of a tuple: threads never see half an update
        if prefix[:2] != (seed, key.epoch):
            prefix = self._prefix = (seed, key.epoch, derive_seed(Domain.SAMPLE, seed, key.epoch))
        return extend_seed(prefix[2], key.index)

    def __call__(self, record: Any, key: SampleKey) -> Any:
        return self.fn(record, SampleRNG(self.record_seed(key)))
