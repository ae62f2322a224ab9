"""``SeededDataset``: each sample's randomness seeded from (seed, epoch, index), whoever loads it and when."""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral
from typing import Any

import numpy as np

from stateful_sampler.checks import check_bool, check_int
from stateful_sampler.keys import KeyedDataset, SampleKey, require_key
from stateful_sampler.order.mixing import MASK64, Domain, derive_seed, extend_seed, sample_seeds
from stateful_sampler.seeding.generators import SampleRNG
from stateful_sampler.seeding.process_rngs import GLOBAL_RNGS, global_seeds, seeded_globals

_MAX_SEED = 2**63 - 1
_VECTOR_FROM = 8  # from about this many samples, deriving their seeds in NumPy beats a Python loop


class SeededDataset(KeyedDataset):
    """Seeds each sample's randomness from (seed, epoch, index), for ``StatefulSampler(..., yield_keys=True)``.

    Before a record loads, the ``global_rngs`` (Python ``random``, NumPy's global RNG and torch's CPU RNG) are
    seeded from the key, and afterwards put back as they were. A record therefore draws the same augmentation
    whichever worker, rank or resumed run loads it. If the wrapped dataset defines ``load_sample(index, rng)``,
    it is called with a ``SampleRNG`` (explicit ``rng.numpy`` and ``rng.torch`` generators) instead of
    ``dataset[index]``.

    ``seed``: the augmentation's own seed, in [0, 2**63); None takes the sampler's seed from each key. With
    its own seed, the order and the augmentation vary independently.

    ``global_rngs``: which process-wide RNGs to seed; each one costs time and confines loading to the main
    thread. ``global_rngs=()`` with ``load_sample`` seeds none, costs about 1 µs a sample and loads exactly
    from any thread.

    ``dataset[key]`` returns ``(sample, key)`` like ``KeyedDataset``, so the padding mask stays available. A
    padding repeat has its record's key words, so it draws the same augmentation.

    ``per_draw=True`` also folds in the key's ``position``: each draw of a record gets its own augmentation,
    for strategies that draw a record more than once in an epoch (``Weighted`` with replacement, ``Stratified``
    balanced), where (seed, epoch, index) alone would repeat it; a padding repeat then counts as a draw too.
    Positions are the epoch's, so under ``tail="carry"`` a resume with another global batch re-keys the draws
    of the epochs after it.
    """

    def __init__(
        self, dataset: Any, seed: int | None = None, *, global_rngs: Iterable[str] = GLOBAL_RNGS, per_draw: bool = False
    ) -> None:
        super().__init__(dataset)
        self.seed = None if seed is None else check_int("seed", seed, maximum=_MAX_SEED)
        self.per_draw = check_bool("per_draw", per_draw)
        self.global_rngs = _check_global_rngs(global_rngs, dataset)
        self._prefix = (-1, -1, 0)  # (seed, epoch, derive_seed(Domain.SAMPLE, seed, epoch)) of the last key

    def load(self, key: SampleKey) -> Any:
        return self._load([key])[0]

    def __getitems__(self, keys: list[Any]) -> list[tuple[Any, SampleKey]]:
        """A batch at once (the ``DataLoader`` fetcher calls this): the seeds are derived together and the
        caller's RNG states saved and restored once."""
        keys = [require_key(key, type(self).__name__) for key in keys]
        return list(zip(self._load(keys), keys))

    def _load(self, keys: list[SampleKey]) -> list[Any]:
        seeds = self._sample_seeds(keys)
        load_sample = getattr(self.dataset, "load_sample", None)
        if not self.global_rngs:
            return [load_sample(key.index, SampleRNG(seed)) for key, seed in zip(keys, seeds)]  # type: ignore[misc]
        samples = []
        plan = global_seeds(np.array(seeds, dtype=np.uint64), "torch" in self.global_rngs)
        with seeded_globals(self.global_rngs, plan) as seed_sample:
            for i, key in enumerate(keys):
                seed_sample(i)
                index = key.index
                samples.append(self.dataset[index] if load_sample is None else load_sample(index, SampleRNG(seeds[i])))
        return samples

    def _sample_seeds(self, keys: list[SampleKey]) -> list[int]:
        seeds = self._record_seeds(keys)
        if not self.per_draw:
            return seeds
        return [extend_seed(seed, _check_key_field("position", key.position)) for seed, key in zip(seeds, keys)]

    def _record_seeds(self, keys: list[SampleKey]) -> list[int]:
        words = [self._words(key) for key in keys]
        if len(words) >= _VECTOR_FROM:
            seed, epoch, index = np.array(words, dtype=np.uint64).T
            return sample_seeds(seed, epoch, index).tolist()
        seeds = []
        for seed, epoch, index in words:  # the keys of a pass share (seed, epoch): derive that prefix once
            prefix = self._prefix  # one read and one write of a tuple: threads never see half of an update
            if prefix[:2] != (seed, epoch):
                prefix = self._prefix = (seed, epoch, derive_seed(Domain.SAMPLE, seed, epoch))
            seeds.append(extend_seed(prefix[2], index))
        return seeds

    def _words(self, key: SampleKey) -> tuple[int, int, int]:
        """(seed, epoch, index) of a key, as checked ints."""
        seed = key.seed if self.seed is None else self.seed
        epoch, index = key.epoch, key.index
        if type(seed) is type(epoch) is type(index) is int and (
            0 <= min(seed, epoch, index) and max(seed, epoch, index) <= MASK64
        ):
            return seed, epoch, index
        index = _check_key_field("index", index)  # in the key's order, so a collated batch names its index
        return _check_key_field("seed", seed), _check_key_field("epoch", epoch), index


def _check_key_field(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"SeededDataset needs a SampleKey of ints, got SampleKey.{name} = {type(value).__name__} {value!r}: a "
            f"collated batch of keys (the default collate makes each field a tensor) is not a key. Pass the "
            f"sampler's keys one by one, as DataLoader(dataset, sampler=sampler) does; to rebuild one key from a "
            f"batch, take int(...) of each field"
        )
    value = int(value)
    if not 0 <= value <= MASK64:
        raise ValueError(f"SampleKey.{name} must lie in [0, 2**64), got {value}")
    return value


def _check_global_rngs(names: Iterable[str], dataset: Any) -> frozenset[str]:
    if isinstance(names, str):
        names = (names,)
    chosen = frozenset(names)
    unknown = sorted(map(repr, chosen - set(GLOBAL_RNGS)))
    if unknown:
        raise ValueError(f"global_rngs must name some of {list(GLOBAL_RNGS)}, got {', '.join(unknown)}")
    if not chosen and not hasattr(dataset, "load_sample"):
        raise ValueError(
            f"global_rngs=() seeds nothing for {type(dataset).__name__}, which has no load_sample(index, rng): "
            f"define load_sample to draw from the sample's generators, or keep the global RNGs seeded"
        )
    return chosen
