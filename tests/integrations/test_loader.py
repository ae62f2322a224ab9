"""ResumableLoader: saves the consumed position, not the prefetched one, and refuses what it cannot count."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader

from stateful_sampler import BatchSizeError, IncompatibleStateError, ResumableLoader, StatefulSampler
from stateful_sampler.loader import DoubleShardingError, SamplerNotFoundError, add_batch_hook, add_state_hook


def make_loader(size: int, batch: int, workers: int = 0, **kwargs: object) -> ResumableLoader:
    sampler = StatefulSampler(size, seed=3, batch_size=batch, **kwargs)  # type: ignore[arg-type]
    return ResumableLoader(DataLoader(range(size), sampler=sampler, batch_size=batch, num_workers=workers))


def epoch_batches(loader: ResumableLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_a_resume_continues_after_the_consumed_batch_although_two_workers_prefetched_ahead() -> None:
    uninterrupted = epoch_batches(make_loader(40, 4))
    loader = make_loader(40, 4, workers=2)
    iterator = iter(loader)
    consumed = [next(iterator).tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert loader.sampler._pass.drawn() > 12  # the workers drew ahead of the 3 consumed batches
    assert loader.sampler.state_dict() == state["sampler"]  # and the sampler's own state is the consumed one
    assert state["sampler"]["position"] == 12
    resumed = make_loader(40, 4, workers=2)
    resumed.load_state_dict(state)
    assert consumed + epoch_batches(resumed) == uninterrupted


@given(size=st.integers(1, 60), batch=st.integers(1, 9), data=st.data())
def test_consumed_batches_then_the_resumed_rest_are_the_epoch_for_any_stop(size: int, batch: int, data) -> None:
    uninterrupted = epoch_batches(make_loader(size, batch))
    stop = data.draw(st.integers(0, len(uninterrupted)))
    loader = make_loader(size, batch)
    iterator = iter(loader)
    consumed = [next(iterator).tolist() for _ in range(stop)]
    resumed = make_loader(size, batch)
    resumed.load_state_dict(loader.state_dict())
    assert consumed + epoch_batches(resumed) == uninterrupted


def test_a_state_saved_after_the_pass_ends_resumes_at_the_next_epoch() -> None:
    loader = make_loader(10, 4)
    first_epoch = epoch_batches(loader)
    resumed = make_loader(10, 4)
    resumed.load_state_dict(loader.state_dict())
    # After the loop ended the state is the next epoch's start (torchdata's definition), with or without set_epoch
    assert (resumed.epoch, len(resumed)) == (loader.epoch, len(loader)) == (1, 3)
    assert epoch_batches(resumed) == epoch_batches(loader) != first_epoch
    resumed.set_epoch(2)
    loader.set_epoch(2)
    assert epoch_batches(resumed) == epoch_batches(loader)


def test_the_batch_hook_sees_every_batch_the_loop_gets_with_its_consumed_count() -> None:
    loader = make_loader(10, 4)
    seen: list[tuple[int, list[int], int]] = []
    remove = add_batch_hook(lambda source, batch, consumed: seen.append((id(source), batch.tolist(), consumed)))
    try:
        batches = epoch_batches(loader)
    finally:
        remove()
    assert seen == [(id(loader), batch, count) for count, batch in enumerate(batches, 1)]
    epoch_batches(loader)
    assert len(seen) == 3  # removed


def test_epoch_sync_gets_the_restored_epoch_before_each_pass() -> None:
    synced: list[int] = []
    sampler = StatefulSampler(10, batch_size=5)
    loader = ResumableLoader(DataLoader(range(10), sampler=sampler, batch_size=5), epoch_sync=synced.append)
    sampler.set_epoch(4)
    epoch_batches(loader)
    epoch_batches(loader)  # a finished pass moves the sampler on
    assert synced == [4, 5]


def test_a_loader_without_a_stateful_sampler_is_refused_with_the_fix() -> None:
    with pytest.raises(SamplerNotFoundError, match=r"found none in DataLoader \(sampler: BatchSampler\): build the "
                       r"loader as DataLoader\(dataset, sampler=StatefulSampler\(dataset\), batch_size=B\)"):  # fmt: skip
        ResumableLoader(DataLoader(range(10), shuffle=True, batch_size=2))


def test_a_sampler_without_batch_size_takes_the_loader_s() -> None:  # issue 20: the batch size once
    sampler = StatefulSampler(10)
    loader = ResumableLoader(DataLoader(range(10), sampler=sampler, batch_size=2))
    assert (sampler.batch_size, loader.batch_size, len(loader)) == (2, 2, 5)


def test_a_loader_batch_size_other_than_the_sampler_s_is_refused() -> None:
    sampler = StatefulSampler(10, batch_size=2)
    with pytest.raises(BatchSizeError, match=r"the loader's batch_size=3 contradicts the sampler's batch_size=2"):
        ResumableLoader(DataLoader(range(10), batch_sampler=BatchSampler(sampler, 3, drop_last=False)))


def test_a_stateful_sampler_inside_a_batch_sampler_is_found() -> None:
    sampler = StatefulSampler(10, batch_size=3)
    loader = ResumableLoader(DataLoader(range(10), batch_sampler=BatchSampler(sampler, 3, drop_last=False)))
    assert loader.sampler is sampler
    assert len(loader) == 4


class ShardingWrapper:
    """Accelerate's BatchSamplerShard, as far as the check sees it."""

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = 2


def test_a_wrapper_that_shards_an_already_sharded_sampler_is_refused() -> None:
    sampler = StatefulSampler(10, batch_size=2, num_replicas=2, rank=0)
    wrapper = ShardingWrapper(BatchSampler(sampler, 2, drop_last=False))
    with pytest.raises(DoubleShardingError, match=r"ShardingWrapper \(num_processes=2\) shards the batches of a "
                       r"StatefulSampler that already shards over num_replicas=2.*prepare_loader\(accelerator, loader\)"):  # fmt: skip
        ResumableLoader(DataLoader(range(10), batch_sampler=wrapper))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([], r"state field 'loader state': saved 'list'"),
        ({"version": 4, "sampler": {}}, r"state field 'version': saved 4, expected 3: unknown loader state version"),
        ({"sampler": {}}, r"state field 'version': saved '<missing>', expected 3"),
        ({"version": 1, "sampler": {}, "step": 3}, r"state field 'step': saved 3, expected '<absent>'"),
        ({"version": 1, "sampler": 5}, r"state field 'sampler': saved 5, expected 'a dict from StatefulSampler"),
    ],
)
def test_a_malformed_loader_state_names_its_field(state: object, message: str) -> None:
    loader = make_loader(10, 2)
    with pytest.raises(IncompatibleStateError, match=message):
        loader.load_state_dict(state)  # type: ignore[arg-type]


def test_a_state_of_another_dataset_is_refused_by_the_sampler_and_changes_nothing() -> None:
    other = make_loader(12, 2)
    loader = make_loader(10, 2)
    before = epoch_batches(make_loader(10, 2))
    with pytest.raises(IncompatibleStateError, match=r"state field 'size': saved 12, expected 10"):
        loader.load_state_dict(other.state_dict())
    assert epoch_batches(loader) == before


def test_the_loader_epoch_is_the_pass_s_epoch_until_the_loop_has_its_last_batch() -> None:
    loader = make_loader(12, 4, workers=2)
    loader.set_epoch(3)
    epochs_seen = [(loader.epoch, loader.sampler.epoch) for _ in loader]
    assert [epoch for epoch, _ in epochs_seen] == [3, 3, 3]
    assert epochs_seen[-1][1] == 4  # the workers drew the whole pass before the loop had its last batch
    assert loader.epoch == 4


def test_the_state_hook_hears_of_each_checkpoint_with_the_consumed_batches_it_saves() -> None:
    loader = make_loader(10, 4)
    heard: list[int] = []
    remove = add_state_hook(lambda source, consumed: heard.append(consumed))
    try:
        loader.state_dict()
        iterator = iter(loader)
        next(iterator)
        next(iterator)
        loader.state_dict()
    finally:
        remove()
    loader.state_dict()
    assert heard == [0, 2]


def test_starting_a_pass_draws_nothing_from_torch_s_global_rng_so_a_mid_epoch_resume_keeps_dropout_in_step() -> None:
    loader = make_loader(10, 4, workers=1)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    iterator = iter(loader)
    next(iterator)
    assert torch.equal(torch.rand(3), expected)


def test_a_pass_s_worker_base_seed_depends_on_the_epoch_only_so_a_resumed_pass_gets_the_same() -> None:
    loader = make_loader(10, 4)
    loader.set_epoch(2)
    next(iter(loader))
    generator = loader.loader.generator
    resumed = make_loader(10, 4)
    resumed.load_state_dict(loader.state_dict())
    next(iter(resumed))
    assert torch.equal(resumed.loader.generator.get_state(), generator.get_state())
