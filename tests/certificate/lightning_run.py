"""One Lightning fit that knows nothing of the certificate: the test switches it on with
``STATEFUL_SAMPLER_CERTIFICATE`` in the environment.

``python lightning_run.py DIRECTORY KILL_AT RESUME``: 40 records in batches of 4, 2 epochs, a validation loader
with a ``StatefulSampler`` of its own (run in the sanity check and at each epoch's end: never certified), a
checkpoint every 3 steps (``DIRECTORY/last.ckpt``). After step KILL_AT (0: never) the process SIGKILLs its
process group. With RESUME 1 it resumes from ``last.ckpt`` when there is one; with 0 it starts again from
scratch on the same certificate (the data position is not restored: the bug the certificate catches).
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import StatefulSampler
from stateful_sampler.lightning import SamplerCheckpoint

warnings.filterwarnings("ignore")
RECORDS, BATCH, EPOCHS, CHECKPOINT_EVERY = 40, 4, 2, 3


def dataset(size: int) -> TensorDataset:
    features = torch.arange(size, dtype=torch.float32).unsqueeze(1).repeat(1, 4) / size
    return TensorDataset(features, features.sum(dim=1, keepdim=True))


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(inputs), targets))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        train = dataset(RECORDS)
        return DataLoader(train, sampler=StatefulSampler(train, seed=11, batch_size=BATCH), batch_size=BATCH)

    def val_dataloader(self) -> DataLoader:
        validation = dataset(8)
        return DataLoader(validation, sampler=StatefulSampler(validation, seed=2, batch_size=4), batch_size=4)


class KillAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def main(directory: Path, kill_at: int, resume: bool) -> None:
    seed_everything(0, verbose=False)
    checkpoints = ModelCheckpoint(dirpath=directory, every_n_train_steps=CHECKPOINT_EVERY, save_last=True,
                                  save_on_train_epoch_end=False)  # fmt: skip
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=1,
                      callbacks=[SamplerCheckpoint(), checkpoints, KillAt(kill_at)])  # fmt: skip
    last = directory / "last.ckpt"
    trainer.fit(Model(), ckpt_path=last if resume and last.exists() else None)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
