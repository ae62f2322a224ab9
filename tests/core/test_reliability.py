"""Regression tests for the resume cases that were once silently wrong (issue 9), each named by the
behaviour it checks. The model-based test (test_resume_model.py) guards the general contract."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.state import STATE_VERSION
from tests.helpers import json_round_trip


def ranks(size: int, world_size: int, **kwargs: Any) -> list[StatefulSampler]:
    return [StatefulSampler(size, num_replicas=world_size, rank=r, **kwargs) for r in range(world_size)]


def consume(samplers: list[StatefulSampler], batch_size: int, steps: int | None = None) -> list[list[list[int]]]:
    """Ranks in lockstep, ``steps`` batches each (all of the pass when None): per step, per rank."""
    iterators = [iter(sampler) for sampler in samplers]
    out = []
    while steps is None or len(out) < steps:
        step = []
        for iterator in iterators:
            batch = []
            for item in iterator:
                batch.append(item)
                if len(batch) == batch_size:
                    break
            step.append(batch)
        if not any(step):
            break
        out.append(step)
    return out


def resumed(state: dict[str, Any], size: int, world_size: int, batch_size: int, **kwargs: Any) -> list[StatefulSampler]:
    samplers = ranks(size, world_size, batch_size=batch_size, **kwargs)
    for sampler in samplers:
        sampler.load_state_dict(json_round_trip(state))
        sampler.set_epoch(state["epoch"])
    return samplers


def records(steps: list[list[list[int]]]) -> list[int]:
    return [record for step in steps for batch in step for record in batch]


@pytest.mark.parametrize(
    ("size", "world_size", "batch_size", "tail", "consumed", "new_world", "new_batch"),
    [
        (100, 4, 5, "pad", 2, 3, 5),  # the reported hang: steps per rank were [4, 5, 5]
        (33, 6, 8, "pad", 1, 8, 6),  # at the epoch's end, same global batch: was [0,0,0,0,1,1,1,1]
        (155, 4, 1, "drop", 38, 3, 1),  # at the epoch's end: was [0, 0, 1]
        (97, 4, 3, "carry", 3, 3, 4),
    ],
)
def test_an_elastic_resume_gives_every_rank_the_same_step_count_and_the_unconsumed_records_once(
    size: int, world_size: int, batch_size: int, tail: str, consumed: int, new_world: int, new_batch: int
) -> None:
    before = ranks(size, world_size, batch_size=batch_size, tail=tail, seed=3, yield_keys=True)
    head = consume(before, batch_size, consumed)
    state = before[0].state_dict(consumed_batches=consumed)
    assert all(sampler.state_dict(consumed_batches=consumed) == state for sampler in before)
    after = resumed(state, size, new_world, new_batch, tail=tail, seed=3, yield_keys=True)
    rest = consume(after, new_batch)
    per_rank_steps = {sum(1 for step in rest if step[rank]) for rank in range(new_world)}
    assert len(per_rank_steps) == 1, f"unequal steps per rank: {per_rank_steps}"
    seen = [key for key in records(head) + records(rest) if not key.is_padding]
    indices = [key.index for key in seen]
    assert len(indices) == len(set(indices))  # nothing consumed is seen again
    order = StatefulSampler(size, seed=3, tail="uneven").indices(0).tolist()
    if tail in ("pad",):
        assert sorted(indices) == list(range(size))
    elif tail == "drop":
        assert sorted(indices + after[0].dropped_indices(0)) == list(range(size))
    else:
        kept = sorted(indices + after[0].unused_indices(0))
        assert kept == sorted(order)


def test_a_changed_global_batch_keeps_carry_exact_over_several_epochs() -> None:
    """N=10, carry, B=3: one epoch drawn, saved after 3 batches, loaded with B=4. Epoch 1 once
    redrew pass-0 record 8, and its last batch was short."""
    sampler = StatefulSampler(10, seed=0, tail="carry", batch_size=3)
    epoch0 = list(sampler)
    state = sampler.state_dict(consumed_batches=3)
    assert state["epoch"] == 0 and state["position"] == 9 == state["epoch_end"]
    after = StatefulSampler(10, seed=0, tail="carry", batch_size=4)
    after.load_state_dict(state)
    stream = [StatefulSampler(10, seed=0, tail="uneven").indices(p).tolist() for p in range(6)]
    flat = [record for order in stream for record in order]
    assert epoch0 == flat[:9]
    seen = []
    for epoch in range(1, 5):
        after.set_epoch(epoch)
        drawn = list(after)
        assert len(drawn) % 4 == 0  # whole batches only, none short
        seen += drawn
    assert seen == flat[9 : 9 + len(seen)]  # the stream continues: nothing redrawn, nothing skipped


def test_a_batch_size_changed_mid_epoch_loses_no_record() -> None:
    """N=22, B 4 -> 5 after 4 batches (the Lightning report lost record 10 of epoch 0)."""
    before = StatefulSampler(22, seed=1, batch_size=4)
    head = list(before)[:16]
    after = StatefulSampler(22, seed=1, batch_size=5)
    after.load_state_dict(before.state_dict(consumed_batches=4))
    assert after.remaining_length() == 6
    rest = list(after)
    assert sorted(head + rest) == list(range(22))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stateful_dataloader_checkpoint_after_an_epochs_last_batch_resumes_the_next_epoch_once(
    num_workers: int,
) -> None:
    """N=37, B=4 (10 batches an epoch, the last of 1), crash after batch 10: the next epoch once
    trained twice (30 batches instead of 20)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> tuple[StatefulSampler, StatefulDataLoader]:
        sampler = StatefulSampler(37, seed=2, batch_size=4)
        return sampler, StatefulDataLoader(torch.arange(37), sampler=sampler, batch_size=4, num_workers=num_workers)

    def run(sampler: StatefulSampler, loader: StatefulDataLoader, stop_after: int | None = None) -> tuple[list, Any]:
        seen = []
        for epoch in range(sampler.epoch, 2):
            sampler.set_epoch(epoch)
            for batch in loader:
                seen.append(batch.tolist())
                if len(seen) == stop_after:
                    return seen, loader.state_dict()
        return seen, None

    whole, _ = run(*make())
    assert len(whole) == 20
    head, saved = run(*make(), stop_after=10)
    sampler, loader = make()
    loader.load_state_dict(saved)
    tail, _ = run(sampler, loader)
    assert head + tail == whole


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_taken_after_a_new_iter_describes_the_new_pass(num_workers: int) -> None:
    """Abandon an iteration after 2 batches, iter() again, save before the first batch: the resume
    yields what the new pass yields. That pass continues from the 2 batches drawn at 0 workers (docs/core.md,
    "Epoch ends and early exits"; it restarted before issue 17), and restarts from the epoch's start where
    workers drew ahead of the loop."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> tuple[StatefulSampler, StatefulDataLoader]:
        sampler = StatefulSampler(40, seed=5, batch_size=4)
        return sampler, StatefulDataLoader(torch.arange(40), sampler=sampler, batch_size=4, num_workers=num_workers)

    _, loader = make()
    iterator = iter(loader)
    head = [next(iterator).tolist(), next(iterator).tolist()]
    iterator = iter(loader)
    saved = loader.state_dict()
    uninterrupted = [batch.tolist() for batch in iterator]
    _sampler, loader = make()
    loader.load_state_dict(saved)
    assert [batch.tolist() for batch in loader] == uninterrupted
    epoch = [b.tolist() for b in torch.tensor(StatefulSampler(40, seed=5).indices(0)).split(4)]
    assert uninterrupted == (epoch[2:] if num_workers == 0 else epoch) and head == epoch[:2]


def test_uneven_ranks_report_the_same_position_at_the_epochs_end() -> None:
    """N=63 on 6 ranks: local lengths 11,11,11,10,10,10; the ends were [63,63,63,60,60,60]."""
    samplers = ranks(63, 6, tail="uneven", batch_size=4)
    for sampler in samplers:
        list(sampler)
    assert {sampler.state_dict(consumed_batches=3)["position"] for sampler in samplers} == {63}
    # the passes ended: every rank says the next epoch's start (issue 17; it said epoch 0's end before)
    assert {(sampler.state_dict()["epoch"], sampler.state_dict()["position"]) for sampler in samplers} == {(1, 0)}
    after = resumed(samplers[4].state_dict(consumed_batches=3), 63, 6, 4, tail="uneven")
    assert [list(sampler) for sampler in after] == [[]] * 6


def test_huge_epochs_never_wrap_int64() -> None:
    size = 2**62 - 1
    sampler = StatefulSampler(size, shuffle=False, yield_keys=True)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    keys = [next(iterator) for _ in range(2)]
    assert [(key.index, key.epoch, key.position) for key in keys] == [(0, 3, 0), (1, 3, 1)]
    carry = StatefulSampler(size, tail="carry", batch_size=3, yield_keys=True)
    carry.set_epoch(5)
    key = next(iter(carry))
    assert key.epoch in (4, 5) and key.epoch >= 0


@pytest.mark.parametrize("epoch", [2**62, 2**64, -1])
def test_out_of_range_epochs_are_refused_where_they_enter(epoch: int) -> None:
    sampler = StatefulSampler(10)
    with pytest.raises(ValueError, match=r"epoch must be at least 0 and at most 4611686018427387903"):
        sampler.set_epoch(epoch)
    state = {**StatefulSampler(10).state_dict(), "epoch": epoch}
    with pytest.raises(IncompatibleStateError, match=r"state field 'epoch'.*an int in \[0, 4611686018427387903\]"):
        sampler.load_state_dict(state)


@pytest.mark.parametrize(
    ("data_source", "kwargs", "error", "message"),
    [
        (
            2**40,
            {"order": "torch"},
            ValueError,
            "order='torch' holds randperm(N) in memory: N must be at most 2147483648",
        ),
        ("10", {}, TypeError, "data_source must be a sized dataset or an int, got str '10'"),
        (b"10", {}, TypeError, "data_source must be a sized dataset or an int, got bytes"),
        (torch.tensor(1.5), {}, TypeError, "data_source as a 0-d tensor must hold an integer"),
        (10, {"tail": "carry"}, ValueError, "tail='carry' needs batch_size"),
        (10, {"batch_size": 2**31}, ValueError, "batch_size must be at least 1 and at most 1073741824"),
    ],
)
def test_bad_values_are_refused_at_construction(data_source: Any, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        StatefulSampler(data_source, **kwargs)


def test_a_0d_integer_tensor_is_a_size() -> None:
    assert len(StatefulSampler(torch.tensor(10))) == len(StatefulSampler(np.int64(10))) == 10


def test_consumed_batches_beyond_the_pass_is_refused_naming_its_length() -> None:
    sampler = StatefulSampler(22, batch_size=4)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "consumed_batches must be at most 6, the batches of the current pass (22 indices in batches of 4), got 7"
        ),
    ):
        sampler.state_dict(consumed_batches=7)


def test_two_iterators_over_one_sampler_each_yield_the_epoch_and_the_state_follows_the_newest() -> None:
    sampler = StatefulSampler(20, seed=1)
    first, second = iter(sampler), iter(sampler)
    a = [next(first) for _ in range(5)]
    b = [next(second) for _ in range(3)]
    assert a[:3] == b  # each is a whole pass from the committed position
    assert sampler.state_dict()["position"] == 3  # the newest pass
    assert a + list(first) == StatefulSampler(20, seed=1).indices(0).tolist()  # the live indices(0) is the rest


def test_a_version_1_state_from_release_0_1_0_still_loads() -> None:
    v1 = {
        "version": 1,
        "size": 100,
        "seed": 3,
        "shuffle": True,
        "tail": "pad",
        "order": "fast",
        "epoch": 2,
        "position": 24,
        "carry_start": 0,
        "world_size": 4,
        "batch_size": 3,
    }
    samplers = ranks(100, 4, seed=3, batch_size=3)
    for sampler in samplers:
        sampler.set_epoch(2)
    expected = [list(sampler)[6:] for sampler in samplers]
    after = resumed(v1, 100, 4, 3, seed=3)
    assert [list(sampler) for sampler in after] == expected
    assert after[0].state_dict()["version"] == STATE_VERSION


def test_a_plain_loop_with_workers_resumes_exactly_after_a_batch_size_change() -> None:
    dataset = torch.arange(30)
    sampler = StatefulSampler(30, seed=4, batch_size=4)
    loader = DataLoader(dataset, sampler=sampler, batch_size=4, num_workers=2)
    head = []
    for step, batch in enumerate(loader, 1):
        head += batch.tolist()
        if step == 3:
            state = sampler.state_dict(consumed_batches=step)
            break
    after = StatefulSampler(30, seed=4, batch_size=7)
    after.load_state_dict(state)
    rest = [batch.tolist() for batch in DataLoader(dataset, sampler=after, batch_size=7, num_workers=2)]
    assert [len(batch) for batch in rest] == [7, 7, 4]
    assert sorted(head + [r for batch in rest for r in batch]) == list(range(30))
