"""A plain PyTorch DDP training (gloo, under torchrun) that ``verify --resize`` resumes at another world
size (tests/verify/test_verify_resize.py): batches of keyed records through a ``ResumableLoader``, a
checkpoint into ``--root`` every ``--every`` steps, ``--epochs`` epochs (1), every start a resume when one is there.

``--forget-loader-at-resize`` is the bug: when the checkpoint was written at another world size, the
script restores the model and the optimizer but not the loader, so the resumed run starts the epoch
over and trains again on the records consumed before the checkpoint.

    torchrun --standalone --nproc-per-node N tests/verify/resize_script.py --root DIR
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from plain_sgd import PlainSGD  # beside this script (torch.optim imports torch._dynamo: 2 s CPU a run)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import KeyedDataset, ResumableLoader, StatefulSampler

RECORDS, BATCH = 32, 2  # per rank: 4 steps an epoch on 4 processes, 8 on 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--forget-loader-at-resize", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    inputs = torch.randn(RECORDS, 3, generator=torch.Generator().manual_seed(0))
    dataset = KeyedDataset(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)))
    sampler = StatefulSampler(dataset, seed=5, batch_size=BATCH, yield_keys=True)
    loader = ResumableLoader(DataLoader(dataset, sampler=sampler, batch_size=BATCH))
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = PlainSGD(model.parameters(), lr=0.05)
    checkpoint, step = args.root / "last.pt", 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if not (args.forget_loader_at_resize and saved["world_size"] != world_size):
            loader.load_state_dict(saved["loader"])
        step = saved["step"]
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)
        for (features, targets), _keys in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(features), targets).backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
            step += 1
            if step % args.every == 0:
                state = loader.state_dict(every_rank=True)  # a collective: on every rank
                if rank == 0:
                    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": state}
                    torch.save({**saved, "step": step, "world_size": world_size}, args.root / "next.pt")
                    os.replace(args.root / "next.pt", checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can abort in interpreter teardown after destroy_process_group (exit -6, "terminate
    # called without an active exception"); everything is written by now, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
