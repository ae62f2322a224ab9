"""The measured cases. Each runs in a fresh subprocess (see ``child``) and returns its figures;
``seconds`` is wall time of the measured part only, set-up excluded."""

from __future__ import annotations

import json
import pickle
from collections import deque
from collections.abc import Callable
from itertools import islice
from statistics import median
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from benchmarks.workloads import (
    BATCH,
    OURS,
    PLAIN_LOADER,
    STATEFUL_LOADER,
    SkippedBatches,
    TrivialDataset,
    check_torchdata_state_at,
    random_batches,
    torchdata_state_at,
)
from stateful_sampler import StatefulSampler
from stateful_sampler.order.permutation import FeistelPermutation

Result = dict[str, Any]
FEISTEL_BLOCK = 1 << 14  # the block the sampler streams in (sampler._MAX_BLOCK)


def _timed(action: Callable[..., Any], *args: Any) -> float:
    start = perf_counter()
    action(*args)
    return perf_counter() - start


def _drain(iterable: Any) -> None:
    deque(iterable, maxlen=0)


def _drain_new(build: Callable[[], Any]) -> None:
    _drain(build())


# -- resume latency: load a state at N/2, then the first batch


def resume_ours(size: int, workers: int, repeats: int) -> Result:
    """Resume at N/2 and, beside it, a fresh epoch of the same loader: with workers, their
    start-up is the floor either way. Run in adjacent pairs (alternating which goes first), so a
    burst of machine load hits both sides of a pair; medians, and the median ratio of the pairs."""
    half = size // 2 // BATCH
    state = StatefulSampler(size, batch_size=BATCH).state_dict(consumed_batches=half)

    def first_batch(saved: dict[str, Any] | None) -> None:
        sampler = StatefulSampler(size, batch_size=BATCH)
        if saved is not None:
            sampler.load_state_dict(saved)
        next(iter(DataLoader(TrivialDataset(size), batch_size=BATCH, sampler=sampler, num_workers=workers)))

    times: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(repeats):
        for resume in (True, False) if repeat % 2 else (False, True):
            times[resume].append(_timed(first_batch, state if resume else None))
    return {
        "seconds": median(times[True]),
        "fresh_epoch_seconds": median(times[False]),
        "paired_ratio": median(resumed / fresh for resumed, fresh in zip(times[True], times[False])),
        "position": state["position"],
    }


def resume_torchdata(size: int, workers: int) -> Result:
    from torchdata.stateful_dataloader import StatefulDataLoader

    check_torchdata_state_at(workers)

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(TrivialDataset(size), batch_size=BATCH, shuffle=True, num_workers=workers)

    started = loader()
    next(iter(started))
    state = torchdata_state_at(started.state_dict(), size // 2 // BATCH)
    del started

    def resume() -> None:
        resumed = loader()
        resumed.load_state_dict(state)
        next(iter(resumed))

    return {"seconds": _timed(resume)}


def resume_skip_loop(size: int, workers: int) -> Result:
    def resume() -> None:
        batches = SkippedBatches(random_batches(size), size // 2 // BATCH)
        next(iter(DataLoader(TrivialDataset(size), batch_sampler=batches, num_workers=workers)))

    return {"seconds": _timed(resume)}


# -- one epoch of order: memory held and time taken


def epoch_ours(size: int) -> Result:
    return {"seconds": _timed(lambda: _drain(StatefulSampler(size))), "indices": size}


def epoch_distributed(size: int, limit: int | None = None) -> Result:
    """``limit`` stops after that many indices: the whole order is built before the first one."""
    sampler = DistributedSampler(TrivialDataset(size), num_replicas=1, rank=0)
    return {"seconds": _timed(lambda: _drain(islice(sampler, limit))), "indices": limit or size}


def order_randperm(size: int) -> Result:
    return {"seconds": _timed(lambda: torch.randperm(size)), "indices": size}


def order_feistel_blocks(size: int) -> Result:
    """The bare block generator: the whole epoch's order in blocks of 2^14 positions."""
    permutation = FeistelPermutation(size, 0, 0)

    def generate() -> None:
        for start in range(0, size, FEISTEL_BLOCK):
            permutation(np.arange(start, min(start + FEISTEL_BLOCK, size), dtype=np.int64))

    return {"seconds": _timed(generate), "indices": size}


# -- sampler throughput, all systems interleaved in one process so load noise hits them alike

THROUGHPUT_SYSTEMS: dict[str, Callable[[int], Any]] = {
    OURS: lambda size: StatefulSampler(size),
    "RandomSampler": lambda size: RandomSampler(TrivialDataset(size), generator=torch.Generator().manual_seed(0)),
    "DistributedSampler": lambda size: DistributedSampler(TrivialDataset(size), num_replicas=1, rank=0),
}


def throughput(size: int, repeats: int) -> Result:
    samplers = {name: build(size) for name, build in THROUGHPUT_SYSTEMS.items()}
    batched = {name: float("inf") for name in samplers}
    bare = dict(batched)
    for _ in range(repeats):
        for name, sampler in samplers.items():
            batched[name] = min(batched[name], _timed(_drain, BatchSampler(sampler, BATCH, False)))
            bare[name] = min(bare[name], _timed(_drain, sampler))
    return {"batched_seconds": batched, "indices_seconds": bare, "indices": size}


# -- DataLoader overhead per batch on a trivial dataset, interleaved likewise


def _loaders(size: int, workers: int) -> dict[str, Callable[[], Any]]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = TrivialDataset(size)
    return {
        OURS: lambda: DataLoader(dataset, batch_size=BATCH, sampler=StatefulSampler(size), num_workers=workers),
        PLAIN_LOADER: lambda: DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers),
        STATEFUL_LOADER: lambda: StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers),
    }


def loader_overhead(size: int, workers: int, repeats: int) -> Result:
    """Medians per system, and per round the ratio of ours to each anchor (the systems of a round
    run back to back, in an order that rotates, so a burst of load hits them alike)."""
    loaders = list(_loaders(size, workers).items())
    batches = -(-size // BATCH)
    rounds: list[dict[str, float]] = []
    for repeat in range(repeats):
        rotated = loaders[repeat % len(loaders) :] + loaders[: repeat % len(loaders)]
        rounds.append({name: _timed(_drain_new, build) / batches for name, build in rotated})
    return {
        "seconds_per_batch": {name: median(times[name] for times in rounds) for name, _ in loaders},
        "ours_over": {
            name: median(times[OURS] / times[name] for times in rounds) for name, _ in loaders if name != OURS
        },
    }


# -- state size


def state_sizes(sizes: list[int]) -> Result:
    from torchdata.stateful_dataloader import StatefulDataLoader

    ours = {}
    for size in sizes:
        sampler = StatefulSampler(size, batch_size=BATCH)
        ours[str(size)] = len(json.dumps(sampler.state_dict(consumed_batches=size // 2 // BATCH)))
    loader = StatefulDataLoader(TrivialDataset(10**6), batch_size=BATCH, shuffle=True)
    next(iter(loader))
    return {"ours_json_bytes": ours, "torchdata_pickle_bytes": len(pickle.dumps(loader.state_dict()))}


CASES: dict[str, Callable[..., Result]] = {
    function.__name__: function
    for function in (
        resume_ours,
        resume_torchdata,
        resume_skip_loop,
        epoch_ours,
        epoch_distributed,
        order_randperm,
        order_feistel_blocks,
        throughput,
        loader_overhead,
        state_sizes,
    )
}
