"""HF Accelerate on 2 CPU processes: ``save_state`` mid-epoch and ``load_state`` resumes exactly, with no replay.

``stateful_sampler.accelerate.prepare_loader`` replaces ``accelerator.prepare(loader)``: the
``StatefulSampler`` shards (Accelerate's ``BatchSamplerShard`` would shard it a second time) and the
loader is registered for checkpointing, so ``accelerator.save_state`` saves the position the loop
consumed and ``load_state`` restores it in O(1), without ``skip_first_batches``.

    accelerate launch --cpu --num_processes 2 examples/accelerate_train.py --root runs/acc   # checkpoints every 5 steps
    accelerate launch --cpu --num_processes 2 examples/accelerate_train.py --root runs/acc   # ...resumes from the last
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import KeyedDataset, StatefulSampler
from stateful_sampler.accelerate import prepare_loader
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


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(root.glob("step-*"))
    return done[-1] if done else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="checkpoints go to ROOT/step-NNNNNN")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--kill-at", type=int, help="simulate a crash: SIGKILL rank 0 after this step")
    parser.add_argument("--record", type=Path, help="append each consumed batch's record ids to DIR/rank{R}.jsonl")
    args = parser.parse_args(argv)

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    dataset = make_dataset()
    sampler = StatefulSampler(dataset, seed=1, batch_size=BATCH, yield_keys=True)
    plain = DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=args.workers)
    loader = prepare_loader(accelerator, plain)  # instead of accelerator.prepare(plain)
    if args.record is not None:
        record_batches(args.record, accelerator.process_index)

    step = 0
    checkpoint = latest_checkpoint(args.root)
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))  # model, optimizer, RNG states and the loader's position
        step = int(checkpoint.name.removeprefix("step-"))
        accelerator.print(f"resumed from step {step} (epoch {loader.epoch})")
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
        for (inputs, targets), keys in loader:
            loss = nn.functional.mse_loss(model(inputs)[~keys.is_padding], targets[~keys.is_padding])
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                accelerator.save_state(str(args.root / "incomplete"))
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:  # a kill mid-save leaves the previous checkpoint whole
                    previous = latest_checkpoint(args.root)
                    os.replace(args.root / "incomplete", args.root / f"step-{step:06d}")
                    if previous is not None:
                        shutil.rmtree(previous)
                accelerator.wait_for_everyone()
            if step == args.kill_at and accelerator.is_main_process:
                os.killpg(os.getpgid(0), signal.SIGKILL)
    model = accelerator.unwrap_model(model)
    record_weights(model)  # for `stateful-sampler verify -- accelerate launch ...`; a no-op otherwise
    accelerator.print(f"trained to step {step}; final weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
