"""Per-sample cost of ``SeededDataset`` (issue 14): what seeding adds to each sample a DataLoader fetches.

Every system fetches the same keys through a ``DataLoader(num_workers=0)`` whose collate returns the list
as it is, so the figure is the dataset side of a fetch (collating keys into tensors costs the same with or
without seeding). Systems are timed in interleaved rounds, so a burst of machine load hits all of them;
each figure is the best round (on a shared machine, the closest to the cost itself), with the median beside it. ``python -m benchmarks.cases_seeding`` prints the result as JSON.
"""

from __future__ import annotations

import json
import random
import sys
from collections import deque
from collections.abc import Callable
from statistics import median
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import isolated
from stateful_sampler import KeyedDataset, SampleRNG, StatefulSampler
from stateful_sampler.seeding import SeededDataset

SIZE = 4096
PLAIN = "plain dataset"
KEYED = "KeyedDataset"
SEEDED = "ours: SeededDataset, default (seeds random, NumPy, torch)"
SEEDED_TORCH = "ours: SeededDataset(global_rngs=('torch',))"
GENERATORS = "ours: SeededDataset(global_rngs=()), load_sample only"
GENERATORS_TORCH = "ours: SeededDataset(global_rngs=()), load_sample building rng.torch"
GENERATORS_NUMPY = "ours: SeededDataset(global_rngs=()), load_sample building rng.numpy"


class Cheap(Dataset):
    """A sample that costs almost nothing, so the wrapper's cost is what shows."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> int:
        return index

    def load_sample(self, index: int, rng: SampleRNG) -> int:
        return index


class CheapTorch(Cheap):
    def load_sample(self, index: int, rng: SampleRNG) -> Any:
        return rng.torch


class CheapNumpy(Cheap):
    def load_sample(self, index: int, rng: SampleRNG) -> Any:
        return rng.numpy


def _systems() -> dict[str, tuple[Dataset, bool]]:
    """Each system's dataset, and whether its sampler yields keys."""
    return {
        PLAIN: (Cheap(), False),
        KEYED: (KeyedDataset(Cheap()), True),
        SEEDED: (SeededDataset(Cheap()), True),
        SEEDED_TORCH: (SeededDataset(Cheap(), global_rngs=("torch",)), True),
        GENERATORS: (SeededDataset(Cheap(), global_rngs=()), True),
        GENERATORS_TORCH: (SeededDataset(CheapTorch(), global_rngs=()), True),
        GENERATORS_NUMPY: (SeededDataset(CheapNumpy(), global_rngs=()), True),
    }


def _as_is(batch: list[Any]) -> list[Any]:
    return batch


def _fetch_all(dataset: Dataset, keys: bool, batch: int | None) -> Callable[[], None]:
    sampler = StatefulSampler(SIZE, seed=1, yield_keys=keys, batch_size=batch)
    loader = DataLoader(dataset, sampler=sampler, batch_size=batch, collate_fn=_as_is)
    return lambda: deque(loader, maxlen=0)


def per_sample_overhead(batch: int | None = 64, rounds: int = 7) -> dict[str, Any]:
    """µs per sample of each system, fetched in batches of ``batch`` (None: one ``dataset[key]`` at a time),
    and each one's overhead over ``KeyedDataset``."""
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    fetches = {name: _fetch_all(dataset, keys, batch) for name, (dataset, keys) in _systems().items()}
    times: dict[str, list[float]] = {name: [] for name in fetches}
    for fetch in fetches.values():  # warm up: caches, first-use checks, the spare bit generator
        fetch()
    for round_ in range(rounds):
        order = list(fetches) if round_ % 2 else list(reversed(fetches))
        for name in order:
            start = perf_counter()
            fetches[name]()
            times[name].append((perf_counter() - start) / SIZE * 1e6)
    micros = {name: min(values) for name, values in times.items()}
    return {
        "batch": batch,
        "us_per_sample": micros,
        "us_per_sample_median": {name: median(values) for name, values in times.items()},
        "us_over_keyed": {name: value - micros[KEYED] for name, value in micros.items() if name not in (PLAIN, KEYED)},
    }


def per_sample_overhead_fresh(batch: int | None, rounds: int) -> dict[str, Any]:
    """``per_sample_overhead`` in a fresh interpreter, as every benchmark case runs."""
    return isolated.run("benchmarks.cases_seeding", "per_sample_overhead", {"batch": batch, "rounds": rounds})


CASES = {"per_sample_overhead": per_sample_overhead}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in CASES:
        isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
    else:
        print(json.dumps(per_sample_overhead(*(json.loads(arg) for arg in sys.argv[1:]))))
