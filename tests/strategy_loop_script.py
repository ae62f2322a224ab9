"""A plain training loop over a non-uniform strategy, run as its own process by the kill tests.

It appends every consumed batch to ``--record`` (one JSON line, flushed) and saves the consumed
position to ``--state`` after every step; ``--kill-after K`` SIGKILLs the process itself right after
step K's save, workers and all, with nothing cleaned up. ``--state`` is loaded when it exists.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.order.curriculum import Curriculum
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.length_grouped import LengthGrouped
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.strategy import Strategy
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted

RECORDS, BATCH, EPOCHS = 60, 4, 3
STRATEGIES = ("grouped", "curriculum", "weighted", "stratified", "mixture", "length-grouped")


def strategy(name: str) -> Strategy:
    ids = np.arange(RECORDS)
    if name == "grouped":
        return Grouped(ids * 7 % 11, shuffle_within=True)  # 11 groups, not in runs
    if name == "weighted":
        return Weighted(ids % 5 + 1.0)  # 60 draws a pass, with replacement
    if name == "stratified":
        return Stratified(ids % 4 // 3)  # 45 and 15 records, proportional
    if name == "mixture":  # sources of 7, 23 and 30 records; 44 draws an epoch, weights change at epoch 2
        return Mixture([7, 23, 30], [0.5, 0.3, 0.2], num_samples=44, schedule={2: [1, 1, 2]})
    if name == "length-grouped":
        return LengthGrouped(ids * 37 % 101, batch_size=BATCH, megabatch=3, longest_first=True)
    return Curriculum(ids % 3, schedule=[1, 2, 3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=list(STRATEGIES), required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(1234)  # must not matter: the order never comes from the global RNG
    sampler = StatefulSampler(RECORDS, seed=42, batch_size=BATCH, strategy=strategy(args.strategy))
    if args.state.exists():
        sampler.load_state_dict(json.loads(args.state.read_text()))
    loader = DataLoader(torch.arange(RECORDS), sampler=sampler, batch_size=BATCH, num_workers=args.workers)
    steps = 0
    with args.record.open("a") as record:
        for epoch in range(sampler.epoch, EPOCHS):
            sampler.set_epoch(epoch)
            for step, batch in enumerate(loader, 1):
                record.write(json.dumps(batch.tolist()) + "\n")
                record.flush()
                temporary = args.state.with_suffix(".tmp")
                temporary.write_text(json.dumps(sampler.state_dict(consumed_batches=step)))
                temporary.replace(args.state)
                steps += 1
                if steps == args.kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
