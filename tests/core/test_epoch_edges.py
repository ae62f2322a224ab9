"""Issue 17, one regression test per numbered case (1-4, 7 on the sampler side, 9), named by behaviour.

Each test is written as a user would meet the case: a run that saves at the edge in question and a
resumed run must together train exactly the batches, in exactly the order, of the run that was never
interrupted (docs/core.md, "Epoch ends and early exits"), or the call is refused with a specific
error. Lightning, Accelerate, Fabric and the HF Trainer (the rest of cases 1, 2, 5-8) are tested
under tests/lightning and tests/integrations.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import (
    Curriculum,
    Grouped,
    IncompatibleStateError,
    ResumableLoader,
    StatefulSampler,
    Uniform,
    Weighted,
)
from stateful_sampler.errors import PrefetchedStateError

SEED = 11


def sampler_of(size: int, **kwargs: Any) -> StatefulSampler:
    return StatefulSampler(size, seed=SEED, **kwargs)


def loader_of(size: int = 10, batch: int = 3, workers: int = 0, *, loader_kwargs: dict | None = None,
              **sampler_kwargs: Any) -> ResumableLoader:  # fmt: skip
    sampler = sampler_of(size, **sampler_kwargs)
    return ResumableLoader(DataLoader(list(range(size)), sampler=sampler, batch_size=batch, num_workers=workers),
                           **(loader_kwargs or {}))  # fmt: skip


def through_json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def as_lists(batches: Any) -> list[list[int]]:
    return [batch.tolist() for batch in batches]


def readme_loop(loader: ResumableLoader, epochs: int, log: list[Any],
                stop: Callable[[int, int | None], bool] = lambda epoch, step: False) -> dict[str, Any] | None:  # fmt: skip
    """The README's loop; ``log`` gets every batch and every epoch's per-epoch work ("end", e). Returns
    the state saved where ``stop(epoch, step)`` first says so (step None: after the epoch's loop and
    its per-epoch work), the run then ending as a killed one does."""
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader, 1):
            log.append(batch.tolist())
            if stop(epoch, step):
                return through_json(loader.state_dict())
        log.append(("end", epoch))  # an LR scheduler step, a validation
        if stop(epoch, None):
            return through_json(loader.state_dict())
    return None


# -- 1. The epoch's end


def test_1_a_sampler_saved_after_its_pass_ended_resumes_to_the_next_epoch_without_set_epoch() -> None:
    live = sampler_of(7)
    list(live)
    resumed = sampler_of(7)
    resumed.load_state_dict(through_json(live.state_dict()))
    assert list(resumed) == list(live) == sampler_of(7).indices(1).tolist()
    assert resumed.epoch == live.epoch == 2


def test_1_a_sampler_saved_after_its_last_index_inside_the_loop_resumes_to_nothing_then_the_next_epoch() -> None:
    live = sampler_of(7)
    iterator = iter(live)
    for _ in range(7):
        next(iterator)
    resumed = sampler_of(7)
    resumed.load_state_dict(through_json(live.state_dict()))
    assert list(iterator) == list(resumed) == []  # nothing more of epoch 0...
    assert list(resumed) == list(live) == sampler_of(7).indices(1).tolist()  # ...then epoch 1 in full


@pytest.mark.parametrize("inside", [True, False], ids=["inside-the-loop", "after-the-loop"])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_1_torchdata_states_at_the_epochs_end_resume_as_torchdata_defines_it(workers: int, inside: bool) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def sdl() -> StatefulDataLoader:
        return StatefulDataLoader(list(range(9)), sampler=sampler_of(9), batch_size=2, num_workers=workers)

    live = sdl()
    epoch0, state = [], None
    for batch in live:
        epoch0.append(batch.tolist())
        state = live.state_dict() if inside else None
    state = state if inside else live.state_dict()
    resumed = sdl()
    resumed.load_state_dict(state)
    next_epoch = sdl_epoch(sampler_of(9).indices(1).tolist(), 2)
    if inside:
        assert as_lists(resumed) == []  # nothing more of epoch 0, then the next epoch
    assert as_lists(resumed) == as_lists(live) == next_epoch
    assert epoch0 == sdl_epoch(sampler_of(9).indices(0).tolist(), 2)


def sdl_epoch(order: list[int], batch: int) -> list[list[int]]:
    return [order[i : i + batch] for i in range(0, len(order), batch)]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_1_the_readme_loop_saved_at_any_point_of_an_epoch_runs_every_batch_and_every_epoch_body_once(
    workers: int,
) -> None:
    """Every save point of 3 epochs of 4 batches (inside the loop after each batch, the last included,
    and after each epoch's work): the killed run and its resume log exactly the uninterrupted run."""
    uninterrupted: list[Any] = []
    readme_loop(loader_of(11, 3, workers), 3, uninterrupted)
    points = [(epoch, step) for epoch in range(3) for step in (1, 2, 3, 4, None)]
    for point in points if workers == 0 else [(0, 4), (0, None), (1, 2)]:
        log: list[Any] = []
        state = readme_loop(loader_of(11, 3, workers), 3, log, lambda e, s, point=point: (e, s) == point)
        resumed = loader_of(11, 3, workers)
        resumed.load_state_dict(state)  # type: ignore[arg-type]
        readme_loop(resumed, 3, log)
        assert log == uninterrupted, point


# -- 2. Early exits under ResumableLoader


def test_2_a_break_then_set_epoch_saves_the_new_epoch_from_its_start() -> None:
    live = loader_of(12, 2)
    for step, _ in enumerate(live, 1):
        if step == 3:
            break
    live.set_epoch(1)
    assert live.epoch == 1
    resumed = loader_of(12, 2)
    resumed.load_state_dict(through_json(live.state_dict()))
    assert resumed.epoch == 1
    assert as_lists(resumed) == as_lists(live) == sdl_epoch(sampler_of(12).indices(1).tolist(), 2)


@pytest.mark.parametrize("style", ["zip", "counted-next"])
def test_2_a_loop_that_takes_exactly_len_batches_then_set_epoch_saves_the_new_epoch_whole(style: str) -> None:
    live = loader_of(12, 5)  # 3 batches: 5, 5, 2
    if style == "zip":
        taken = [batch.tolist() for _, batch in zip(range(len(live)), live)]
    else:
        iterator = iter(live)
        taken = [next(iterator).tolist() for _ in range(len(live))]
    assert taken == sdl_epoch(sampler_of(12).indices(0).tolist(), 5)
    live.set_epoch(1)
    resumed = loader_of(12, 5)
    resumed.load_state_dict(through_json(live.state_dict()))
    assert as_lists(resumed) == as_lists(live) == sdl_epoch(sampler_of(12).indices(1).tolist(), 5)


def test_2_a_state_taken_after_a_new_iter_before_its_first_batch_resumes_what_that_iterator_yields() -> None:
    live = loader_of(12, 2)
    for step, _ in enumerate(live, 1):
        if step == 2:
            break
    iterator = iter(live)
    resumed = loader_of(12, 2)
    resumed.load_state_dict(through_json(live.state_dict()))
    assert as_lists(resumed) == as_lists(iterator)


def test_2_an_epoch_capped_by_batches_per_epoch_resumes_exactly_from_every_save_point() -> None:
    cap = {"batches_per_epoch": 2}
    uninterrupted: list[Any] = []
    readme_loop(loader_of(12, 2, loader_kwargs=cap), 3, uninterrupted)
    assert [entry for entry in uninterrupted if isinstance(entry, tuple)] == [("end", 0), ("end", 1), ("end", 2)]
    assert len(uninterrupted) == 3 * (2 + 1)
    for point in [(epoch, step) for epoch in range(3) for step in (1, 2, None)]:
        log: list[Any] = []
        state = readme_loop(loader_of(12, 2, loader_kwargs=cap), 3, log, lambda e, s, point=point: (e, s) == point)
        resumed = loader_of(12, 2, loader_kwargs=cap)
        resumed.load_state_dict(state)  # type: ignore[arg-type]
        readme_loop(resumed, 3, log)
        assert log == uninterrupted, point


def test_2_two_interleaved_iterators_never_mix_their_counts_into_the_state() -> None:
    live = loader_of(12, 2)
    older = iter(live)
    next(older)
    newer = iter(live)
    next(newer)
    before = through_json(live.state_dict())
    try:
        next(older)  # refused, or it must not move the state the newest iterator defines
    except RuntimeError:
        pass
    assert through_json(live.state_dict())["sampler"] == before["sampler"]
    resumed = loader_of(12, 2)
    resumed.load_state_dict(before)
    assert as_lists(resumed) == as_lists(newer)


# -- 3. DataLoader(batch_size=None)


def test_3_a_loader_yielding_records_one_by_one_counts_records_or_is_refused() -> None:
    sampler = sampler_of(10, batch_size=2)
    try:
        live = ResumableLoader(DataLoader(list(range(10)), sampler=sampler, batch_size=None))
    except ValueError as refusal:
        assert "batch_size" in str(refusal)
        return
    iterator = iter(live)
    taken = [next(iterator) for _ in range(3)]
    state = through_json(live.state_dict())
    assert state["sampler"]["position"] == 3
    resumed = ResumableLoader(DataLoader(list(range(10)), sampler=sampler_of(10, batch_size=2), batch_size=None))
    resumed.load_state_dict(state)
    assert taken + list(resumed) == sampler_of(10).indices(0).tolist()


# -- 4. sampler.state_dict() under DataLoader workers


@pytest.mark.slow
def test_4_sampler_state_dict_under_workers_is_the_consumed_position_or_refused() -> None:
    wrapped = loader_of(100, 2, workers=2)
    iterator = iter(wrapped)
    consumed = [next(iterator).tolist() for _ in range(15)]  # 30 records consumed, more prefetched
    state = through_json(wrapped.sampler.state_dict())
    assert state["position"] == 30
    resumed = sampler_of(100)
    resumed.load_state_dict(state)
    assert [index for batch in consumed for index in batch] + list(resumed) == sampler_of(100).indices(0).tolist()

    bare = DataLoader(list(range(100)), sampler=sampler_of(100), batch_size=2, num_workers=2)
    iterator = iter(bare)
    for _ in range(15):
        next(iterator)
    with pytest.raises(PrefetchedStateError, match="ResumableLoader"):
        bare.sampler.state_dict()  # the consumed position is unknown here: never the prefetched one


# -- 7. Ranks agree about a restored epoch's length


@pytest.mark.parametrize("resumed_world", [4, 3])
def test_7_a_finished_pad_epoch_restored_reports_one_len_on_every_rank(resumed_world: int) -> None:
    live = [sampler_of(10, num_replicas=4, rank=rank) for rank in range(4)]
    iterators = [iter(sampler) for sampler in live]
    for sampler, iterator in zip(live, iterators):
        for _ in range(len(sampler)):
            next(iterator)  # the epoch drawn whole, inside the loop
    states = [through_json(sampler.state_dict()) for sampler in live]
    resumed = [sampler_of(10, num_replicas=resumed_world, rank=rank) for rank in range(resumed_world)]
    for rank, sampler in enumerate(resumed):
        sampler.load_state_dict(states[rank if resumed_world == 4 else 0])
    lengths = [len(sampler) for sampler in resumed]
    assert len(set(lengths)) == 1, lengths
    if resumed_world == 4:
        assert lengths == [len(sampler) for sampler in live]
    assert [sampler.remaining_length() for sampler in resumed] == [0] * resumed_world
    assert [list(sampler) for sampler in resumed] == [[]] * resumed_world


# -- 9. The smaller ones


def test_9_a_uniform_strategy_without_shuffle_is_not_shuffled() -> None:
    assert list(StatefulSampler(6, strategy=Uniform(shuffle=False))) == [0, 1, 2, 3, 4, 5]


@settings(max_examples=30, deadline=None)
@given(num_samples=st.sampled_from([2**61, 2**62 - 1, 2**62, 2**63 - 1, 2**63, 2**64]))
def test_9_a_weighted_epoch_length_is_refused_at_construction_or_saves_a_state_that_loads(num_samples: int) -> None:
    def build() -> StatefulSampler:
        return StatefulSampler(4, strategy=Weighted([1, 2, 3, 4], num_samples=num_samples))

    try:
        live = build()
    except ValueError as refusal:
        assert "num_samples" in str(refusal)
        return
    assert len(live) == num_samples
    iterator = iter(live)
    first = [next(iterator) for _ in range(3)]
    resumed = build()
    resumed.load_state_dict(through_json(live.state_dict()))
    assert [next(iter(resumed))] == [next(iterator)]
    assert len(first) == 3


def test_9_a_curriculum_schedule_that_drop_cannot_shard_is_refused_at_construction() -> None:
    bands = [0, 0, 0, 0, 1, 1]  # epoch 1 takes the first band only: 4 records, enough for 3 ranks
    schedule = [2, 1]
    StatefulSampler(6, strategy=Curriculum(bands, schedule=schedule), tail="drop", num_replicas=3, rank=0)
    small = [0, 0, 1, 1, 1, 1]  # epoch 1 takes 2 records: fewer than 3 ranks
    with pytest.raises(ValueError, match="drop"):
        StatefulSampler(6, strategy=Curriculum(small, schedule=schedule), tail="drop", num_replicas=3, rank=0)


def test_9_a_sampler_state_given_to_the_loader_or_a_loader_state_to_the_sampler_names_the_fix() -> None:
    loader = loader_of(10, 2)
    next(iter(loader))
    loader_state, sampler_state = through_json(loader.state_dict()), through_json(loader.sampler.state_dict())
    target = loader_of(10, 2)
    with pytest.raises(IncompatibleStateError, match="sampler state"):
        target.load_state_dict(sampler_state)
    with pytest.raises(IncompatibleStateError, match=r"state\['sampler'\]"):
        target.sampler.load_state_dict(loader_state)
    assert as_lists(target) == as_lists(loader_of(10, 2))  # both refusals left it as it was


@pytest.mark.parametrize("world_size", [2, 3])
def test_9_grouped_lanes_mark_every_repeat_of_a_short_lane_as_padding(world_size: int) -> None:
    groups = [0] * 9 + [1] * 2 + [2] + [3] * 3  # skewed: one long group, short ones
    size = len(groups)
    keys = []
    for rank in range(world_size):
        sampler = StatefulSampler(size, strategy=Grouped(groups, lanes=world_size), num_replicas=world_size,
                                  rank=rank, yield_keys=True)  # fmt: skip
        keys += list(sampler)
    real = sorted(int(key.index) for key in keys if not bool(key.is_padding))
    assert real == list(range(size))  # every record once unmarked; every repeat marked
