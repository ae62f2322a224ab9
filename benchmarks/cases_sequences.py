"""Issue 10: ``Grouped`` and ``Curriculum`` per-index cost against plain NumPy per-epoch orders (a group
permutation plus concat; a per-band permutation plus concat), resume at N/2, and peak memory against the
user's own arrays.

Each case runs in a fresh interpreter (``python -m benchmarks.cases_sequences CASE JSON``) so its peak RSS
above the post-import baseline is its own, as in ``benchmarks/child.py``.
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

MEAN_GROUP = 100  # sequences of 1..199 records, stored one after another
BANDS = 5


def _groups(size: int) -> np.ndarray:
    """Sequence ids, one per record: runs of 1..199 records (mean 100), in id order, as sequences are stored."""
    lengths = np.random.default_rng(0).integers(1, 2 * MEAN_GROUP, size=size // MEAN_GROUP * 2)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, size)) + 1
    return np.repeat(np.arange(count), np.diff(np.concatenate(([0], np.minimum(ends[:count], size)))))


def _bands(size: int) -> np.ndarray:
    """Five difficulty bands of equal size, records in random order (a score computed per record)."""
    return np.random.default_rng(0).integers(0, BANDS, size=size)


def _strategy(name: str, size: int) -> Any:
    from stateful_sampler.order.curriculum import Curriculum
    from stateful_sampler.order.grouped import Grouped

    return {
        "grouped": lambda: Grouped(_groups(size)),
        "grouped-shuffle-within": lambda: Grouped(_groups(size), shuffle_within=True),
        "curriculum": lambda: Curriculum(_bands(size)),
    }[name]()


def ours(size: int, strategy: str) -> dict[str, Any]:
    """Construction, then one whole epoch of indices through the sampler (its pass set-up included)."""
    from stateful_sampler import StatefulSampler

    user = (_groups(size) if strategy.startswith("grouped") else _bands(size)).nbytes / 2**20
    started = perf_counter()
    built = _strategy(strategy, size)
    sampler = StatefulSampler(size, seed=1, strategy=built)
    constructed = perf_counter()
    count = drain(sampler)
    return {"construction_seconds": constructed - started, "seconds_per_index": (perf_counter() - constructed) / count,
            "user_mib": user, "groups": getattr(built, "num_groups", None)}  # fmt: skip


def anchor(size: int, system: str) -> dict[str, Any]:
    """One epoch of the NumPy per-epoch orders, from the arrays to the indices handed out."""
    epochs: dict[str, Callable[[], Iterable[int]]] = {
        "numpy-grouped": lambda: numpy_grouped(_groups(size), np.random.default_rng(1)).tolist(),
        "numpy-curriculum": lambda: numpy_curriculum(_bands(size), np.random.default_rng(1)).tolist(),
    }
    started = perf_counter()
    count = drain(epochs[system]())
    return {"seconds_per_index": (perf_counter() - started) / count}


def numpy_grouped(groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Permute the groups, then concatenate their records: the order ``Grouped`` gives, built whole."""
    boundaries = np.flatnonzero(groups[1:] != groups[:-1]) + 1
    starts = np.concatenate(([0], boundaries))
    sizes = np.diff(np.append(starts, len(groups)))
    order = rng.permutation(len(starts))
    firsts = np.repeat(starts[order], sizes[order])
    offsets = np.arange(len(groups)) - np.repeat(np.cumsum(sizes[order]) - sizes[order], sizes[order])
    return firsts + offsets


def numpy_curriculum(bands: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each band's records permuted, bands concatenated in ascending order."""
    return np.concatenate([rng.permutation(np.flatnonzero(bands == band)) for band in np.unique(bands)])


def resume(size: int, strategy: str, repeats: int = 5) -> dict[str, Any]:
    """``strategy_timing.resume`` of this figure's ``strategy``."""
    return timing.resume(size, _strategy(strategy, size), repeats)


CASES: dict[str, Callable[..., dict[str, Any]]] = {"ours": ours, "anchor": anchor, "resume": resume}


def run(name: str, **params: Any) -> dict[str, Any]:
    """One case in a fresh interpreter; adds its peak RSS above the post-import baseline."""
    return isolated.run("benchmarks.cases_sequences", name, params)


if __name__ == "__main__":
    isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
