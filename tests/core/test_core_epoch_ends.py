"""Issue 17, core side: the epoch's end, early exits, counting, and the smaller refusals; one test per case,
named by behaviour. Exact batch sequences throughout: a restored object must yield what the live one yields."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler import Curriculum, IncompatibleStateError, ResumableLoader, StatefulSampler, Uniform, Weighted
from stateful_sampler.errors import PrefetchedStateError, StalePassError

_LOADER_OPTIONS = ("batches_per_epoch", "rng_states")


def loader_of(size: int = 10, batch: int = 2, workers: int = 0, **kwargs: object) -> ResumableLoader:
    options = {k: kwargs.pop(k) for k in _LOADER_OPTIONS if k in kwargs}
    sampler = StatefulSampler(size, seed=5, **kwargs)  # type: ignore[arg-type]
    loader = DataLoader(range(size), sampler=sampler, batch_size=batch, num_workers=workers)
    return ResumableLoader(loader, **options)  # type: ignore[arg-type]


def restored(live: ResumableLoader, size: int = 10, batch: int = 2, **kwargs: object) -> ResumableLoader:
    twin = loader_of(size, batch, **kwargs)
    twin.load_state_dict(json.loads(json.dumps(live.state_dict())))
    return twin


def batches(iterable: object) -> list[list[int]]:
    return [b.tolist() for b in iterable]  # type: ignore[attr-defined]


def whole(size: int = 10, batch: int = 2, epochs: int = 3) -> list[list[list[int]]]:
    loader = loader_of(size, batch)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append(batches(loader))
    return out


# -- 1. the epoch's end, sampler side


def test_a_sampler_saved_after_its_pass_ended_resumes_to_the_next_epoch_without_set_epoch() -> None:
    live = StatefulSampler(10, seed=1)
    first = list(live)
    twin = StatefulSampler(10, seed=1)
    twin.load_state_dict(live.state_dict())
    assert twin.epoch == live.epoch == 1
    assert list(twin) == list(live) != first


def test_a_sampler_saved_with_its_epoch_drawn_whole_but_not_ended_resumes_to_nothing_then_the_next_epoch() -> None:
    live = StatefulSampler(10, seed=1)
    iterator = iter(live)
    list(itertools.islice(iterator, 10))  # every index drawn, the pass not yet asked past its end
    state = live.state_dict()
    assert (state["epoch"], state["position"], state["epoch_end"]) == (0, 10, 10)
    twin = StatefulSampler(10, seed=1)
    twin.load_state_dict(state)
    assert list(iterator) == list(twin) == []  # nothing more of epoch 0
    assert list(twin) == list(live) == list(StatefulSampler(10, seed=1).indices(1))


def test_a_new_sampler_pass_continues_where_the_abandoned_one_was_drawn_as_a_restored_twin_does() -> None:
    live = StatefulSampler(10, seed=1)
    head = list(itertools.islice(iter(live), 4))
    twin = StatefulSampler(10, seed=1)
    twin.load_state_dict(live.state_dict())
    assert head + list(live) == list(StatefulSampler(10, seed=1))
    assert list(twin) == list(StatefulSampler(10, seed=1))[4:]


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_end_of_epoch_states_inside_and_after_the_loop(workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> StatefulDataLoader:
        return StatefulDataLoader(range(12), sampler=StatefulSampler(12, seed=2), batch_size=1, num_workers=workers)

    loader = make()
    seen = []
    for batch in loader:
        seen.append(batch.item())
        inside = loader.state_dict()
    after = loader.state_dict()
    resumed_inside, resumed_after = make(), make()
    resumed_inside.load_state_dict(inside)
    resumed_after.load_state_dict(after)
    assert [b.item() for b in resumed_inside] == []  # nothing more of epoch 0...
    epoch_1 = [b.item() for b in resumed_inside]  # ...then epoch 1
    assert epoch_1 == [b.item() for b in resumed_after] == [b.item() for b in loader]
    assert sorted(epoch_1) == sorted(seen) == list(range(12)) and epoch_1 != seen


def test_a_restored_finished_pad_epoch_reports_the_live_ranks_len_on_every_rank() -> None:
    lives = [StatefulSampler(10, num_replicas=4, rank=r, shuffle=False) for r in range(4)]
    twins = []
    for live in lives:
        list(itertools.islice(iter(live), 3))
        twin = StatefulSampler(10, num_replicas=4, rank=live.rank, shuffle=False)
        twin.load_state_dict(live.state_dict())
        twins.append(twin)
    assert [len(s) for s in lives] == [len(s) for s in twins] == [3, 3, 3, 3]


def test_a_finished_pad_epoch_restored_on_other_ranks_reports_one_len_on_every_rank() -> None:
    live = StatefulSampler(10, num_replicas=4, rank=0, shuffle=False)
    list(itertools.islice(iter(live), 3))
    state = live.state_dict()
    lengths = []
    for rank in range(3):
        twin = StatefulSampler(10, num_replicas=3, rank=rank, shuffle=False)
        twin.load_state_dict(state)
        lengths.append(len(twin))
    assert lengths == [4, 4, 4]


# -- 2. early exits under ResumableLoader


def test_a_break_then_set_epoch_saves_the_new_epoch_from_its_start_and_epoch_says_so() -> None:
    loader = loader_of()
    for step, _ in enumerate(loader, 1):
        if step == 3:
            break
    assert loader.epoch == 0
    loader.set_epoch(1)
    assert loader.epoch == 1
    state = loader.state_dict()["sampler"]
    assert (state["epoch"], state["position"]) == (1, 0)
    assert batches(restored(loader)) == batches(loader) == whole()[1]


def test_a_loop_that_takes_exactly_len_batches_then_set_epoch_saves_the_new_epoch_whole() -> None:
    loader = loader_of()
    for _, _batch in zip(range(len(loader)), loader):
        pass
    inside = restored(loader)
    assert batches(inside) == []  # consumed to its last batch: nothing more of epoch 0
    loader.set_epoch(1)
    inside.set_epoch(1)
    assert (loader.epoch, len(loader)) == (1, 5)
    assert batches(restored(loader)) == batches(inside) == batches(loader) == whole()[1]


def test_a_state_taken_after_a_new_iter_before_its_first_batch_describes_the_new_pass() -> None:
    loader = loader_of()
    head = []
    for step, batch in enumerate(loader, 1):
        head.append(batch.tolist())
        if step == 2:
            break
    iterator = iter(loader)
    twin = restored(loader)
    assert batches(iterator) == batches(twin) == whole()[0][2:]
    assert head == whole()[0][:2]


def test_two_interleaved_iterators_are_refused_not_mixed() -> None:
    loader = loader_of()
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    with pytest.raises(StalePassError, match="replaced by a newer iter"):
        next(first)
    assert loader.state_dict()["sampler"]["position"] == 4  # 1 batch of the first pass, 1 of the second


def test_an_iterator_made_before_set_epoch_reads_the_epoch_at_its_first_batch() -> None:
    loader = loader_of()
    iterator = iter(loader)
    loader.set_epoch(2)
    assert batches(iterator) == whole()[2]


@pytest.mark.parametrize("save_at", range(8))
def test_batches_per_epoch_caps_each_epoch_and_a_state_saved_anywhere_resumes_exactly(save_at: int) -> None:
    def run(loader: ResumableLoader, stop: int | None) -> tuple[list[tuple[int, list[int]]], dict | None]:
        seen: list[tuple[int, list[int]]] = []
        for epoch in range(loader.epoch, 3):
            loader.set_epoch(epoch)
            for batch in loader:
                seen.append((epoch, batch.tolist()))
                if len(seen) == stop:
                    return seen, loader.state_dict()
            if stop is not None and len(seen) == stop:  # saved after the loop, before the next epoch
                return seen, loader.state_dict()
        return seen, None

    uninterrupted, _ = run(loader_of(batches_per_epoch=3), None)
    assert [e for e, _ in uninterrupted] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [b for _, b in uninterrupted[:3]] == whole()[0][:3]
    head, state = run(loader_of(batches_per_epoch=3), save_at) if save_at else ([], None)
    resumed = loader_of(batches_per_epoch=3)
    if state is not None:
        resumed.load_state_dict(state)
    tail, _ = run(resumed, None)
    assert head + tail == uninterrupted


def test_batches_per_epoch_moves_on_without_set_epoch() -> None:
    loader = loader_of(batches_per_epoch=2)
    assert [batches(loader) for _ in range(3)] == [whole()[e][:2] for e in range(3)]


def test_a_capped_epoch_taken_to_its_cap_without_asking_past_it_resumes_as_the_live_loader_goes_on() -> None:
    # islice / zip(range(len(loader)), loader): the cap's batches taken, the loop never asks for the next
    live = loader_of(batches_per_epoch=2)
    assert batches(itertools.islice(live, 2)) == whole()[0][:2]
    twin = restored(live, batches_per_epoch=2)
    # as without a cap: nothing more of epoch 0, then epoch 1 (the README loop's set_epoch skips the empty pass)
    assert [batches(live), batches(live)] == [batches(twin), batches(twin)] == [[], whole()[1][:2]]


def test_a_capped_epoch_with_no_batch_on_one_rank_leaves_every_rank_in_the_same_epoch() -> None:
    # rank 1 holds no record of N=1; zip(range(len(loader)), loader) never starts its pass
    ranks = [loader_of(1, 1, num_replicas=2, rank=rank, tail="uneven", batches_per_epoch=1) for rank in range(2)]
    for loader in ranks:
        list(zip(range(len(loader)), loader))
    twins = [restored(loader, 1, 1, num_replicas=2, rank=rank, tail="uneven", batches_per_epoch=1)
             for rank, loader in enumerate(ranks)]  # fmt: skip
    for loader in ranks + twins:
        iter(loader)
    assert [loader.epoch for loader in ranks] == [loader.epoch for loader in twins] == [0, 0]


@pytest.mark.parametrize("workers", [0, 2])
def test_len_after_a_mid_epoch_resume_is_the_batches_left_in_the_pass(workers: int) -> None:
    loader = loader_of(workers=workers)
    iterator = iter(loader)
    next(iterator), next(iterator)
    twin = restored(loader)
    assert (len(loader), len(twin), twin.epoch) == (3, 3, 0)
    assert batches(twin) == whole()[0][2:]
    assert (len(twin), twin.epoch) == (5, 1)


def test_the_loader_exposes_its_dataset_batch_size_and_workers() -> None:
    data = list(range(10))
    loader = ResumableLoader(DataLoader(data, sampler=StatefulSampler(10), batch_size=4))
    assert (loader.dataset, loader.batch_size, loader.num_workers, loader.sampler.batch_size) == (data, 4, 0, 4)


# -- 3. DataLoader(batch_size=None): counted per record


def test_a_loader_yielding_records_one_by_one_counts_records_not_sampler_batches() -> None:
    def make() -> ResumableLoader:
        return ResumableLoader(
            DataLoader(range(10), sampler=StatefulSampler(10, seed=5, batch_size=2), batch_size=None)
        )

    loader = make()
    iterator = iter(loader)
    head = [int(next(iterator)) for _ in range(3)]
    assert loader.state_dict()["sampler"]["position"] == 3
    assert loader.batch_size is None and len(loader) == 7  # records left
    twin = make()
    twin.load_state_dict(loader.state_dict())
    assert head + [int(r) for r in twin] == list(StatefulSampler(10, seed=5))


# -- 4. sampler.state_dict() never saves a prefetched position silently


def test_sampler_state_dict_mid_pass_under_workers_is_refused_without_a_loader() -> None:
    sampler = StatefulSampler(40, seed=1, batch_size=2)
    iterator = iter(DataLoader(range(40), sampler=sampler, batch_size=2, num_workers=2))
    next(iterator)
    with pytest.raises(PrefetchedStateError, match="ResumableLoader"):
        sampler.state_dict()
    assert sampler.state_dict(consumed_batches=1)["position"] == 2


def test_sampler_state_dict_under_workers_takes_the_consumed_count_from_its_resumable_loader() -> None:
    loader = loader_of(40, 2, workers=2)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    state = loader.sampler.state_dict()
    assert state["position"] == 6 and loader.sampler._pass.drawn() > 6  # type: ignore[union-attr]
    twin = StatefulSampler(40, seed=5)
    twin.load_state_dict(state)
    assert [index for batch in head for index in batch] + list(twin) == list(StatefulSampler(40, seed=5))


def test_sampler_state_dict_after_a_pass_under_workers_ended_is_the_next_epoch() -> None:
    sampler = StatefulSampler(20, seed=1)
    list(DataLoader(range(20), sampler=sampler, batch_size=2, num_workers=2))
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)


# -- the model side


def test_a_resumed_loader_restores_the_process_rng_states_so_dropout_repeats() -> None:
    loader = loader_of()
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    expected = [torch.rand(3).tolist(), np.random.random(), __import__("random").random()]
    twin = loader_of()
    torch.manual_seed(123)  # the resumed process starts elsewhere
    twin.load_state_dict(state)
    assert [torch.rand(3).tolist(), np.random.random(), __import__("random").random()] == expected
    assert set(state) == {"version", "sampler", "rng_states"} and len(json.dumps(state["sampler"])) < 400


def test_rng_states_false_saves_none_and_restores_nothing() -> None:
    loader = loader_of(rng_states=False)
    state = loader.state_dict()
    assert state["rng_states"] is None
    before = torch.get_rng_state()
    loader.load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_version_1_loader_state_still_loads() -> None:
    loader = loader_of()
    iterator = iter(loader)
    next(iterator)
    state = {"version": 1, "sampler": loader.state_dict()["sampler"]}
    twin = loader_of()
    twin.load_state_dict(state)
    assert batches(twin) == whole()[0][1:]


# -- 9. the smaller ones


def test_a_uniform_strategy_s_shuffle_false_is_kept() -> None:
    assert list(StatefulSampler(6, strategy=Uniform(shuffle=False))) == list(range(6))
    with pytest.raises(ValueError, match=r"shuffle=True contradicts strategy=Uniform\(shuffle=False\)"):
        StatefulSampler(6, shuffle=True, strategy=Uniform(shuffle=False))


def test_weighted_num_samples_beyond_the_largest_epoch_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="num_samples must be at least 1 and at most"):
        Weighted([1.0, 2.0], num_samples=2**63)


def test_a_curriculum_schedule_that_drop_cannot_shard_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"on num_replicas=3 ranks would drop every record \(epoch 1\)"):
        StatefulSampler(4, strategy=Curriculum([0, 0, 1, 1], schedule=[2, 1]), tail="drop", num_replicas=3, rank=0)


def test_a_sampler_state_given_to_the_loader_and_a_loader_state_given_to_the_sampler_name_the_fix() -> None:
    loader = loader_of()
    with pytest.raises(IncompatibleStateError, match=r"this is a sampler state: pass it to the sampler"):
        loader.load_state_dict(loader.sampler.state_dict())
    with pytest.raises(IncompatibleStateError, match=r"pass state\['sampler'\] to the sampler"):
        loader.sampler.load_state_dict(loader.state_dict())


# -- issue 20: DistributedSampler's arguments


def test_distributed_sampler_s_positional_arguments_and_drop_last_are_taken() -> None:
    sampler = StatefulSampler(10, 2, 1, False, 0, True)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.tail.value, sampler.drop_last) == (
        2,
        1,
        False,
        "drop",
        True,
    )
    assert list(sampler) == list(torch.utils.data.DistributedSampler(range(10), 2, 1, False, 0, True))
    assert StatefulSampler(10, drop_last=False).tail.value == "pad"


@pytest.mark.parametrize(("drop_last", "tail"), [(True, "pad"), (True, "uneven"), (False, "drop")])
def test_drop_last_contradicting_tail_is_refused_naming_both(drop_last: bool, tail: str) -> None:
    with pytest.raises(ValueError, match=rf"drop_last={drop_last} contradicts tail='{tail}'"):
        StatefulSampler(10, drop_last=drop_last, tail=tail)


def test_an_iterator_made_before_load_state_dict_begins_at_the_loaded_position() -> None:
    live = loader_of()
    iterator = iter(live)
    next(iterator)
    state = live.state_dict()
    twin = loader_of()
    pending = iter(twin)  # a framework iterates before it restores
    twin.load_state_dict(state)
    assert batches(pending) == whole()[0][1:]


def test_a_capped_epoch_under_workers_that_drew_the_whole_epoch_moves_on_by_one_epoch() -> None:
    loader = loader_of(workers=2, batches_per_epoch=2)
    assert [batches(loader) for _ in range(2)] == [whole()[0][:2], whole()[1][:2]]
    assert loader.epoch == 2
