"""One rank of a real DDP run (gloo, CPU) over parquet shards, started by ``test_stream_ddp.py``.

``python stream_ddp_run.py SHARD_DIR OUT_DIR NAME WORKERS STOP_AFTER STATE`` (0 and "" for none), with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. The loop all-reduces every batch, as DDP's
gradient sync does, so ranks with unequal step counts would hang (the test has a timeout). It
writes the ids of each batch it consumed to OUT_DIR/NAME_rank<r>.json, and after STOP_AFTER
steps the state to OUT_DIR/NAME_state.json (rank 0) and stops.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from stateful_sampler.stream import ParquetReader, ShardedStream

EPOCHS, BATCH = 2, 5


def ids(record: dict) -> int:
    return record["id"]


def main(shard_dir: str, out_dir: str, name: str, workers: int, stop_after: int, state: str) -> None:
    dist.init_process_group("gloo")
    shards = sorted(str(path) for path in Path(shard_dir).glob("*.parquet"))
    stream = ShardedStream(shards, ParquetReader(), batch_size=BATCH, window=2, seed=3, transform=ids, yield_keys=True)
    if state:
        stream.load_state_dict(json.loads(Path(state).read_text()))
    # Forking a worker from a rank whose gloo threads run can hang the child: start them from a fork server,
    # which imports this module (run again as each worker's __main__) once rather than each worker anew.
    context = "forkserver" if workers else None
    multiprocessing.set_forkserver_preload(["tests.stream.stream_ddp_run", "pyarrow.parquet"])
    loader = stream.loader(num_workers=workers, multiprocessing_context=context)
    seen: list[dict] = []
    out = Path(out_dir)
    for epoch in range(stream.epoch, EPOCHS):
        stream.set_epoch(epoch)
        for consumed, (records, keys) in enumerate(loader, 1):
            dist.all_reduce(torch.tensor([float(records.sum())]))  # lockstep, like a gradient sync
            seen.append(
                {
                    "epoch": epoch,
                    "ids": records.tolist(),
                    "positions": keys.position.tolist(),
                    "padding": keys.is_padding.tolist(),
                }
            )
            if len(seen) == stop_after:
                if dist.get_rank() == 0:
                    (out / f"{name}_state.json").write_text(json.dumps(stream.state_dict(consumed_batches=consumed)))
                break
        else:
            continue
        break
    (out / f"{name}_rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    # no interpreter teardown: a native gloo/DDP thread sometimes aborts there (exit -6, "terminate called
    # without an active exception") after every result is written
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    shard_dir, out_dir, name, workers, stop_after, state = sys.argv[1:7]
    main(shard_dir, out_dir, name, int(workers), int(stop_after), state)
