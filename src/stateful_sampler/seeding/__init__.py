"""Seeding the randomness of data loading, per DataLoader worker or per sample.

An exact data order is not enough: a resumed run must also draw the same crops, flips and noise.
PyTorch seeds worker ``w`` with ``base_seed + w``, where ``base_seed`` comes from the main process's
global RNG, and hands batch ``i`` to worker ``i mod W``; so worker draws neither survive a resume
nor line up across worker counts. Here every seed is derived from saved, structured words (see
``order.mixing``), and every generator depends on all 64 bits of its seed
(``seeding/generators.py``: which words of a seed each generator takes).

- ``seed_worker(sampler)``: each worker's generators are seeded from (seed, epoch, rank, worker id). Enough
  for an exact restart at an epoch boundary with the same worker count.
- ``SeededDataset(dataset)``: each sample's generators are seeded from (seed, epoch, index). Exact after a
  mid-epoch resume, and whatever the worker count or world size.
- ``capture_rng_states()`` / ``restore_rng_states(states)``: the process's own RNGs (torch CPU and CUDA,
  NumPy, ``random``), saved with the data so that a model's dropout resumes bitwise.
- ``SeededTransform(fn)``: the same for a ``ShardedStream`` transform, ``fn(record, rng)``.
"""

from stateful_sampler.seeding.dataset import SeededDataset
from stateful_sampler.seeding.generators import SampleRNG, seed_globals
from stateful_sampler.seeding.process_rngs import GLOBAL_RNGS, GlobalRNGThreadError
from stateful_sampler.seeding.snapshot import capture_rng_states, restore_rng_states
from stateful_sampler.seeding.stream_transform import KeyedTransform, SeededTransform
from stateful_sampler.seeding.worker import WorkerSeeder, WorkerSeeds, seed_worker

__all__ = [
    "GLOBAL_RNGS",
    "GlobalRNGThreadError",
    "KeyedTransform",
    "SampleRNG",
    "SeededDataset",
    "SeededTransform",
    "WorkerSeeder",
    "WorkerSeeds",
    "capture_rng_states",
    "restore_rng_states",
    "seed_globals",
    "seed_worker",
]
