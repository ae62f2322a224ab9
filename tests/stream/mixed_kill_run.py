"""A training loop over a ``MixedStream`` (a map-style corpus and two streams) through ``ResumableLoader``, run as
its own process by the kill test.

``python -m tests.stream.mixed_kill_run ROOT --workers N [--kill-after K]``: each consumed batch is appended to
ROOT/record.jsonl, flushed; the checkpoint is written after every step and loaded when it exists; ``--kill-after K``
SIGKILLs the process, workers and all, right after step K's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch

from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import MixedStream, ShardedStream
from tests.stream_helpers import Rows

EPOCHS = 2


def make_stream() -> MixedStream:
    streams = [
        ShardedStream([str(i) for i in range(4)], Rows([7, 5, 0, 9]), batch_size=1, window=2, seed=5),
        ShardedStream([str(i) for i in range(3)], Rows([4, 6, 3]), batch_size=1, window=1, seed=6),
    ]
    return MixedStream([list(range(5000, 5011)), *streams], [2, 1, 1], batch_size=3, num_samples=41, seed=3,
                       schedule={(1, 20): [0, 1, 1]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-after", type=int)
    args = parser.parse_args()
    checkpoint = args.root / "checkpoint.pt"
    loader = ResumableLoader(make_stream().loader(num_workers=args.workers))
    if checkpoint.exists():
        loader.load_state_dict(torch.load(checkpoint)["loader"])
    step = 0 if not checkpoint.exists() else torch.load(checkpoint)["step"]
    with (args.root / "record.jsonl").open("a") as record:
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            for batch in loader:
                step += 1
                record.write(json.dumps({"epoch": epoch, "batch": batch.tolist()}) + "\n")
                record.flush()
                torch.save({"loader": loader.state_dict(), "step": step}, checkpoint.with_suffix(".tmp"))
                checkpoint.with_suffix(".tmp").replace(checkpoint)
                if step == args.kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
