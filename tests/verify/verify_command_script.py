"""A plain PyTorch training that ``stateful-sampler verify -- COMMAND`` runs (tests/verify/test_verify_command.py).

It meets verify's contract for commands and is not edited for verify: its batches pass through a
``ResumableLoader``, it checkpoints into ``--root`` every ``--every`` steps and resumes from there
when run again, and it calls ``record_weights`` at the end. ``--drawn-position`` is the classic bug:
it saves the position the sampler *drew*, which 2 prefetching workers put 4 batches ahead of training
(spelled out with ``consumed_batches``: since issue 17, ``sampler.state_dict()`` under a
``ResumableLoader`` is the consumed position, so the bug can no longer be made by accident).
``--ddp`` joins the process group torchrun sets up (gloo); rank 0 writes the checkpoint.
The other flags each break one part of the contract, for verify to name: ``--dropout`` with
``--forget-rng`` (a model whose randomness the resume does not restore: it reseeds after loading),
``--forget-optimizer`` (momentum not restored), ``--forget-loader`` (the loader state not restored),
``--plain-loader`` (no ``ResumableLoader``), ``--no-record-weights``.
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

from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.verify import record_weights

RECORDS, BATCH, EPOCHS = 96, 8, 2  # 12 steps an epoch on one process, 6 on two


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--drawn-position", action="store_true")
    parser.add_argument("--ddp", action="store_true")
    for flag in ("--dropout", "--forget-rng", "--forget-optimizer", "--forget-loader", "--plain-loader",
                 "--no-record-weights"):  # fmt: skip
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    if args.ddp:
        dist.init_process_group("gloo")
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(RECORDS, 4, generator=generator), torch.randn(RECORDS, 1, generator=generator))
    sampler = StatefulSampler(data, seed=3, batch_size=BATCH)
    batches = DataLoader(data, sampler=sampler, batch_size=BATCH, num_workers=2)
    loader = batches if args.plain_loader else ResumableLoader(batches)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Dropout(0.2), nn.Linear(4, 1)) if args.dropout else nn.Linear(4, 1)
    optimizer = PlainSGD(model.parameters(), lr=0.1, momentum=0.9 if args.forget_optimizer else 0.0)
    checkpoint, step = args.root / "last.pt", 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        if not args.forget_optimizer:
            optimizer.load_state_dict(saved["optimizer"])
        if not args.forget_loader:
            (sampler if args.drawn_position or args.plain_loader else loader).load_state_dict(saved["loader"])
        if args.forget_rng:
            torch.manual_seed(1)  # as a fresh process would be, whatever the loader restored
        step = saved["step"]
    epochs = sampler if args.plain_loader else loader
    for epoch in range(epochs.epoch, EPOCHS):
        epochs.set_epoch(epoch)
        for consumed, (inputs, targets) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            if args.ddp:
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
            optimizer.step()
            step += 1
            if step % args.every == 0 and int(os.environ.get("RANK", "0")) == 0:
                if args.drawn_position:
                    drawn = min(consumed + 4, -(-sampler.pass_length() // sampler.batch_size))  # 2 workers x prefetch 2
                    position = sampler.state_dict(consumed_batches=drawn)
                elif args.plain_loader:
                    position = sampler.state_dict(consumed_batches=consumed)
                else:
                    position = loader.state_dict()
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": position}
                torch.save({**state, "step": step}, args.root / "next.pt")
                os.replace(args.root / "next.pt", checkpoint)
    if not args.no_record_weights:
        record_weights(model)
    if args.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can abort in interpreter teardown after destroy_process_group (exit -6, "terminate
    # called without an active exception"); everything is written by now, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
