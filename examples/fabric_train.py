"""Lightning Fabric on 2 CPU processes: checkpoint mid-epoch with ``fabric.save`` and resume exactly.

The loader from ``stateful_sampler.fabric.setup_dataloader`` is a ``ResumableLoader``: put it in
``fabric.save``'s state next to the model and optimizer, and ``fabric.load`` restores the position
the loop consumed, in O(1). Run it again with the same ``--root`` to resume from ``last.ckpt``.

    python examples/fabric_train.py --root runs/fabric              # trains, checkpoints every 5 steps
    python examples/fabric_train.py --root runs/fabric              # ...resumes from runs/fabric/last.ckpt
    python examples/fabric_train.py --root runs/fabric --kill-at 17 # crash: SIGKILL every process after step 17
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import KeyedDataset, StatefulSampler
from stateful_sampler.fabric import setup_dataloader
from stateful_sampler.loader import add_batch_hook
from stateful_sampler.verify import record_weights

SIZE, BATCH, SAVE_EVERY = 203, 8, 5  # 102 positions a rank on 2 ranks: one padding repeat, 13 batches an epoch


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="checkpoints go to ROOT/last.ckpt")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--kill-at", type=int, help="simulate a crash: SIGKILL every process after this step")
    parser.add_argument("--record", type=Path, help="append each consumed batch's record ids to DIR/rank{R}.jsonl")
    args = parser.parse_args(argv)

    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto")
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    dataset = make_dataset()
    sampler = StatefulSampler(dataset, seed=1, batch_size=BATCH, yield_keys=True)
    loader = setup_dataloader(fabric, DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=args.workers))
    if args.record is not None:
        record_batches(args.record, fabric.global_rank)

    checkpoint = args.root / "last.ckpt"
    state = {"model": model, "optimizer": optimizer, "loader": loader, "step": 0}
    if checkpoint.exists():
        state.update(fabric.load(checkpoint, state))
        fabric.print(f"resumed from step {state['step']} (epoch {loader.epoch})")
    step = state["step"]
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
        for (inputs, targets), keys in loader:
            loss = nn.functional.mse_loss(model(inputs)[~keys.is_padding], targets[~keys.is_padding])
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                state["step"] = step
                fabric.save(args.root / "last.ckpt.tmp", state)
                if fabric.is_global_zero:
                    os.replace(args.root / "last.ckpt.tmp", checkpoint)  # a kill mid-write keeps the previous one
                fabric.barrier()
            if step == args.kill_at and fabric.is_global_zero:
                os.killpg(os.getpgid(0), signal.SIGKILL)
    record_weights(model)  # for `stateful-sampler verify -- python examples/fabric_train.py ...`; a no-op otherwise
    fabric.print(f"trained to step {step}; final weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
