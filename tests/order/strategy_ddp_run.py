"""One rank of a real 2-process DDP run (gloo, CPU) over a non-uniform strategy, started by
``test_strategy_ddp.py`` (balanced ``Stratified`` draws) and ``test_strategy_grouped.py`` (``Grouped`` with lanes).

``python strategy_ddp_run.py STRATEGY OUT_DIR NAME [STOP_AFTER]`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Every batch is all-reduced, as DDP's gradient sync does, so unequal step counts would hang.
The run loads OUT_DIR/state.json when it exists; with STOP_AFTER it stops after that many steps and rank 0
saves the consumed position there. Each rank writes its batches to OUT_DIR/NAME_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.stratified import Stratified

SIZES = [7, 1, 3, 5, 2, 2, 9, 4, 1, 6, 3, 3]
GROUPS = np.repeat(np.arange(len(SIZES)), SIZES)
LABELS = np.arange(45) % 7 // 5  # 35 and 10 records: 70 draws a pass
EPOCHS = 2


def sampler_for(strategy: str) -> StatefulSampler:
    if strategy == "grouped":
        return StatefulSampler(len(GROUPS), seed=5, batch_size=3, strategy=Grouped(GROUPS, lanes=2))
    return StatefulSampler(len(LABELS), seed=11, batch_size=4, strategy=Stratified(LABELS, mode="balanced"))


def main(strategy: str, out_dir: str, name: str, stop_after: str = "0") -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    sampler = sampler_for(strategy)
    state = Path(out_dir, "state.json")
    if state.exists():
        sampler.load_state_dict(json.loads(state.read_text()))
    loader = DataLoader(torch.arange(sampler.size), sampler=sampler, batch_size=sampler.batch_size, num_workers=2)
    seen = train(sampler, loader, int(stop_after), state)
    dist.barrier()
    Path(out_dir, f"{name}_rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    # no interpreter teardown: a native gloo/DDP thread sometimes aborts there (exit -6, "terminate called
    # without an active exception") after every result is written
    sys.stdout.flush()
    os._exit(0)


def train(sampler: StatefulSampler, loader: DataLoader, stop_after: int, state: Path) -> list[list[int]]:
    seen: list[list[int]] = []
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader, 1):
            dist.all_reduce(torch.tensor([float(batch.sum())]))  # lockstep, like a gradient sync
            seen.append(batch.tolist())
            if len(seen) == stop_after:
                if dist.get_rank() == 0:
                    state.write_text(json.dumps(sampler.state_dict(consumed_batches=step)))
                return seen
    return seen


if __name__ == "__main__":
    main(*sys.argv[1:5])
