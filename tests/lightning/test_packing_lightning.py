"""PackedRows under a real Lightning Trainer with SamplerCheckpoint: a resume from mid-epoch and end-of-epoch
checkpoints sees exactly the rows of the uninterrupted run (harness: tests/lightning/lightning_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler import PackedDataset, PackedRows
from tests.lightning.lightning_harness import RecordingModel, SaveAt, Setup, fit

LENGTHS = np.random.default_rng(0).integers(1, 12, 60)
DOCUMENTS = [list(range(1, n + 1)) for n in LENGTHS]


class PackedModel(RecordingModel):
    split = False

    def _train_loader(self, size: int, seed: int) -> DataLoader:
        rows = PackedRows(
            LENGTHS, 16, split_records=self.split, window=16, seed=seed, batch_size=self.setup_.batch_size
        )
        packed = PackedDataset(DOCUMENTS, rows)
        loader = DataLoader(packed, sampler=rows, batch_size=self.setup_.batch_size, collate_fn=packed.collate,
                            num_workers=self.setup_.num_workers)  # fmt: skip
        self.train_loaders.append(loader)
        return loader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.record.append([[int(e), int(r)] for e, r in zip(batch["epochs"], batch["rows"])])
        self.epochs.append(self.current_epoch)
        return self.layer(batch["input_ids"].float().mean(1, keepdim=True)).pow(2).mean()


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_lightning_resumes_packed_rows_exactly_from_each_checkpoint(split: bool, tmp_path: Path) -> None:
    model_class = type("Model", (PackedModel,), {"split": split})
    setup = Setup(max_epochs=2)
    save = SaveAt(tmp_path, after_batches=(2, 7), after_epochs=(0,))
    uninterrupted = fit(setup, [save], model_class=model_class)
    assert len(save.saved) == 3 and len(uninterrupted.record) > 7
    assert [row for step in uninterrupted.record for row in step][:3] == [[0, 0], [0, 1], [0, 2]]
    for checkpoint in save.saved.values():
        assert fit(setup, ckpt_path=checkpoint, model_class=model_class).record == uninterrupted.record, checkpoint.name
