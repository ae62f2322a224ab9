"""One rank of a real DDP run (gloo, CPU) of ``StatefulSampler``, started by ``test_elastic_ddp.py``.

``python elastic_ddp_run.py OUT_DIR NAME STATE`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.
Every batch is all-reduced, as DDP's gradient sync does, so ranks with unequal step counts would
hang (the test has a timeout, the process group a short one). Each rank writes the keys of every
batch it consumed to OUT_DIR/NAME_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from stateful_sampler import KeyedDataset, StatefulSampler

SIZE, BATCH, TAIL = 100, 5, "pad"


def main(out_dir: str, name: str, state: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    sampler = StatefulSampler(SIZE, seed=11, batch_size=BATCH, tail=TAIL, yield_keys=True)
    sampler.load_state_dict(json.loads(Path(state).read_text()))
    loader = DataLoader(KeyedDataset(torch.arange(SIZE)), sampler=sampler, batch_size=BATCH)
    seen = []
    sampler.set_epoch(sampler.epoch)
    for records, keys in loader:
        dist.all_reduce(torch.tensor([float(records.sum())]))  # lockstep, like a gradient sync
        seen.append({"ids": records.tolist(), "padding": keys.is_padding.tolist()})
    dist.barrier()
    Path(out_dir, f"{name}_rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    # no interpreter teardown: a native gloo/DDP thread sometimes aborts there (exit -6, "terminate called
    # without an active exception") after every result is written
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
