"""Seeding the randomness of data loading, per DataLoader worker or per sample.

An exact data order is not enough: a resumed run must also draw the same crops, flips and noise.
PyTorch seeds worker ``w`` with ``base_seed + w``, where ``base_seed`` comes from the main process's
global RNG, and hands batch ``i`` to worker ``i mod W``; so worker streams neither survive a resume
nor line up across worker counts. Here every seed is derived from saved, structured words (see
``order.mixing``), and every stream depends on all 64 bits of its seed.

- ``seed_worker(sampler)``: each worker's streams come from (seed, epoch, rank, worker id). Enough
  for an exact restart at an epoch boundary with the same worker count.
- ``SeededDataset(dataset)``: each sample's streams come from (seed, epoch, index). Exact after a
  mid-epoch resume, and whatever the worker count or world size.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from functools import cache, cached_property
from numbers import Integral
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Generator as TorchGenerator
from torch.utils.data import get_worker_info

from stateful_sampler.checks import check_int
from stateful_sampler.keys import KeyedDataset, SampleKey
from stateful_sampler.order.mixing import MASK64, sample_seed, seed_words, worker_seed

_MT_WORDS = 624  # an MT19937 state, the generator behind random, NumPy's global RNG and torch's CPU RNG
# Each stream takes its own words of the seed's word stream, so no two of them share draws. Python
# and NumPy take 64 bits through their own array seeding; torch would keep only 32 bits of a seed,
# so its generators take a whole MT19937 state.
_PYTHON, _NUMPY = slice(0, 2), slice(2, 4)
_TORCH = slice(4, 4 + _MT_WORDS)
_TORCH_GENERATOR = slice(_TORCH.stop, _TORCH.stop + _MT_WORDS)
# torch's CPU generator state (``CPUGeneratorImplState``): the initial seed (u64), left (i32),
# seeded (i32), next (u64), the 624 MT19937 words (each as u64), then cached normals; 5056 bytes.
_TORCH_STATE_BYTES = 5056
_TORCH_SEED, _TORCH_WORDS = slice(0, 8), slice(24, 24 + 8 * _MT_WORDS)


def seed_globals(seed: int) -> None:
    """Seed Python ``random``, NumPy's global RNG and torch's CPU RNG from one 64-bit seed."""
    words = seed_words(seed, 0, _TORCH.stop)
    low, high = words[_PYTHON].tolist()
    random.seed(low | high << 32)
    np.random.seed(words[_NUMPY])
    torch.set_rng_state(_torch_state(seed, words[_TORCH]))


def _torch_state(seed: int, words: np.ndarray) -> torch.Tensor:
    """torch's CPU generator state holding ``words`` as its MT19937 state, due to twist at the next draw."""
    state = _torch_state_template().copy()
    state[_TORCH_SEED] = np.array([seed], dtype=np.uint64).view(np.uint8)  # torch.initial_seed() reports it
    state[_TORCH_WORDS] = words.astype(np.uint64).view(np.uint8)
    return torch.from_numpy(state)


@cache
def _torch_state_template() -> np.ndarray:
    """A freshly seeded torch CPU generator state: left = 1 and next = 0, so the words written into it
    are twisted at the first draw, as after ``manual_seed``. torch keeps this layout so that RNG states
    in old checkpoints still load; a torch that changed it gets a clear error, not wrong streams.
    """
    probe = 0x1234567
    generator = torch.Generator()
    generator.manual_seed(probe)
    state = generator.get_state().numpy().copy()
    expected = np.array([probe, 1 | 1 << 32, 0, probe], dtype=np.uint64)  # seed, (left, seeded), next, word 0
    if state.size != _TORCH_STATE_BYTES or not np.array_equal(state[:32].view(np.uint64), expected):
        raise RuntimeError(
            f"torch {torch.__version__} keeps its CPU RNG state in a layout stateful_sampler.seeding does not "
            f"know (expected {_TORCH_STATE_BYTES} bytes of MT19937 state, got {state.size}); please report it"
        )
    return state


@contextmanager
def _global_rng_preserved() -> Iterator[None]:
    """Put the global RNG states back afterwards, so a sample's seeding does not touch code outside it."""
    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)


class SampleRNG:
    """Explicit generators for one sample, for transforms that take a generator instead of the globals.

    Each is built on first use from the sample's 64-bit ``seed``, and draws a stream of its own,
    independent of the global streams seeded for the same sample.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @cached_property
    def numpy(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    @cached_property
    def torch(self) -> TorchGenerator:
        generator = TorchGenerator()
        words = seed_words(self.seed, _TORCH_GENERATOR.start, _TORCH_GENERATOR.stop)
        generator.set_state(_torch_state(self.seed, words))
        return generator


class SeededDataset(KeyedDataset):
    """Seeds each sample's randomness from (seed, epoch, index), for ``StatefulSampler(..., yield_keys=True)``.

    Before a record loads, Python ``random``, NumPy's global RNG and torch's CPU RNG are seeded from
    the key, and afterwards put back as they were. A record therefore draws the same augmentation
    whichever worker, rank or resumed run loads it. If the wrapped dataset defines
    ``load_sample(index, rng)``, it is called with a ``SampleRNG`` (explicit ``rng.numpy`` and
    ``rng.torch`` generators) instead of ``dataset[index]``.

    ``dataset[key]`` returns ``(sample, key)`` like ``KeyedDataset``, so the padding mask stays
    available. A padding repeat has its record's key words, so it draws the same augmentation.
    """

    def load(self, key: SampleKey) -> Any:
        rng = SampleRNG(sample_seed(key.seed, key.epoch, key.index))
        load_sample = getattr(self.dataset, "load_sample", None)
        with _global_rng_preserved():
            seed_globals(rng.seed)
            return self.dataset[key.index] if load_sample is None else load_sample(key.index, rng)


class WorkerSeeds(NamedTuple):
    """What a worker's seed is made of, besides its id, as the main process knew it at worker start."""

    seed: int
    epoch: int
    rank: int


class WorkerSeeder:
    """A picklable ``worker_init_fn`` seeding each worker from (seed, epoch, rank, worker id).

    Seed, epoch and rank are read from the sampler when the workers start (a spawned worker gets
    them pickled; a forked one copies the sampler as it was), never from the main process's RNG.
    """

    def __init__(self, source: Any) -> None:
        self._source = source

    def seeds(self) -> WorkerSeeds:
        source = self._source
        if isinstance(source, WorkerSeeds):
            return source
        if isinstance(source, int):
            return WorkerSeeds(source, 0, _process_rank())
        return WorkerSeeds(source.seed, source.epoch, source.rank)

    def __getstate__(self) -> dict[str, Any]:
        return {"_source": self.seeds()}

    def __call__(self, worker_id: int) -> None:
        seed, epoch, rank = self.seeds()
        seed_globals(worker_seed(seed, epoch, rank, worker_id))


def seed_worker(sampler_or_seed: Any) -> WorkerSeeder:
    """``DataLoader(..., worker_init_fn=seed_worker(sampler))``: seed each worker's ``random``, NumPy
    and torch from (seed, epoch, rank, worker id).

    ``sampler_or_seed`` is the loader's sampler (anything with ``seed``, ``epoch`` and ``rank``, such as
    ``StatefulSampler`` or ``DistributedSampler``), or an int seed for epoch 0 on this process's rank.

    Limits, because a worker only learns the epoch when it starts:
    - Set the epoch (``set_epoch`` / ``load_state_dict``) before ``iter(loader)``; Lightning restores a
      resumed sampler only after its workers start, so the resumed epoch's workers see a stale epoch.
    - ``persistent_workers=True``: workers start once and continue their streams into later epochs,
      deterministically, but a restart at a later epoch boundary starts fresh streams.
    - Batches go to workers round-robin, so a mid-epoch resume or another worker count shifts which
      worker draws for which sample.
    ``SeededDataset`` has none of these limits.
    """
    source = sampler_or_seed
    if isinstance(source, Integral) and not isinstance(source, bool):
        if get_worker_info() is not None:  # worker_init_fn=seed_worker: called with a worker id
            raise TypeError("seed_worker is a factory: pass worker_init_fn=seed_worker(sampler), not seed_worker")
        return WorkerSeeder(check_int("seed", source, maximum=MASK64))
    missing = [name for name in ("seed", "epoch", "rank") if not hasattr(source, name)]
    if missing:
        raise TypeError(
            f"seed_worker(sampler_or_seed) needs the loader's sampler (with seed, epoch and rank) or an int "
            f"seed, got {type(source).__name__} without {', '.join(missing)}"
        )
    return WorkerSeeder(source)


def _process_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
