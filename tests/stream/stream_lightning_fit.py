"""A Lightning fit on a ``ShardedStream`` in a ``LightningDataModule``, with ``SamplerCheckpoint``: the
README's pattern, fitted in-process by ``test_stream_lightning.py`` and in processes of its own by
``tests/stream/stream_lightning_run.py`` (which imports this module only in its ``__main__``).

Every rank appends each training step's record ids to ROOT/rank<r>.jsonl; ``last.ckpt`` is written every 3
steps and the fit resumes from it when it exists. Rank 0 SIGKILLs the whole process group (every rank and
DataLoader worker) after step KILL_AT.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from stateful_sampler.lightning import SamplerCheckpoint
from stateful_sampler.stream import StreamLoader
from tests.stream.stream_lightning_run import EPOCHS, make_stream

warnings.filterwarnings("ignore")


class StreamData(LightningDataModule):
    """The stream is built in ``train_dataloader``, once the process group exists, and
    ``stream.loader`` sets the batching: nothing else to wire."""

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers

    def train_dataloader(self) -> StreamLoader:
        stream = make_stream()
        # Forking a worker from a rank whose gloo threads run can hang the child: start them from a fork server.
        return stream.loader(num_workers=self.workers, multiprocessing_context="forkserver" if self.workers else None)


class Recording(LightningModule):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        line = {"step": self.global_step, "epoch": self.current_epoch, "ids": batch[:, 0].int().tolist()}
        with (self.root / f"rank{self.global_rank}.jsonl").open("a") as record:
            record.write(json.dumps(line) + "\n")
        return self.layer(batch / 1000).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def fit_stopped_at(root: Path, max_steps: int, ckpt_path: str | None = None) -> None:
    """One fit in this process, on one device at 0 workers, stopped by ``max_steps`` (-1: the 2 epochs), from
    ``ckpt_path`` when given; ``last.ckpt`` after every step."""
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, max_steps=max_steps, logger=False,
                      callbacks=[SamplerCheckpoint(), ModelCheckpoint(root, save_last=True, every_n_train_steps=1)],
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Recording(root), StreamData(workers=0), ckpt_path=ckpt_path)


def stopped_and_resumed(whole: Path, cut: Path, between: Callable[[], object] | None = None) -> None:
    """The uninterrupted fit in ``whole``; in ``cut``, fits stopped mid-epoch and exactly at the end of epoch 0,
    each resumed from ``last.ckpt``, then the rest (``between`` is called before them)."""
    fit_stopped_at(whole, max_steps=-1)
    if between is not None:
        between()
    for stop in (7, 20):
        fit_stopped_at(cut, max_steps=stop, ckpt_path=str(cut / "last.ckpt") if stop > 7 else None)
    fit_stopped_at(cut, max_steps=-1, ckpt_path=str(cut / "last.ckpt"))


def main(root: Path, workers: int, devices: int, kill_at: int) -> None:
    # A worker started from a fork server runs the __main__ module (stream_lightning_run, which imports
    # Lightning only under its __name__ guard) again: from a server that imported it (and torch) once.
    multiprocessing.set_forkserver_preload(["tests.stream.stream_lightning_run"])
    checkpoint = ModelCheckpoint(root, every_n_train_steps=3, save_top_k=-1, save_last=True)
    callbacks: list[Callback] = [SamplerCheckpoint(), checkpoint] + ([KillAt(kill_at)] if kill_at else [])
    trainer = Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                      max_epochs=EPOCHS, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    last = root / "last.ckpt"
    trainer.fit(Recording(root), StreamData(workers), ckpt_path=str(last) if last.exists() else None)
