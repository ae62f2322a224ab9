"""Ways a Lightning fit stops before its end, each followed by a resume in a new ``Trainer``.

Each stop mode takes a ``Setup`` and an empty directory, stops a fit of it part-way, resumes
it, and returns the resumed model: its record (carried through the checkpoints) and weights must
be those of one uninterrupted fit. ``STOP_SETUP``: 22 records in batches of 4, 6 steps an epoch,
3 epochs, a model with dropout (its weights match only if the RNG states resumed too); every stop
falls mid-epoch unless its name says otherwise.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.lightning.lightning_harness import (
    Callback,
    ModelCheckpoint,
    OnExceptionCheckpoint,
    RecordingModel,
    SaveAt,
    Setup,
    Trainer,
    fit,
    make_trainer,
    seed_everything,
)

STOP_SETUP = Setup(max_epochs=3, dropout=0.5)
KILL_AT = 10  # after the checkpoint of step 8
TIMEOUT = 120.0


def every_4_steps(directory: Path) -> ModelCheckpoint:
    return ModelCheckpoint(directory, every_n_train_steps=4, save_top_k=-1, save_last=True)


class Interrupt(Exception):
    pass


class RaiseAt(Callback):
    """Raises ``Interrupt`` when the batch of ``step`` was fetched, before training on it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Interrupt


def sigkill(setup: Setup, directory: Path) -> RecordingModel:
    script = Path(__file__).with_name("killed_run.py")
    arguments = [str(directory), str(setup.num_workers), str(int(setup.stateful_loader))]
    killed = subprocess.run(
        [sys.executable, str(script), *arguments], start_new_session=True, timeout=TIMEOUT, check=False
    )
    assert killed.returncode == -signal.SIGKILL
    assert torch.load(directory / "last.ckpt", weights_only=False)["global_step"] == 8
    return fit(setup, [every_4_steps(directory)], ckpt_path="last", enable_checkpointing=True)


def max_steps_chunks(setup: Setup, directory: Path) -> RecordingModel:
    """The SLURM pattern: the same command in each job, ``max_steps`` growing, resumed from last."""
    for max_steps in (7, 13, -1):
        last = ModelCheckpoint(directory, save_last=True)
        model = fit(setup, [last], ckpt_path="last", max_steps=max_steps, enable_checkpointing=True)
        assert len(model.record) == (max_steps if max_steps > 0 else 18)
    return model


def max_steps_at_epoch_end(setup: Setup, directory: Path) -> RecordingModel:
    """Issue 17 item 1: ``max_steps=6`` ends exactly with epoch 0; the next job must train all of
    epoch 1 (Lightning restarts such a checkpoint inside the finished epoch)."""
    first = fit(setup, [ModelCheckpoint(directory, save_last=True)], max_steps=6, enable_checkpointing=True)
    assert first.epochs == [0] * 6
    last = ModelCheckpoint(directory, save_last=True)
    return fit(setup, [last], ckpt_path="last", max_steps=20, enable_checkpointing=True)


def save_checkpoint_after_fit_at_epoch_end(setup: Setup, directory: Path) -> RecordingModel:
    seed_everything(setup.seed, verbose=False)
    model = RecordingModel(setup)
    trainer = make_trainer(setup, max_steps=12)
    trainer.fit(model)
    assert model.epochs == [0] * 6 + [1] * 6
    trainer.save_checkpoint(directory / "after_fit.ckpt")
    return fit(setup, ckpt_path=directory / "after_fit.ckpt")


def exception_with_on_exception_checkpoint(setup: Setup, directory: Path) -> RecordingModel:
    with pytest.raises(Interrupt):
        fit(setup, [RaiseAt(9), OnExceptionCheckpoint(directory)], enable_checkpointing=True)
    assert torch.load(directory / "on_exception.ckpt", weights_only=False)["global_step"] == 9
    return fit(setup, ckpt_path=directory / "on_exception.ckpt")


def save_checkpoint_after_fit(setup: Setup, directory: Path) -> RecordingModel:
    seed_everything(setup.seed, verbose=False)
    model = RecordingModel(setup)
    trainer = make_trainer(setup, max_steps=9)
    trainer.fit(model)
    trainer.save_checkpoint(directory / "after_fit.ckpt")
    return fit(setup, ckpt_path=directory / "after_fit.ckpt")


def epoch_end(setup: Setup, directory: Path) -> RecordingModel:
    save = SaveAt(directory, after_epochs=(0,))
    fit(setup, [save])
    return fit(setup, ckpt_path=save.saved["epoch0"])


def after_validation(setup: Setup, directory: Path) -> RecordingModel:
    """Validation every 3 steps; the third one falls after step 9, mid epoch 1."""
    validating = setup.with_(validate=True, val_check_interval=3)
    save = SaveAt(directory, after_validations=(3,))
    fit(validating, [save])
    return fit(validating, ckpt_path=save.saved["validation3"])


STOP_MODES: dict[str, Callable[[Setup, Path], RecordingModel]] = {
    "sigkill": sigkill,
    "max-steps-chunks": max_steps_chunks,
    "exception-on-exception-checkpoint": exception_with_on_exception_checkpoint,
    "save-checkpoint-after-fit": save_checkpoint_after_fit,
    "max-steps-at-epoch-end": max_steps_at_epoch_end,
    "save-checkpoint-after-fit-at-epoch-end": save_checkpoint_after_fit_at_epoch_end,
    "epoch-end": epoch_end,
    "after-validation": after_validation,
}
