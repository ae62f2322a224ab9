"""Issue 10: ``Weighted`` and ``Stratified`` per-index cost against torch's ``WeightedRandomSampler`` and plain
NumPy per-epoch implementations, resume at N/2, and peak memory against the user's own arrays.

Each case runs in a fresh interpreter (``python -m benchmarks.cases_strata CASE JSON``) so its peak RSS above
the post-import baseline is its own, as in ``benchmarks/child.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

import numpy as np

from benchmarks import isolated
from benchmarks import strategy_timing as timing
from benchmarks.strategy_timing import drain

CLASSES = 10


def _labels(size: int) -> np.ndarray:
    """Ten classes, geometric sizes (the largest about 512 times the smallest), shuffled."""
    shares = 2.0 ** -np.arange(CLASSES)
    counts = np.floor(size * shares / shares.sum()).astype(np.int64)
    counts[0] += size - counts.sum()
    labels = np.repeat(np.arange(CLASSES), counts)
    return np.random.default_rng(0).permutation(labels)


def _weights(labels: np.ndarray) -> np.ndarray:
    """Inverse class frequency: every class equally likely, the usual use of WeightedRandomSampler."""
    return 1.0 / np.bincount(labels)[labels]


def _strategy(name: str, labels: np.ndarray) -> Any:
    from stateful_sampler.order.stratified import Stratified
    from stateful_sampler.order.weighted import Weighted

    return {
        "weighted": lambda: Weighted(_weights(labels)),
        "weighted-no-replacement": lambda: Weighted(_weights(labels), replacement=False),
        "proportional": lambda: Stratified(labels),
        "balanced": lambda: Stratified(labels, mode="balanced", num_samples=len(labels)),
    }[name]()


def ours(size: int, strategy: str) -> dict[str, Any]:
    """Construction, then one whole epoch of indices through the sampler (its pass set-up included)."""
    from stateful_sampler import StatefulSampler

    labels = _labels(size)
    started = perf_counter()
    sampler = StatefulSampler(size, seed=1, strategy=_strategy(strategy, labels))
    built = perf_counter()
    count = drain(sampler)
    user = labels.nbytes * (2 if strategy.startswith("weighted") else 1)  # the float64 weights: 8 bytes a record too
    return {"construction_seconds": built - started, "seconds_per_index": (perf_counter() - built) / count,
            "user_mib": user / 2**20}  # fmt: skip


def anchor(size: int, system: str) -> dict[str, Any]:
    """One epoch of the anchors: torch's WeightedRandomSampler, or the NumPy per-epoch orders."""
    import torch
    from torch.utils.data import WeightedRandomSampler

    labels = _labels(size)
    epochs: dict[str, Callable[[], Iterable[int]]] = {
        "torch-weighted": lambda: WeightedRandomSampler(torch.from_numpy(_weights(labels)), size),
        "torch-weighted-no-replacement": lambda: WeightedRandomSampler(
            torch.from_numpy(_weights(labels)), size, replacement=False
        ),
        "numpy-proportional": lambda: numpy_proportional(labels, np.random.default_rng(1)).tolist(),
        "numpy-balanced": lambda: numpy_balanced(labels, size, np.random.default_rng(1)).tolist(),
    }
    started = perf_counter()
    count = drain(epochs[system]())
    return {"seconds_per_index": (perf_counter() - started) / count}


def numpy_proportional(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A per-epoch stratified order in plain NumPy: each class permuted, then interleaved by sorting every
    record on its class's ideal spacing (k + 1/2) / n_c (the midpoint order, no prefix guarantee)."""
    _classes, counts = np.unique(labels, return_counts=True)
    by_class = np.argsort(labels, kind="stable")
    starts = np.cumsum(counts) - counts
    shuffled = np.concatenate([rng.permutation(by_class[s : s + n]) for s, n in zip(starts, counts)])
    ranks = np.arange(len(labels)) - np.repeat(starts, counts)
    return shuffled[np.argsort((ranks + 0.5) / np.repeat(counts, counts), kind="stable")]


def numpy_balanced(labels: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """A per-epoch balanced order in plain NumPy: each class's draws from fresh permutations, one of each
    class per window of C positions, shuffled inside the window."""
    classes = np.unique(labels)
    windows = length // len(classes)
    columns = []
    for c in classes:
        records = np.flatnonzero(labels == c)
        laps = -(-windows // len(records))
        columns.append(np.concatenate([rng.permutation(records) for _ in range(laps)])[:windows])
    table = np.stack(columns, axis=1)
    return np.take_along_axis(table, np.argsort(rng.random(table.shape), axis=1), axis=1).ravel()


def resume(size: int, strategy: str, repeats: int = 5) -> dict[str, Any]:
    """``strategy_timing.resume`` of this figure's ``strategy``."""
    return timing.resume(size, _strategy(strategy, _labels(size)), repeats)


CASES: dict[str, Callable[..., dict[str, Any]]] = {"ours": ours, "anchor": anchor, "resume": resume}


def run(name: str, **params: Any) -> dict[str, Any]:
    """One case in a fresh interpreter; adds its peak RSS above the post-import baseline."""
    return isolated.run("benchmarks.cases_strata", name, params)


if __name__ == "__main__":
    isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
