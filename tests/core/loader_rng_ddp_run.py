"""One rank of a real DDP run (gloo, CPU) whose model's dropout differs per rank, started by ``test_loader_rng_ddp.py``.

``python loader_rng_ddp_run.py OUT NAME [--save-every S] [--die-at K] [--resume FILE]`` with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set. 40 records, batches of 4 a rank, 2 epochs, through ``ResumableLoader``.
Each rank seeds torch with 100 + rank after the model is built, so its dropout masks are its own. Every S steps
every rank takes ``loader.state_dict(every_rank=True)`` and rank 0 writes the one file OUT/last.pt (write, then
rename); beside it, OUT/last-rank0.pt holds the 0.2.0 pattern (rank 0 alone takes ``state_dict()``), so one
killed run serves both resumes. With ``--die-at K`` every rank writes OUT/NAME_rank<r>.paused after step K,
mid-epoch, and waits for the test to SIGKILL it. ``--resume FILE`` loads OUT/FILE on every rank first.
Each rank appends one JSON line per step to OUT/NAME_rank<r>.jsonl (step, epoch, record ids, the loss and the
model's output as float.hex), and writes its final weights' digest at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler

SIZE, BATCH, EPOCHS = 40, 4, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("name")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--resume", metavar="FILE")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(100 + rank)  # each rank's dropout masks are its own
    data = torch.stack([torch.arange(SIZE, dtype=torch.float32) / SIZE, torch.ones(SIZE), -torch.ones(SIZE)], 1)
    loader = ResumableLoader(DataLoader(range(SIZE), sampler=StatefulSampler(SIZE, seed=3), batch_size=BATCH))
    step = 0
    if args.resume:
        saved = torch.load(args.out / args.resume, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.load_state_dict(saved["loader"])  # last, just before the loop
        for warning in caught:
            print(f"WARNING rank {rank}: {warning.message}", flush=True)
    log = (args.out / f"{args.name}_rank{rank}.jsonl").open("a")
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for ids in loader:
            output = model(data[ids])
            loss = output.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # the gradient all-reduce keeps the ranks in step
            optimizer.step()
            step += 1
            line = {"step": step, "epoch": epoch, "ids": ids.tolist(), "loss": loss.item().hex(),
                    "output": [value.hex() for value in output.detach().flatten().tolist()]}  # fmt: skip
            log.write(json.dumps(line) + "\n")
            log.flush()
            if args.save_every and step % args.save_every == 0:
                save(args, rank, model, optimizer, loader, step)
            if step == args.die_at:  # mid-epoch: tell the test, which kills every rank with SIGKILL
                (args.out / f"{args.name}_rank{rank}.paused").touch()
                signal.pause()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())).hexdigest()
    (args.out / f"{args.name}_rank{rank}.weights").write_text(digest)
    del model, optimizer  # DDP's reducer before its group: a reducer left to exit aborts the process (SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
    # no interpreter teardown: a native gloo/DDP thread sometimes aborts there (exit -6, "terminate called
    # without an active exception") after every result is written
    sys.stdout.flush()
    os._exit(0)


def save(args: argparse.Namespace, rank: int, model, optimizer, loader: ResumableLoader, step: int) -> None:  # type: ignore[no-untyped-def]
    every_rank = loader.state_dict(every_rank=True)  # a collective: every rank's RNG states into rank 0's
    if rank == 0:
        rank_0_alone = loader.state_dict()  # the 0.2.0 pattern: rank 0 alone takes it
        for name, state in (("last.pt", every_rank), ("last-rank0.pt", rank_0_alone)):
            checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "loader": state,
                          "step": step}  # fmt: skip
            torch.save(checkpoint, args.out / f"{name}.tmp")
            os.replace(args.out / f"{name}.tmp", args.out / name)


if __name__ == "__main__":
    main()
