"""Plain PyTorch: checkpoint a training loop mid-epoch and resume it exactly, with 2 DataLoader workers.

Workers prefetch batches ahead of the loop, so the sampler's drawn position is ahead of training.
The checkpoint therefore saves ``sampler.state_dict(consumed_batches=k)``: the position after the
k batches this pass of the loop actually consumed. ``SeededDataset`` seeds each sample's
augmentation from (seed, epoch, index), so the resumed run draws the same noise too.

    python examples/plain_loop.py            # uninterrupted vs stopped after step 40 and resumed
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stateful_sampler import StatefulSampler
from stateful_sampler.seeding import SeededDataset

BATCH, SAVE_EVERY = 32, 10


class NoisyDigits(Dataset):
    def __init__(self) -> None:
        images, labels = load_digits(return_X_y=True)
        self.images = torch.tensor(images / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index] + 0.1 * torch.rand(64), self.labels[index]  # augmentation


def train(checkpoint: Path, epochs: int, stop_after: int | None = None) -> tuple[list[list[int]], dict]:
    """Train, resuming from ``checkpoint`` if it exists; stop after ``stop_after`` steps (a crash)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dataset = SeededDataset(NoisyDigits())
    sampler = StatefulSampler(dataset, seed=7, batch_size=BATCH, yield_keys=True)
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        step = saved["step"]
    loader = DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=2)
    seen: list[list[int]] = []
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)  # a new epoch starts at 0; the restored epoch keeps its position
        for consumed, ((images, labels), keys) in enumerate(loader, 1):
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(keys.index.tolist())
            step += 1
            if step % SAVE_EVERY == 0 or step == stop_after:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "sampler": sampler.state_dict(consumed_batches=consumed),
                    "step": step,
                }
                torch.save(state, checkpoint)
            if step == stop_after:
                return seen, model.state_dict()
    return seen, model.state_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=40, help="the step after which the first run stops")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        uninterrupted, reference_weights = train(Path(scratch) / "reference.pt", args.epochs)
        before, _ = train(Path(scratch) / "run.pt", args.epochs, stop_after=args.stop_after)
        after, weights = train(Path(scratch) / "run.pt", args.epochs)
    same_batches = before + after == uninterrupted
    same_weights = all(torch.equal(weights[name], reference_weights[name]) for name in reference_weights)
    print(f"steps: {len(before)} before the stop, {len(after)} after the resume, {len(uninterrupted)} uninterrupted")
    print(f"identical batches, in the same order: {same_batches}")
    print(f"final weights bitwise identical: {same_weights}")
    print("verdict:", "IDENTICAL" if same_batches and same_weights else "MISMATCH")
    return 0 if same_batches and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
