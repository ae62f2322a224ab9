"""Timing a strategy through ``StatefulSampler`` the same way in every strategy figure (``cases_sequences``,
``cases_strata``), so their rows compare."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from time import perf_counter
from typing import Any

BATCH = 256


def drain(items: Iterable[Any]) -> int:
    """Iterate to the end; the number of items."""
    count = 0
    for _ in items:
        count += 1
    return count


def resume(size: int, built: Any, repeats: int) -> dict[str, Any]:
    """Load a state at the middle of an epoch and take the first batch of 256, median of ``repeats``; the
    strategy is built once beforehand (its construction is the same for a fresh start)."""
    from stateful_sampler import StatefulSampler

    saver = StatefulSampler(size, seed=1, strategy=built, batch_size=BATCH)
    state = {**saver.state_dict(), "epoch": 3, "position": saver.total_size // 2}
    seconds = []
    for _ in range(repeats):
        started = perf_counter()
        sampler = StatefulSampler(size, seed=1, strategy=built, batch_size=BATCH)
        sampler.load_state_dict(state)
        iterator = iter(sampler)
        for _ in range(BATCH):
            next(iterator)
        seconds.append(perf_counter() - started)
    return {"seconds": median(seconds)}
