"""PackedStream under a real Lightning Trainer with SamplerCheckpoint: a resume from mid-epoch and end-of-epoch
checkpoints sees exactly the rows of the uninterrupted run (harness: tests/lightning/lightning_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler.stream import PackedStream
from tests.lightning.lightning_harness import RecordingModel, SaveAt, Setup, fit
from tests.stream.test_packed_stream import make_stream


class PackedStreamModel(RecordingModel):
    def _train_loader(self, size: int, seed: int) -> DataLoader:
        rows = PackedStream(make_stream(), 16, batch_size=self.setup_.batch_size, window=8)
        loader = rows.loader(num_workers=self.setup_.num_workers)
        self.train_loaders.append(loader)
        return loader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.record.append([[int(e), int(r)] for e, r in zip(batch["epochs"], batch["rows"])])
        self.epochs.append(self.current_epoch)
        return self.layer(batch["input_ids"].float().mean(1, keepdim=True)).pow(2).mean()


@pytest.mark.slow
def test_lightning_resumes_a_packed_stream_exactly_from_each_checkpoint(tmp_path: Path) -> None:
    setup = Setup(max_epochs=2)
    save = SaveAt(tmp_path, after_batches=(2, 5), after_epochs=(0,))
    uninterrupted = fit(setup, [save], model_class=PackedStreamModel)
    assert len(save.saved) == 3 and len(uninterrupted.record) > 5
    assert [row for step in uninterrupted.record for row in step][:3] == [[0, 0], [0, 1], [0, 2]]
    for checkpoint in save.saved.values():
        assert fit(setup, ckpt_path=checkpoint, model_class=PackedStreamModel).record == uninterrupted.record
