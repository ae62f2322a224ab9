"""A training loop over a ``ShardedStream`` through one integration, run as its own process by the kill tests.

``python -m tests.stream.stream_kill_run FRAMEWORK ROOT --workers N [--kill-after K] [--reader FORMAT --shards DIR]
[--mixed]`` (``--reader``: a format reader of tests/stream_readers.py on the shards in DIR; ``--mixed``: the same
shards as a ``MixedStream`` of two ``ShardedStream``s at weights 2:1), FRAMEWORK one of plain
(``ResumableLoader``), fabric (``setup_dataloader`` and ``fabric.save``) or accelerate
(``prepare_loader`` and ``accelerator.save_state``); ``verify`` is a script for ``stateful-sampler verify
-- COMMAND`` (a model, a checkpoint every 5 steps, ``record_weights`` at the end). Each consumed batch (record ids and the seeded
augmentation's noise) is appended to ROOT/record.jsonl, flushed; the checkpoint is written after every
step and loaded when it exists; ``--kill-after K`` SIGKILLs the process, workers and all, right after
step K's checkpoint (K counted from the process's start, a resumed one's too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch

from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import MixedStream, SeededTransform, ShardedStream
from tests.stream_helpers import Rows

COUNTS, BATCH, EPOCHS = [7, 5, 0, 9, 4, 6], 3, 2  # 31 records: 11 batches an epoch


def augment(record: int, rng: Any) -> torch.Tensor:
    return torch.tensor([float(record), float(torch.rand(1, generator=rng.torch))], dtype=torch.float64)


def make_stream(reader: str | None = None, shards: Path | None = None, mixed: bool = False) -> Any:
    if mixed:  # shards 0-2 and 3-5 as two sources (built without ranks: the mixture carries the ranks and batching)
        sources = [
            ShardedStream([str(i) for i in group], Rows(COUNTS), batch_size=BATCH, window=2, seed=5)
            for group in ((0, 1, 2), (3, 4, 5))
        ]
        return MixedStream(sources, [2, 1], batch_size=BATCH, seed=5, transform=SeededTransform(augment))
    if reader is not None and shards is not None:  # a format reader's shards (tests/stream_readers.py)
        from tests.stream_readers import FORMATS, IdAugment

        names, format_reader = FORMATS[reader].open(shards)
        return ShardedStream(names, format_reader, batch_size=BATCH, window=2, seed=5,
                             transform=SeededTransform(IdAugment(reader)))  # fmt: skip
    return ShardedStream([str(i) for i in range(len(COUNTS))], Rows(COUNTS), batch_size=BATCH, window=2, seed=5,
                         transform=SeededTransform(augment))  # fmt: skip


def plain(stream: Any, workers: int, checkpoint: Path) -> tuple[ResumableLoader, Any, Any]:
    loader = ResumableLoader(stream.loader(num_workers=workers))
    if checkpoint.exists():
        loader.load_state_dict(torch.load(checkpoint)["loader"])

    def save() -> None:
        torch.save({"loader": loader.state_dict()}, checkpoint.with_suffix(".tmp"))
        checkpoint.with_suffix(".tmp").replace(checkpoint)

    return loader, save, None


def fabric(stream: Any, workers: int, checkpoint: Path) -> tuple[ResumableLoader, Any, Any]:
    from lightning.fabric import Fabric

    from stateful_sampler.fabric import setup_dataloader

    runner = Fabric(accelerator="cpu", devices=1)
    runner.launch()
    loader = setup_dataloader(runner, stream.loader(num_workers=workers))
    if checkpoint.exists():
        runner.load(checkpoint, {"loader": loader})
    return loader, lambda: runner.save(checkpoint, {"loader": loader}), runner


def accelerate(stream: Any, workers: int, checkpoint: Path) -> tuple[ResumableLoader, Any, Any]:
    from accelerate import Accelerator

    from stateful_sampler.accelerate import prepare_loader

    accelerator = Accelerator(cpu=True)
    loader = prepare_loader(accelerator, stream.loader(num_workers=workers))
    if checkpoint.exists():
        accelerator.load_state(str(checkpoint))
    return loader, lambda: accelerator.save_state(str(checkpoint)), accelerator


def verified(root: Path) -> None:
    """What verify runs: it kills the process itself, and compares the batches and the final weights."""
    from stateful_sampler.verify import record_weights

    loader = ResumableLoader(make_stream().loader(num_workers=2))
    torch.manual_seed(1)
    model = torch.nn.Linear(1, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpoint, step = root / "last.pt", 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = ((model(batch[:, :1] / 100) - batch[:, 1:]) ** 2).mean()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 5 == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                }
                torch.save({**state, "step": step}, root / "next.pt")
                os.replace(root / "next.pt", checkpoint)
    record_weights(model)


def train(framework: str, root: Path, workers: int, kill_after: int | None = None, reader: str | None = None,
          shards: Path | None = None, mixed: bool = False) -> None:  # fmt: skip
    """The loop, appending to ROOT/record.jsonl; the tests run an uninterrupted ``plain`` one in their process."""
    checkpoint = root / "checkpoint"
    loader, save, _runner = {"plain": plain, "fabric": fabric, "accelerate": accelerate}[framework](
        make_stream(reader, shards, mixed), workers, checkpoint
    )
    steps = 0
    with (root / "record.jsonl").open("a") as record:
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            for batch in loader:
                record.write(json.dumps({"epoch": epoch, "batch": batch.tolist()}) + "\n")
                record.flush()
                save()
                steps += 1
                if steps == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["plain", "fabric", "accelerate", "verify"])
    parser.add_argument("root", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--reader", help="a format of tests/stream_readers.py, reading the shards in --shards")
    parser.add_argument("--shards", type=Path)
    parser.add_argument("--mixed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(1234)  # must not matter: order and augmentation never come from the global RNG
    if args.framework == "verify":
        return verified(args.root)
    train(args.framework, args.root, args.workers, args.kill_after, args.reader, args.shards, args.mixed)


if __name__ == "__main__":
    main()
