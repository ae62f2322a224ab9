"""``seed_worker``: each DataLoader worker's randomness seeded from (seed, epoch, rank, worker id)."""

from __future__ import annotations

from numbers import Integral
from typing import Any, NamedTuple

from torch.utils.data import get_worker_info

from stateful_sampler.checks import check_int
from stateful_sampler.order.mixing import MASK64, worker_seed
from stateful_sampler.ranks import process_rank
from stateful_sampler.seeding.generators import seed_globals


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
            return WorkerSeeds(source, 0, process_rank())
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
