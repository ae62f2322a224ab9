"""``torch.distributed.checkpoint`` (DCP), torchtitan style: model, optimizer and every rank's loader state in one
checkpoint, resumed exactly on the same world size and elastically on another.

    torchrun --nproc-per-node 2 examples/dcp_train.py --root runs/dcp   # 2 CPU processes, checkpoints every 5 steps
    torchrun --nproc-per-node 2 examples/dcp_train.py --root runs/dcp   # ...resumes exactly from the last one
    torchrun --nproc-per-node 1 examples/dcp_train.py --root runs/dcp   # ...or on 1: the rest of the epoch, once
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import KeyedDataset, ResumableLoader, StatefulSampler
from stateful_sampler.dcp import DistributedLoaderState
from stateful_sampler.loader import add_batch_hook
from stateful_sampler.verify import record_weights

SIZE, BATCH, SAVE_EVERY = 203, 8, 5  # 102 positions a rank on 2 ranks: one padding repeat, 13 batches an epoch


class Trained:
    """Model and optimizer as one DCP ``Stateful`` (DCP's own state-dict helpers handle the DDP wrapper)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def make_dataset() -> KeyedDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SIZE, 8, generator=generator)
    targets = inputs @ torch.randn(8, 1, generator=generator)
    return KeyedDataset(TensorDataset(inputs, targets))


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def record_batches(directory: Path, rank: int) -> None:
    """Append the records of every consumed batch to DIR/rank{R}.jsonl (what the tests compare)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = (directory / f"rank{rank}.jsonl").open("a")

    def write(loader, batch, consumed: int) -> None:  # type: ignore[no-untyped-def]
        keys = batch[1]
        line = {"epoch": loader.epoch, "ids": keys.index.tolist(), "padding": keys.is_padding.tolist()}
        out.write(json.dumps(line) + "\n")
        out.flush()

    add_batch_hook(write)


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(path.parent for path in root.glob("step-*/.metadata"))  # DCP writes .metadata last
    return done[-1] if done else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="checkpoints go to ROOT/step-NNNNNN")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--kill-at", type=int, help="simulate a crash: SIGKILL rank 0 after this step")
    parser.add_argument("--record", type=Path, help="append each consumed batch's record ids to DIR/rank{R}.jsonl")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = make_dataset()
    sampler = StatefulSampler(dataset, seed=1, batch_size=BATCH, yield_keys=True)  # shards over the process group
    loader = ResumableLoader(DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=args.workers))
    if args.record is not None:
        record_batches(args.record, rank)

    state = {"trained": Trained(model, optimizer), "loader": DistributedLoaderState(loader), "step": 0}
    checkpoint = latest_checkpoint(args.root)
    if checkpoint is not None:
        dcp.load(state, checkpoint_id=checkpoint)
        if rank == 0:
            print(f"resumed from step {state['step']} (epoch {loader.epoch})", flush=True)
    step = state["step"]
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
        for (inputs, targets), keys in loader:
            loss = nn.functional.mse_loss(model(inputs)[~keys.is_padding], targets[~keys.is_padding])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                state["step"] = step
                dcp.save(state, checkpoint_id=args.root / f"step-{step:06d}")
            if step == args.kill_at and rank == 0:
                os.killpg(os.getpgid(0), signal.SIGKILL)
    record_weights(model.module)  # for `stateful-sampler verify -- torchrun ... examples/dcp_train.py ...`
    if rank == 0:
        print(f"trained to step {step}; final weights {weights_digest(model.module)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can abort in interpreter teardown after destroy_process_group (exit -6, "terminate
    # called without an active exception"); everything is written by now, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
