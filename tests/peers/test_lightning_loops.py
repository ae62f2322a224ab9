"""Lightning's own ``test_fit_loop_save_and_restore_dataloaders``, with torchdata's ``StatefulDataLoader`` over a
``StatefulSampler`` as the stateful train loader (issue 17, item 5).

Ported from github:Lightning-AI/pytorch-lightning, tests/tests_pytorch/loops/test_loops.py at commit
7f0c3436cd3f6ad3753125672024fc415cbcb414 (the case "Single stateful DataLoader").

Upstream, a stateful iterable that ignores epochs continues after ``fit(max_steps=2)`` and ``save_checkpoint``.
Lightning counts the epoch that ``max_steps`` stopped as processed, so on resume it calls ``set_epoch(1)``:
a ``StatefulSampler`` obeys it (a restored sampler behaves as the live one would), and without
``SamplerCheckpoint`` there is nothing that could tell it the call is Lightning's miscount. So our contract
is: without the callback the resume is refused with the fix named (the guard Lightning loads from our entry
point); with it, the resume continues exactly where the uninterrupted fit goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.lightning import SamplerSetupError
from tests.lightning.lightning_harness import (
    WORKERS,
    LightningModule,
    SamplerCheckpoint,
    Trainer,
    install_resume_guard,
)

SIZE = 10


class DummyModel(LightningModule):
    """Upstream's DummyModel over BoringModel: records each batch. Adaptation: the records are the
    indices a StatefulSampler (batch_size=1, like the upstream iterable's one record per step) yields."""

    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.num_workers = num_workers
        self.seen_data: list[list[int]] = []
        self.epochs: list[int] = []  # adaptation: the epoch Lightning trains each batch in

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen_data.append(batch.tolist())
        self.epochs.append(self.current_epoch)
        return self.layer(batch.float().unsqueeze(1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> StatefulDataLoader:
        sampler = StatefulSampler(SIZE, seed=1, batch_size=1)
        return StatefulDataLoader(list(range(SIZE)), sampler=sampler, batch_size=1, num_workers=self.num_workers)


def trainer_kwargs(tmp_path: Path, callbacks: list[Any]) -> dict[str, Any]:
    return {
        "default_root_dir": tmp_path,
        "accelerator": "cpu",
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "logger": False,
        "num_sanity_val_steps": 0,
        "callbacks": callbacks,  # adaptation: with or without SamplerCheckpoint
    }


def first_run(tmp_path: Path, num_workers: int, callbacks: list[Any]) -> tuple[list[list[int]], Path]:
    """Upstream's "Train for 2 steps" and "Save a checkpoint", asserting the same things."""
    model = DummyModel(num_workers)
    trainer = Trainer(**trainer_kwargs(tmp_path, callbacks), max_steps=2)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "checkpoint.ckpt")
    checkpoint = torch.load(tmp_path / "checkpoint.ckpt", weights_only=True)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]  # upstream: has_state
    return model.seen_data, tmp_path / "checkpoint.ckpt"


def uninterrupted(tmp_path: Path, num_workers: int) -> DummyModel:
    """Adaptation: the expected batches are those of one fit(max_steps=4), not a fixed list."""
    model = DummyModel(num_workers)
    Trainer(**trainer_kwargs(tmp_path / "uninterrupted", [SamplerCheckpoint()]), max_steps=4).fit(model)
    return model


@pytest.mark.parametrize("num_workers", WORKERS)
def test_fit_loop_save_and_restore_dataloaders_with_sampler_checkpoint(
    num_workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_resume_guard(monkeypatch, tmp_path / "entry-points")  # the guard lets a fit with the callback be
    expected = uninterrupted(tmp_path, num_workers)
    assert expected.epochs == [0, 0, 0, 0]
    batches_before, checkpoint = first_run(tmp_path, num_workers, [SamplerCheckpoint()])
    assert batches_before == expected.seen_data[:2]

    # Restore training from step 2 and continue 2 more steps
    model = DummyModel(num_workers)
    trainer = Trainer(**trainer_kwargs(tmp_path, [SamplerCheckpoint()]), max_steps=4)
    trainer.fit(model, ckpt_path=checkpoint)
    assert model.seen_data == expected.seen_data[2:]
    assert model.epochs == [0, 0]  # as in the uninterrupted fit: Lightning's count of the stopped epoch repaired


@pytest.mark.parametrize("num_workers", WORKERS)
def test_fit_loop_save_and_restore_dataloaders_without_sampler_checkpoint_is_refused(
    num_workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_resume_guard(monkeypatch, tmp_path / "entry-points")
    batches_before, checkpoint = first_run(tmp_path, num_workers, [])
    assert len(batches_before) == 2

    model = DummyModel(num_workers)
    trainer = Trainer(**trainer_kwargs(tmp_path, []), max_steps=4)
    with pytest.raises(SamplerSetupError) as refused:
        trainer.fit(model, ckpt_path=checkpoint)
    assert str(refused.value) == (
        f"Trainer.fit(ckpt_path={str(checkpoint)!r}) resumes a train dataloader with a StatefulSampler, but "
        f"SamplerCheckpoint is not among the Trainer's callbacks: Lightning's checkpoint does not hold where the "
        f"sampler stopped, and its epoch count moves the sampler to the wrong place (a replay mid-epoch, the next "
        f"epoch's order after a max_steps stop), with a DataLoader or torchdata's StatefulDataLoader. Add "
        f"stateful_sampler.lightning.SamplerCheckpoint() to Trainer(callbacks=[...]) (an end-of-epoch checkpoint "
        f"saved without it resumes exactly with it)"
    )
    assert model.seen_data == []  # refused before the first resumed step


def test_the_guard_is_declared_for_both_lightning_packages() -> None:
    """The guard reaches users through these entry points; the tests above install the same ones."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    entry_points = pyproject["project"]["entry-points"]
    assert entry_points["lightning.pytorch.callbacks_factory"] == {
        "stateful_sampler": "stateful_sampler.lightning.guard:lightning_guard"
    }
    assert entry_points["pytorch_lightning.callbacks_factory"] == {
        "stateful_sampler": "stateful_sampler.lightning.guard:pytorch_lightning_guard"
    }
