"""A loop over a ``PackedStream`` of parquet shards through ``ResumableLoader``, run as its own process by the kill test.

``python -m tests.stream.packed_stream_kill_run SHARDS ROOT --workers N [--kill-after K] [--whole]``: writes the parquet shards
to SHARDS when they are missing, appends each consumed batch's ``input_ids`` to ROOT/record.jsonl (flushed), saves the
loader's state after every step and loads it when it exists; ``--kill-after K`` SIGKILLs the process, workers and all,
right after step K's checkpoint; ``--whole`` packs whole records (``split_records=False``) instead of splitting them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch

from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import PackedStream, ParquetReader, ShardedStream

COUNTS, SEQ_LEN, BATCH, EPOCHS = [6, 4, 7, 5], 16, 2, 2


def write_shards(folder: Path) -> list[str]:
    """Shard i's record g (global) holds the tokens g*1000 + t, 1 + 7g mod 11 of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    names, first = [], 0
    for index, count in enumerate(COUNTS):
        path = folder / f"shard-{index}.parquet"
        if not path.exists():
            rows = [[g * 1000 + t for t in range(1 + g * 7 % 11)] for g in range(first, first + count)]
            pq.write_table(pa.table({"input_ids": rows}), path, row_group_size=3)
        names.append(str(path))
        first += count
    return names


def train(shards: Path, root: Path, workers: int, kill_after: int | None = None, whole: bool = False) -> None:
    """The loop, appending to ROOT/record.jsonl; the test runs an uninterrupted one in its own process."""
    stream = ShardedStream(write_shards(shards), ParquetReader(), batch_size=3, window=2, seed=3)
    packed = PackedStream(stream, SEQ_LEN, batch_size=BATCH, window=8, split_records=not whole)
    loader = ResumableLoader(packed.loader(num_workers=workers))
    checkpoint = root / "checkpoint.pt"
    if checkpoint.exists():
        loader.load_state_dict(torch.load(checkpoint))
    steps = 0
    with (root / "record.jsonl").open("a") as record:
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            for batch in loader:
                record.write(json.dumps({"epoch": epoch, "input_ids": batch["input_ids"].tolist()}) + "\n")
                record.flush()
                torch.save(loader.state_dict(), checkpoint.with_suffix(".tmp"))
                checkpoint.with_suffix(".tmp").replace(checkpoint)
                steps += 1
                if steps == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards", type=Path)
    parser.add_argument("root", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--whole", action="store_true")
    args = parser.parse_args()
    train(args.shards, args.root, args.workers, args.kill_after, args.whole)


if __name__ == "__main__":
    main()
