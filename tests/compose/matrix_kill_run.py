"""The four batchings of the matrix over one map-style mixture changed mid-epoch, in lockstep through
``ResumableLoader``: run as its own process by tests/compose/test_matrix.py's SIGKILL test.

Each step takes the next batch of every loader not yet done, appends them to ``--record`` (one JSON line, flushed),
then saves the loaders' states to ``--state`` (replaced whole). ``--kill-after K`` SIGKILLs the process itself right
after step K's save, workers and all. ``--state`` is loaded when it exists.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from stateful_sampler import Mixture, PackedRows, ResumableLoader, StatefulSampler, TokenBudgetBatches

SIZES = [14, 22, 10]
LENGTHS = [(7 * i) % 16 + 1 for i in range(sum(SIZES))]
SEED = 5


class Echo:
    """What a batch holds, as JSON: a record, or a row's (record, start, stop) slices."""

    def __len__(self) -> int:
        return sum(SIZES)

    def __getitem__(self, item: Any) -> Any:
        return [list(piece) for piece in item] if isinstance(item, list) else int(item)


def _as_list(items: list[Any]) -> list[Any]:
    return items


def loaders(workers: int) -> dict[str, ResumableLoader]:
    """A loader per batching, each over ``Mixture`` whose weights change at position 30 of epoch 0."""
    mixture = lambda: Mixture(SIZES, [3, 1, 2], num_samples=60, schedule={(0, 30): [1, 3, 1]})
    options: dict[str, Any] = {"collate_fn": _as_list, "num_workers": workers}
    fixed = StatefulSampler(sum(SIZES), strategy=mixture(), seed=SEED, batch_size=4)
    split = PackedRows(LENGTHS, 16, strategy=mixture(), window=7, seed=SEED, batch_size=2)
    whole = PackedRows(LENGTHS, 16, split_records=False, strategy=mixture(), window=7, seed=SEED, batch_size=2)
    budget = TokenBudgetBatches(LENGTHS, 40, strategy=mixture(), window=7, seed=SEED)
    return {
        "fixed": ResumableLoader(DataLoader(Echo(), sampler=fixed, batch_size=4, **options)),
        "packed-split": ResumableLoader(DataLoader(Echo(), sampler=split, batch_size=2, **options)),
        "packed-whole": ResumableLoader(DataLoader(Echo(), sampler=whole, batch_size=2, **options)),
        "token-budget": ResumableLoader(DataLoader(Echo(), batch_sampler=budget, **options)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    running = loaders(args.workers)
    if args.state.exists():
        for name, state in json.loads(args.state.read_text()).items():
            running[name].load_state_dict(state)
    iterators = {name: iter(loader) for name, loader in running.items()}
    step = 0
    with args.record.open("a") as record:
        while iterators:
            batches = {}
            for name in list(iterators):
                try:
                    batches[name] = next(iterators[name])
                except StopIteration:
                    del iterators[name]
            if not batches:
                break
            record.write(json.dumps(batches) + "\n")
            record.flush()
            saved = args.state.with_suffix(".tmp")
            saved.write_text(json.dumps({name: loader.state_dict() for name, loader in running.items()}))
            os.replace(saved, args.state)
            step += 1
            if step == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
