"""Class imbalance: train on digits with one class cut to 5%, in the uniform order and with ``Stratified``
balanced windows, compare the minority class's recall, and kill the stratified run with SIGKILL and resume it.

The balanced order puts one record of every class in each window of 10 positions, so the minority class is
drawn as often as the others; its few records repeat within an epoch, and ``SeededDataset(per_draw=True)``
gives each repeat its own noise. The audit reports (and ``--plot`` draws) each batch's class composition.

    python examples/imbalanced.py [--plot composition.png]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader

from stateful_sampler import SeededDataset, StatefulSampler
from stateful_sampler.audit import audit
from stateful_sampler.order.stratified import Stratified

MINORITY, SHARE = 3, 0.05
BATCH, EPOCHS, SAVE_EVERY, KILL_AFTER = 32, 4, 10, 57


def imbalanced_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits with class 3 cut to 5% of the records; every 4th record held out for testing."""
    images, labels = load_digits(return_X_y=True)
    others = np.flatnonzero(labels != MINORITY)
    kept = np.flatnonzero(labels == MINORITY)[: round(SHARE * len(others) / (1 - SHARE))]
    chosen = np.sort(np.concatenate([others, kept]))
    test = np.arange(len(chosen)) % 4 == 0
    images, labels = images[chosen] / 16.0, labels[chosen]
    return images[~test], labels[~test], images[test], labels[test]


class NoisyImages:
    """Images with noise drawn from each sample's own generator (``SeededDataset`` seeds it)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = torch.tensor(images, dtype=torch.float32), torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def load_sample(self, index: int, rng: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index] + 0.1 * torch.rand(64, generator=rng.torch), self.labels[index]


def sampler_for(order: str, labels: np.ndarray) -> StatefulSampler:
    strategy = Stratified(labels, mode="balanced", num_samples=len(labels)) if order == "stratified" else None
    return StatefulSampler(len(labels), seed=7, batch_size=BATCH, yield_keys=True, strategy=strategy)


def train(order: str, root: Path, kill_after: int | None = None) -> nn.Module:
    """Train, resuming from ``root``'s checkpoint if there is one; every consumed batch's record ids go to
    ``root/batches.jsonl``. With ``kill_after``, the process SIGKILLs itself after that many steps."""
    images, labels, _, _ = imbalanced_digits()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = SeededDataset(NoisyImages(images, labels), global_rngs=(), per_draw=True)
    sampler = sampler_for(order, labels)
    checkpoint, record = root / "checkpoint.pt", root / "batches.jsonl"
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        step = saved["step"]
        record.write_text("".join(record.read_text().splitlines(keepends=True)[:step]))  # drop replayed steps
    loader = DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=2, persistent_workers=True)
    with record.open("a") as out:
        for epoch in range(sampler.epoch, EPOCHS):
            sampler.set_epoch(epoch)
            for consumed, ((inputs, targets), keys) in enumerate(loader, 1):
                loss = nn.functional.cross_entropy(model(inputs), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                out.write(json.dumps(keys.index.tolist()) + "\n")
                out.flush()
                step += 1
                if step % SAVE_EVERY == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "sampler": sampler.state_dict(consumed_batches=consumed), "step": step}  # fmt: skip
                    torch.save(state, checkpoint)
                if step == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
    torch.save(model.state_dict(), root / "weights.pt")
    return model


def minority_recall(model: nn.Module) -> float:
    _, _, images, labels = imbalanced_digits()
    with torch.no_grad():
        predicted = model(torch.tensor(images, dtype=torch.float32)).argmax(1).numpy()
    return float((predicted[labels == MINORITY] == MINORITY).mean())


def killed_and_resumed(root: Path) -> None:
    """The stratified run in a child process, SIGKILLed after step KILL_AFTER, then run again to resume."""
    command = [sys.executable, __file__, "--child", str(root)]
    killed = subprocess.run([*command, "--kill-after", str(KILL_AFTER)], check=False)
    if killed.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the run to kill exited with {killed.returncode}, not SIGKILL")
    subprocess.run(command, check=True)


def first_divergence(left: list[str], right: list[str]) -> str | None:
    for step, (a, b) in enumerate(zip(left, right), 1):
        if a != b:
            return f"step {step}: {a[:40]} vs {b[:40]}"
    return None if len(left) == len(right) else f"step {min(len(left), len(right)) + 1}: one run ended"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="save the audit's composition plot (needs matplotlib)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kill-after", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        train("stratified", args.child, args.kill_after)
        return 0
    labels = imbalanced_digits()[1]
    print(f"digits with class {MINORITY} cut to {SHARE:.0%} of the records; {len(labels)} for training, "
          f"{np.sum(labels == MINORITY)} of them class {MINORITY}")  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        runs = {name: Path(scratch) / name for name in ("uniform", "stratified", "killed")}
        for root in runs.values():
            root.mkdir()
        recall = {order: minority_recall(train(order, runs[order])) for order in ("uniform", "stratified")}
        killed_and_resumed(runs["killed"])
        whole = (runs["stratified"] / "batches.jsonl").read_text().splitlines()
        resumed = (runs["killed"] / "batches.jsonl").read_text().splitlines()
        weights = [torch.load(runs[name] / "weights.pt") for name in ("stratified", "killed")]
    same_weights = all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    for order in ("uniform", "stratified"):
        target = {c: 0.1 for c in range(10)} if order == "stratified" else None  # balanced: equal shares
        report = audit(sampler_for(order, labels), labels=labels, target=target, epochs=1)
        shares = report.counts.composition[0].sum(axis=0) / report.counts.composition[0].sum()
        print(
            f"{order:>10}: minority recall {recall[order]:.2f}; class {MINORITY}'s share of the batches "
            f"{shares[MINORITY]:.1%}; largest batch deviation from the target "
            f"{report.composition[0].max_step_deviation:.3f}"
        )
        if args.plot and order == "stratified":
            from stateful_sampler.audit.plot import plot

            plot(report, args.plot)
            print(f"composition plot: {args.plot}")
    divergence = first_divergence(whole, resumed)
    print(f"stratified run killed with SIGKILL after step {KILL_AFTER} and resumed: "
          f"{len(resumed)} of {len(whole)} batches compared, final weights identical: {same_weights}")  # fmt: skip
    identical = divergence is None and same_weights
    print("verdict:", "IDENTICAL" if identical else f"MISMATCH (first divergence: {divergence})")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
