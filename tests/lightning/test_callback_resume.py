"""Resume equality under Lightning: a run resumed from any checkpoint sees exactly the batches of
the run that was never interrupted (issue 3, "What must hold" 1-4 and 6 on one process)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader

from stateful_sampler import StatefulSampler
from tests.helpers import scaled_examples
from tests.lightning.lightning_harness import (
    RELEASE,
    WORKERS,
    Callback,
    IndexDataset,
    ModelCheckpoint,
    RecordingModel,
    SaveAt,
    Setup,
    SingleDeviceStrategy,
    Trainer,
    fit,
    resumed_record,
    setups,
    without_resume_guard,
)

# 22 records in batches of 4: 6 steps an epoch, the last one of 2 records. batch3 is mid epoch 0,
# batch6 is its last batch, batch8 is mid epoch 1; epoch0/epoch1 are end-of-epoch checkpoints.
POINTS = {"after_batches": (3, 6, 8), "after_epochs": (0, 1)}
CHECKPOINTS = {"batch3", "batch6", "batch8", "epoch0", "epoch1"}

CASES = {
    "workers0": Setup(),
    "workers2": Setup(num_workers=2),
    "workers2-persistent": Setup(num_workers=2, persistent_workers=True),
    "stepping-batches-in-configure-optimizers": Setup(read_stepping_batches=True),
    "stepping-batches-in-configure-optimizers-workers2": Setup(read_stepping_batches=True, num_workers=2),
    "accumulate-grad-batches-2": Setup(accumulate_grad_batches=2),
    "tail-drop": Setup(tail="drop"),
    "tail-uneven": Setup(tail="uneven"),
    "loader-drop-last": Setup(drop_last=True),
    "tail-carry": Setup(tail="carry", max_epochs=4),
    "tail-carry-workers2": Setup(tail="carry", max_epochs=4, num_workers=2),
}


@pytest.mark.parametrize("setup", setups(CASES))
def test_resume_from_each_checkpoint_sees_the_uninterrupted_batches(setup: Setup, tmp_path: Path) -> None:
    save = SaveAt(tmp_path, **POINTS)
    uninterrupted = fit(setup, [save]).record
    assert set(save.saved) == CHECKPOINTS
    for name, checkpoint in save.saved.items():
        assert resumed_record(setup, checkpoint) == uninterrupted, f"resumed from {name}"


class BatchSamplerModel(RecordingModel):
    """The StatefulSampler sits at ``loader.batch_sampler.sampler``, the loader has no batch_size."""

    def train_dataloader(self) -> DataLoader:
        dataset = IndexDataset(self.setup_.size)
        sampler = StatefulSampler(dataset, seed=self.setup_.seed, batch_size=4)
        batches = BatchSampler(sampler, batch_size=4, drop_last=False)
        return DataLoader(dataset, batch_sampler=batches, num_workers=self.setup_.num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_sampler_inside_a_batch_sampler_resumes_exactly(num_workers: int, tmp_path: Path) -> None:
    setup = Setup(num_workers=num_workers)
    save = SaveAt(tmp_path, **POINTS)
    uninterrupted = fit(setup, [save], model_class=BatchSamplerModel).record
    assert set(save.saved) == CHECKPOINTS
    for name, checkpoint in save.saved.items():
        assert resumed_record(setup, checkpoint, model_class=BatchSamplerModel) == uninterrupted, name


class RestoresAfterSetup(SingleDeviceStrategy):
    """Like FSDP and DeepSpeed: the checkpoint is read after configure_optimizers."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


LATE_RESTORE = {
    "workers0": Setup(read_stepping_batches=True),
    "workers2": Setup(read_stepping_batches=True, num_workers=2),
    "workers2-persistent": Setup(read_stepping_batches=True, num_workers=2, persistent_workers=True),
}


@pytest.mark.parametrize("setup", setups(LATE_RESTORE))
def test_a_strategy_that_restores_after_setup_resumes_exactly(setup: Setup, tmp_path: Path) -> None:
    """With estimated_stepping_batches read in configure_optimizers, the workers start drawing
    before such a strategy reads the checkpoint."""
    save = SaveAt(tmp_path, after_batches=(3, 8))
    uninterrupted = fit(setup, [save]).record
    for name, checkpoint in save.saved.items():
        assert resumed_record(setup, checkpoint, strategy=RestoresAfterSetup("cpu")) == uninterrupted, name


@pytest.mark.parametrize("num_workers", WORKERS)
def test_an_end_of_epoch_checkpoint_saved_without_the_callback_resumes_exactly(
    num_workers: int, tmp_path: Path
) -> None:
    """Also when configure_optimizers reads estimated_stepping_batches: the workers then start an
    epoch before Lightning has restored which one (#20550)."""
    setup = Setup(num_workers=num_workers, read_stepping_batches=True)
    save = SaveAt(tmp_path, after_batches=(6,), after_epochs=(0, 1))
    uninterrupted = fit(setup.with_(callback=False), [save]).record
    for name, checkpoint in save.saved.items():
        assert resumed_record(setup, checkpoint) == uninterrupted, name


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_checkpoint_written_after_resuming_an_epoch_end_saved_without_the_callback_resumes_exactly(
    num_workers: int, tmp_path: Path
) -> None:
    """The resumed fit begins its pass again at on_train_start, while Lightning still counts the
    finished epoch's 6 batches: that pass is the next epoch's, from its first batch (with workers it
    was counted 6 batches in, and the save 2 batches later was refused with consumed_batches=-4)."""
    setup = Setup(num_workers=num_workers)
    first = SaveAt(tmp_path / "first", after_batches=(6,))
    second = SaveAt(tmp_path / "second", after_batches=(2,))
    first.directory.mkdir()
    second.directory.mkdir()
    uninterrupted = fit(setup.with_(callback=False), [first]).record
    assert fit(setup, [second], ckpt_path=first.saved["batch6"]).record == uninterrupted
    assert resumed_record(setup, second.saved["batch2"]) == uninterrupted


def test_the_record_tells_a_broken_resume_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: without the callback, Lightning replays the epoch's first batches after a mid-epoch resume
    (Lightning alone: the guard of our entry point refuses this resume)."""
    without_resume_guard(monkeypatch)
    setup = Setup(callback=False)
    save = SaveAt(tmp_path, after_batches=(3,))
    uninterrupted = fit(setup, [save]).record
    resumed = resumed_record(setup, save.saved["batch3"])
    assert resumed[3:6] == uninterrupted[:3]
    assert resumed != uninterrupted


@pytest.mark.parametrize("num_workers", WORKERS)
def test_validation_mid_epoch_is_neither_disturbed_nor_given_the_train_state(num_workers: int, tmp_path: Path) -> None:
    """Checkpoints saved after a mid-epoch validation whose loader also uses a StatefulSampler."""
    setup = Setup(validate=True, val_check_interval=3, num_workers=num_workers)
    save = SaveAt(tmp_path, after_validations=(1, 3))  # after steps 3 and 9: mid epoch 0 and mid epoch 1
    uninterrupted = fit(setup, [save])
    one_validation = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert uninterrupted.val_record == one_validation * 6
    for done, name in [(1, "validation1"), (3, "validation3")]:
        resumed = fit(setup, ckpt_path=save.saved[name])
        assert resumed.record == uninterrupted.record, f"resumed from {name}"
        if RELEASE >= (2, 5):  # Lightning 2.4 runs the interrupted validation's first batch again
            assert resumed.val_record == one_validation * (6 - done), f"resumed from {name}"


TWICE = {
    "workers0": Setup(),
    "workers2": Setup(num_workers=2),
    "carry-workers2": Setup(tail="carry", max_epochs=4, num_workers=2),
}


@pytest.mark.parametrize("first_checkpoint", ["batch8", "batch6", "epoch0"])
@pytest.mark.parametrize("setup", setups(TWICE))
def test_a_checkpoint_written_by_a_resumed_run_resumes_exactly(
    setup: Setup, first_checkpoint: str, tmp_path: Path
) -> None:
    """A run that crashes twice; the second checkpoint is written 2 steps into the resumed run.
    With workers the resumed pass is drawn whole before Lightning calls ``set_epoch`` on it, which
    must not lose where that pass began."""
    first = SaveAt(tmp_path / "first", after_batches=(6, 8), after_epochs=(0,))
    second = SaveAt(tmp_path / "second", after_batches=(2,))
    first.directory.mkdir()
    second.directory.mkdir()
    uninterrupted = fit(setup, [first]).record
    assert fit(setup, [second], ckpt_path=first.saved[first_checkpoint]).record == uninterrupted
    assert resumed_record(setup, second.saved["batch2"]) == uninterrupted


class Interrupt(Exception):
    pass


class InterruptAfter(Callback):
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_end(self, trainer: Trainer, *args: object) -> None:
        self.batches -= 1
        if self.batches == 0:
            raise Interrupt


@pytest.mark.parametrize("num_workers", WORKERS)
def test_an_interrupted_run_resumes_from_last_of_a_step_based_model_checkpoint(
    num_workers: int, tmp_path: Path
) -> None:
    setup = Setup(num_workers=num_workers)
    uninterrupted = fit(setup).record

    def checkpointing() -> ModelCheckpoint:
        return ModelCheckpoint(tmp_path, every_n_train_steps=4, save_on_train_epoch_end=False, save_last=True)

    with pytest.raises(Interrupt):
        fit(setup, [checkpointing(), InterruptAfter(11)], enable_checkpointing=True)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 8
    resumed = fit(setup, [checkpointing()], ckpt_path="last", enable_checkpointing=True)
    assert resumed.record == uninterrupted


WITHOUT_CHECKPOINT = {
    "workers0": Setup(),
    "workers2": Setup(num_workers=2),
    "validation": Setup(validate=True, val_check_interval=3),
}


@pytest.mark.parametrize("setup", setups(WITHOUT_CHECKPOINT))
def test_without_a_checkpoint_the_callback_changes_nothing(setup: Setup) -> None:
    with_callback = fit(setup)
    without = fit(setup.with_(callback=False))
    assert with_callback.record == without.record
    assert with_callback.val_record == without.val_record
    assert torch.equal(with_callback.layer.weight, without.layer.weight)


@settings(max_examples=scaled_examples(40), deadline=None)
@given(
    tail=st.sampled_from(["pad", "drop", "uneven", "carry"]),
    size=st.integers(5, 23),
    batch_size=st.integers(1, 5),
    accumulate=st.integers(1, 2),
    drop_last=st.booleans(),
    validate_twice_an_epoch=st.booleans(),
    data=st.data(),
)
def test_any_checkpoint_of_any_policy_resumes_exactly(
    tail: str,
    size: int,
    batch_size: int,
    accumulate: int,
    drop_last: bool,
    validate_twice_an_epoch: bool,
    data: st.DataObject,
) -> None:
    setup = Setup(
        size=size,
        batch_size=batch_size,
        tail=tail,
        accumulate_grad_batches=accumulate,
        drop_last=drop_last,
        validate=validate_twice_an_epoch,
        val_check_interval=0.5 if validate_twice_an_epoch else 1.0,
        max_epochs=3,
    )
    with tempfile.TemporaryDirectory() as directory:
        save = SaveAt(Path(directory), after_batches=range(1, 100), after_epochs=(0, 1), after_validations=(1, 2, 3))
        uninterrupted = fit(setup, [save]).record
        name = data.draw(st.sampled_from(sorted(save.saved)), label="checkpoint")
        assert resumed_record(setup, save.saved[name]) == uninterrupted


@pytest.mark.parametrize("callback", [True, False])
def test_lightnings_not_resumable_warning_is_silenced_only_when_the_samplers_carry_the_position(
    callback: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    without_resume_guard(monkeypatch)  # without the callback: Lightning alone, whose warning this is
    setup = Setup(callback=callback)
    save = SaveAt(tmp_path, after_batches=(3,))
    fit(setup, [save])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(setup, ckpt_path=save.saved["batch3"])
        after_fit = list(warnings.filters)
    not_resumable = [w for w in caught if "dataloader is not resumable" in str(w.message)]
    assert len(not_resumable) == (0 if callback else 1)
    assert after_fit[0][0] == "always"  # the callback took its filter away when the fit ended
