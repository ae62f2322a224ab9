"""Epochs under Lightning with SamplerCheckpoint: each epoch is the sampler's own order for that
epoch, whole, even where Lightning starts iterating before it calls ``set_epoch`` (#21938)."""

from __future__ import annotations

from collections import Counter

import pytest

from stateful_sampler import StatefulSampler
from tests.lightning.lightning_harness import WORKERS, IndexDataset, Setup, fit, model_with


def batched(indices: list[int], size: int) -> list[list[int]]:
    return [indices[start : start + size] for start in range(0, len(indices), size)]


@pytest.mark.parametrize("reload_every", [0, 1])
@pytest.mark.parametrize("num_workers", WORKERS)
def test_each_epoch_is_the_samplers_order_for_that_epoch(num_workers: int, reload_every: int) -> None:
    setup = Setup(num_workers=num_workers)
    run = fit(setup, reload_dataloaders_every_n_epochs=reload_every)
    order = StatefulSampler(setup.size, seed=setup.seed)
    assert run.record == [batch for epoch in range(3) for batch in batched(order.indices(epoch).tolist(), 4)]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_second_fit_on_the_same_loader_starts_again_from_epoch_0(num_workers: int) -> None:
    """The first fit leaves the sampler in its last epoch; with workers Lightning's second fit
    starts drawing before it calls set_epoch(0). 14 records: an epoch is drawn whole at once."""
    setup = Setup(size=14, num_workers=num_workers)
    dataset = IndexDataset(setup.size)
    loader = setup.loader(dataset, StatefulSampler(dataset, seed=setup.seed, batch_size=setup.batch_size))
    first = fit(setup, model_class=model_with(loader)).record
    assert fit(setup, model_class=model_with(loader)).record == first


@pytest.mark.parametrize("num_workers", WORKERS)
def test_carry_keeps_every_epoch_whole_and_sees_each_record_once_a_pass(num_workers: int) -> None:
    """22 records in global batches of 4: epochs of 5, 6, 5, 6, 5 steps, 108 = 5*22 - 2 records;
    the 2 left over are the last two of the fifth pass's permutation."""
    setup = Setup(tail="carry", max_epochs=5, num_workers=num_workers)
    run = fit(setup)
    assert [run.epochs.count(epoch) for epoch in range(5)] == [5, 6, 5, 6, 5]
    assert all(len(batch) == 4 for batch in run.record)
    fifth_pass = StatefulSampler(setup.size, seed=setup.seed, tail="uneven").indices(epoch=4).tolist()
    counts = Counter(index for batch in run.record for index in batch)
    assert counts == Counter({index: 5 for index in range(22)}) - Counter(fifth_pass[-2:])
