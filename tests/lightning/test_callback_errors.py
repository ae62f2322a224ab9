"""Setups that SamplerCheckpoint cannot resume exactly fail before the first training step, with a
message that names the fix; incompatible checkpoints fail with ``IncompatibleStateError``."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader, RandomSampler

from stateful_sampler import BatchSizeError, IncompatibleStateError, StatefulSampler
from stateful_sampler.lightning import SamplerSetupError
from tests.lightning.lightning_harness import (
    WORKERS,
    DistributedSamplerWrapper,
    IndexDataset,
    SaveAt,
    Setup,
    fit,
    model_with,
)

DATASET = IndexDataset(22)


def fit_fails(loader: DataLoader, error: type[Exception] = SamplerSetupError) -> str:
    """The message of the error fit raises, after checking that not one training step ran."""
    model_class = model_with(loader)
    ran: list[list[int]] = []
    model_class.on_train_batch_start = lambda self, batch, index: ran.append(batch)  # type: ignore[method-assign]
    with pytest.raises(error) as raised:
        fit(Setup(), model_class=model_class)
    assert ran == []
    return str(raised.value)


def test_a_plain_shuffled_loader_is_refused_with_the_fix() -> None:
    assert fit_fails(DataLoader(DATASET, batch_size=4, shuffle=True)) == (
        "train dataloader 0 (DataLoader with RandomSampler) has no StatefulSampler, so a resumed run would replay "
        "or skip batches: use DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B) instead of "
        "shuffle=True"
    )


def test_a_loader_batch_size_that_contradicts_the_sampler_is_refused() -> None:
    sampler = StatefulSampler(DATASET, batch_size=8)
    assert fit_fails(DataLoader(DATASET, sampler=sampler, batch_size=4), BatchSizeError) == (
        "train dataloader 0: DataLoader batch_size=4 contradicts StatefulSampler batch_size=8; pass the same "
        "value to both"
    )


def test_a_sampler_without_batch_size_takes_the_loader_s() -> None:
    sampler = StatefulSampler(DATASET)
    model = fit(Setup(), model_class=model_with(DataLoader(DATASET, sampler=sampler, batch_size=4)), max_epochs=1)
    assert sampler.batch_size == 4  # the batch size is asked once: the DataLoader's
    assert [len(batch) for batch in model.record] == [4, 4, 4, 4, 4, 2]
    assert sorted(index for batch in model.record for index in batch) == list(range(22))


def test_a_sampler_wrapped_by_lightning_is_refused() -> None:
    wrapped = DistributedSamplerWrapper(RandomSampler(DATASET), num_replicas=1, rank=0)
    assert fit_fails(DataLoader(DATASET, sampler=wrapped, batch_size=4)) == (
        "train dataloader 0: Lightning wrapped its RandomSampler in DistributedSamplerWrapper, which replays the "
        "whole order every epoch; give the DataLoader a StatefulSampler directly: "
        "DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B)"
    )


def test_loaders_that_lightning_would_cycle_are_refused() -> None:
    """Under the default ``max_size_cycle`` a shorter loader restarts mid-epoch: nothing to resume."""
    with pytest.raises(SamplerSetupError) as raised:
        fit(Setup(second_loader_size=12))
    assert str(raised.value) == (
        "train dataloaders of [6, 3] batches an epoch: CombinedLoader mode 'max_size_cycle' (the default for "
        "several loaders) restarts the shorter ones mid-epoch, which no checkpoint can resume; give them equal "
        "lengths or return CombinedLoader(loaders, mode='max_size') or mode='min_size'"
    )


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_checkpoint_of_another_order_is_refused(num_workers: int, tmp_path: Path) -> None:
    setup = Setup(num_workers=num_workers)
    save = SaveAt(tmp_path, after_batches=(3,))
    fit(setup, [save])
    with pytest.raises(IncompatibleStateError) as raised:
        fit(setup.with_(seed=4), ckpt_path=save.saved["batch3"])
    assert str(raised.value) == "state field 'seed': saved 3, expected 4: the state belongs to another order"


def test_a_checkpoint_with_another_number_of_samplers_is_refused(tmp_path: Path) -> None:
    save = SaveAt(tmp_path, after_batches=(3,))
    fit(Setup(), [save])
    with pytest.raises(IncompatibleStateError) as raised:
        fit(Setup(second_loader_size=22), ckpt_path=save.saved["batch3"])
    assert str(raised.value) == (
        "state field 'SamplerCheckpoint samplers': saved 1, expected 2: the checkpoint holds one state per "
        "StatefulSampler of the train loaders"
    )


def test_a_mid_epoch_checkpoint_saved_without_the_callback_is_refused(tmp_path: Path) -> None:
    save = SaveAt(tmp_path, after_batches=(3,), after_epochs=(0,))
    fit(Setup(callback=False), [save])
    with pytest.raises(SamplerSetupError) as raised:
        fit(Setup(), ckpt_path=save.saved["batch3"])
    assert str(raised.value) == (
        f"checkpoint {save.saved['batch3']} was saved mid-epoch without SamplerCheckpoint, so where the epoch "
        f"stopped is unknown: resume from an end-of-epoch checkpoint, or from one saved with SamplerCheckpoint in "
        f"the Trainer's callbacks"
    )
