"""Under a real Lightning ``Trainer`` with ``SamplerCheckpoint``, a run resumed mid-epoch trains on
exactly the augmented values of the run that was never interrupted, whatever the worker counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.seeding import SeededDataset
from tests.lightning.lightning_harness import Callback, LightningModule, SamplerCheckpoint, Trainer
from tests.seeding.test_seeding_loader import BATCH, EPOCHS, SEED, Augmented, perturb_main_rng, rows_of, uninterrupted

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


class AugmentedModel(LightningModule):
    """Trains on ``Augmented`` through ``SeededDataset``; records every sample's row, and saves the
    record in its checkpoints."""

    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.num_workers = num_workers
        self.layer = nn.Linear(1, 1)
        self.record: list[tuple] = []

    def train_dataloader(self) -> DataLoader:
        sampler = StatefulSampler(Augmented(), seed=SEED, batch_size=BATCH, yield_keys=True)
        return DataLoader(SeededDataset(Augmented()), sampler=sampler, batch_size=BATCH, num_workers=self.num_workers)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.record += rows_of(batch)
        samples, _ = batch
        return self.layer(samples[:, 1:2].float()).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["record"] = list(self.record)


class SaveAfter(Callback):
    def __init__(self, directory: Path, batches: tuple[int, ...]) -> None:
        self.directory, self.batches, self.count = directory, batches, 0

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.count += 1
        if self.count in self.batches:
            trainer.save_checkpoint(self.directory / f"batch{self.count}.ckpt")


def fit(num_workers: int, callbacks: list[Callback] = (), ckpt_path: Path | None = None) -> list[tuple]:
    model = AugmentedModel(num_workers)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[SamplerCheckpoint(), *callbacks],
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return model.record


@pytest.mark.parametrize(("save_workers", "resume_workers"), [(0, 0), (2, 2), (2, 0)])
def test_a_resumed_trainer_trains_on_exactly_the_uninterrupted_augmentation(tmp_path, save_workers, resume_workers):
    full = fit(save_workers, [SaveAfter(tmp_path, (3, 8))])
    assert full == uninterrupted(0)  # the plain loop's values, whatever the worker count
    for batches, samples in ((3, 12), (8, 22 + 8)):  # mid epoch 0; mid epoch 1 (6 batches an epoch, 22 samples)
        checkpoint = tmp_path / f"batch{batches}.ckpt"
        before = torch.load(checkpoint, weights_only=False)["record"]
        assert len(before) == samples
        perturb_main_rng(batches)
        assert before + fit(resume_workers, ckpt_path=checkpoint) == full
