"""Issue 17, item 6: a ``ResumableLoader`` returned from ``train_dataloader()`` with ``SamplerCheckpoint`` in
the Trainer. Lightning saves the loader's own state too (it has ``state_dict``); the callback's position
replaces it, so a resume continues exactly instead of failing on an emptied loader state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stateful_sampler import ResumableLoader
from tests.lightning.lightning_harness import WORKERS, RecordingModel, SaveAt, Setup, fit


class ResumableLoaderModel(RecordingModel):
    def train_dataloader(self) -> ResumableLoader:  # type: ignore[override]
        return ResumableLoader(self._train_loader(self.setup_.size, self.setup_.seed))


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("after_batches", [9, 12], ids=["mid-epoch", "epoch-end"])
def test_a_resumable_loader_under_sampler_checkpoint_resumes_to_the_uninterrupted_batches_and_weights(
    num_workers: int, after_batches: int, tmp_path: Path, one_thread: None
) -> None:
    setup = Setup(max_epochs=3, num_workers=num_workers, dropout=0.5)
    save = SaveAt(tmp_path, after_batches=(after_batches,))
    uninterrupted = fit(setup, [save], model_class=ResumableLoaderModel)
    checkpoint = torch.load(save.saved[f"batch{after_batches}"], weights_only=False)
    assert "sampler" in checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]  # Lightning saved it

    resumed = fit(setup, ckpt_path=save.saved[f"batch{after_batches}"], model_class=ResumableLoaderModel)
    assert len(uninterrupted.record) == 18
    assert resumed.record == uninterrupted.record
    assert resumed.epochs == uninterrupted.epochs[after_batches:]
    assert torch.equal(resumed.layer.weight, uninterrupted.layer.weight)
    assert torch.equal(resumed.layer.bias, uninterrupted.layer.bias)
