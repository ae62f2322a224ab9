"""A step-based checkpoint written after an epoch's last batch (``every_n_train_steps``, ``max_steps``
landing on the epoch's end), resumed with ``SamplerCheckpoint``: Lightning restarts it inside the
finished epoch, still counting that epoch's batches, and the callback begins the train pass again to
restore the RNG states. The pass begun again must count from the next epoch's start (it counted
from the finished epoch's 6 batches, and the first save of the resumed fit raised
"consumed_batches must be at least 0, got -5" whenever the pass starts inside ``iter(loader)``:
DataLoader workers, a ``ShardedStream``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.lightning.lightning_harness import WORKERS, ModelCheckpoint, Setup, fit

SETUP = Setup(max_epochs=3, dropout=0.5)  # 22 records in batches of 4: 6 steps an epoch, 18 in all


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_step_checkpoint_after_an_epochs_last_batch_resumes_to_the_uninterrupted_fit(
    num_workers: int, tmp_path: Path, one_thread: None
) -> None:
    setup = SETUP.with_(num_workers=num_workers)
    reference = fit(setup)

    def every_step() -> ModelCheckpoint:
        return ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=1)

    first = fit(setup, [every_step()], max_steps=6, enable_checkpointing=True)
    assert first.epochs == [0] * 6
    resumed = fit(setup, [every_step()], ckpt_path=tmp_path / "last.ckpt", enable_checkpointing=True)
    assert len(reference.record) == 18
    assert resumed.record == reference.record  # the model's record is saved with it: the whole fit's
    assert resumed.epochs == [1] * 6 + [2] * 6
    assert torch.equal(resumed.layer.weight, reference.layer.weight)
    assert torch.equal(resumed.layer.bias, reference.layer.bias)
