"""A mixture of three datasets at weights 0.5/0.3/0.2, killed with SIGKILL mid-epoch and resumed exactly.

The digits are split into three sources of different sizes (1197, 400 and 200 images) and concatenated;
``Mixture`` draws 1000 samples an epoch from them at 0.5/0.3/0.2. The small sources are drawn more often
than they have records, so they repeat, reshuffled each time; the large one does not get through its
records in one epoch and continues where the last epoch stopped. Three runs, each its own process with 2 DataLoader
workers: uninterrupted; killed (the whole process group, with SIGKILL) after step ``--kill-after``;
the same command again, which resumes from the last checkpoint. The two runs must see the same batches
and end with bitwise identical weights. Then the mixture audit prints each source's share, and the
plot of the cumulative shares against the targets is saved.

    python examples/mixture.py --plot mixture.png
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

from stateful_sampler import StatefulSampler
from stateful_sampler.audit.mixture import audit_mixture, plot_mixture, source_of
from stateful_sampler.order.mixture import Mixture

SOURCES = {"A": (0, 1197), "B": (1197, 1597), "C": (1597, 1797)}
WEIGHTS = [0.5, 0.3, 0.2]
BATCH, DRAWS, EPOCHS, SAVE_EVERY = 32, 1000, 2, 5


def mixture() -> Mixture:
    return Mixture([stop - start for start, stop in SOURCES.values()], WEIGHTS, num_samples=DRAWS)


def dataset() -> ConcatDataset:
    images, labels = load_digits(return_X_y=True)
    images = torch.tensor(images / 16.0, dtype=torch.float32)
    labels = torch.tensor(labels)
    indices = torch.arange(len(labels))
    return ConcatDataset([TensorDataset(images[a:b], labels[a:b], indices[a:b]) for a, b in SOURCES.values()])


def train(directory: Path, kill_after: int | None) -> None:
    """Train, checkpointing every ``SAVE_EVERY`` steps into ``directory``, from its checkpoint if any."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = dataset()
    sampler = StatefulSampler(data, seed=11, batch_size=BATCH, strategy=mixture())
    checkpoint, step, seen = directory / "checkpoint.pt", 0, []
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        step, seen = saved["step"], saved["seen"]
    loader = DataLoader(data, sampler=sampler, batch_size=BATCH, num_workers=2, persistent_workers=True)
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for consumed, (images, labels, indices) in enumerate(loader, 1):
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            seen.append(indices.tolist())
            if step % SAVE_EVERY == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "seen": seen,
                         "sampler": sampler.state_dict(consumed_batches=consumed)}  # fmt: skip
                torch.save(state, directory / "checkpoint.tmp")
                (directory / "checkpoint.tmp").replace(checkpoint)
            if step == kill_after:
                os.killpg(os.getpgrp(), signal.SIGKILL)  # this process and its workers, nothing cleaned up
    torch.save({"model": model.state_dict(), "seen": seen}, directory / "final.pt")


def run(directory: Path, kill_after: int | None = None) -> int:
    command = [sys.executable, __file__, "--run", str(directory)]
    command += ["--die-after", str(kill_after)] if kill_after else []
    return subprocess.run(command, check=False, start_new_session=True, timeout=600).returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-after", type=int, default=43, help="the step after which the run is killed")
    parser.add_argument("--plot", type=Path, default=Path("mixture.png"))
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # one training run, in this directory
    parser.add_argument("--die-after", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        train(args.run, args.die_after)
        return
    with tempfile.TemporaryDirectory() as root:
        whole, cut = Path(root, "whole"), Path(root, "cut")
        whole.mkdir(), cut.mkdir()
        assert run(whole) == 0
        killed = run(cut, args.kill_after)
        resumed_from = torch.load(cut / "checkpoint.pt")["step"]
        print(f"killed with SIGKILL after step {args.kill_after} (exit {killed}); resuming from the checkpoint "
              f"at step {resumed_from}")  # fmt: skip
        assert run(cut) == 0
        a, b = torch.load(whole / "final.pt"), torch.load(cut / "final.pt")
    same_weights = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    print(f"identical batches:       {sum(x == y for x, y in zip(a['seen'], b['seen']))} of {len(a['seen'])}")
    print(f"identical final weights: {'yes, bitwise' if same_weights else 'NO'}")
    print(f"verdict:                 {'IDENTICAL' if a['seen'] == b['seen'] and same_weights else 'DIFFERENT'}")

    strategy = mixture()
    drawn = np.concatenate([np.array(batch) for batch in a["seen"]])
    observed = np.bincount(source_of(strategy, drawn), minlength=3) / len(drawn)
    print("\nsource shares of the batches trained on: " + ", ".join(f"{n} {s:.4f}" for n, s in zip(SOURCES, observed)))
    audit = audit_mixture(strategy, EPOCHS)
    print(audit.table())
    plot_mixture(audit, args.plot, names=[f"{name} ({b - a} records)" for name, (a, b) in SOURCES.items()])
    print(f"plot saved to {args.plot}")


if __name__ == "__main__":
    main()
