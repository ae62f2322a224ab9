"""PackedStream over a MixedStream: rows of a mixture's draws, exact at any stop (a schedule change mid-epoch
included), elastic at another world size and batch, a changed source or mixture refused by name."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import MixedStream, PackedStream, ShardedStream
from tests.stream.test_packed_stream import (
    COUNTS,
    RESIZES,
    CountingShards,
    TokenShards,
    any_resize,
    assert_exact_resume_at_every_step,
    assert_twin_goes_on_as_the_live_one,
    resized_plans,
    tokens,
)
from tests.stream.test_packed_stream import packed as packed_sharded

STREAMED = sum(COUNTS)  # 31 records of the sharded source: indices 0..30
DICTS = [{"input_ids": tokens(STREAMED + i)} for i in range(9)]  # indices 31..39, records with a token field
LISTS = [tokens(STREAMED + 9 + i) for i in range(5)]  # indices 40..44, records that are their tokens
DRAWS = 60  # an epoch draws more than the 45 records: some are drawn, and packed, twice
SCHEDULES: dict[str, dict[Any, Any] | None] = {
    "none": None,
    "mid-epoch": {(0, 25): [1, 3, 0], (1, 10): [1, 1, 1]},  # planned changes inside epochs 0 and 1
}


def make_mixed(
    counts: Sequence[int] = COUNTS, schedule: str = "mid-epoch", weights: Sequence[float] = (2, 1, 1), **kwargs: Any
) -> MixedStream:
    shards = ShardedStream([str(i) for i in range(len(counts))], TokenShards(counts), batch_size=3, window=2, seed=5)
    return MixedStream([shards, DICTS, LISTS], list(weights), batch_size=4, num_samples=DRAWS, seed=9,
                       schedule=SCHEDULES[schedule], **kwargs)  # fmt: skip


def packed(world: int = 1, rank: int = 0, batch: int = 2, schedule: str = "mid-epoch", **kwargs: Any) -> PackedStream:
    kwargs.setdefault("window", 8)
    return PackedStream(make_mixed(schedule=schedule), 16, batch_size=batch, num_replicas=world, rank=rank, **kwargs)


def row_tokens(plan: Any) -> list[int]:
    return [tokens(record)[start] + offset for record, start, stop in plan for offset in range(stop - start)]


def real_tokens(plans: Sequence[Any]) -> Counter[int]:
    """Tokens of the plans that are not padding."""
    return Counter(token for plan in plans if not plan.is_padding for token in row_tokens(plan))


def drawn_tokens(epoch: int = 0, schedule: str = "mid-epoch") -> Counter[int]:
    """Every token of every draw of the epoch: a record drawn twice counts twice."""
    indices = make_mixed(schedule=schedule).epoch_indices(epoch, np.arange(DRAWS))
    return Counter(token for record in indices.tolist() for token in tokens(record))


def record_tokens(record: Any) -> list[int]:
    return record["input_ids"] if isinstance(record, dict) else record


def test_epoch_indices_are_the_records_the_mixed_stream_delivers() -> None:
    stream = make_mixed(yield_keys=True)
    for epoch in range(3):
        stream.set_epoch(epoch)
        delivered = list(stream)
        assert [key.index for _, key in delivered] == stream.epoch_indices(epoch, np.arange(DRAWS)).tolist()
        assert [record_tokens(record) for record, key in delivered] == [tokens(key.index) for _, key in delivered]


@pytest.mark.parametrize("epoch", [0, 1])
def test_split_rows_are_the_mixture_s_draws_cut_every_seq_len(epoch: int) -> None:
    stream = make_mixed()
    stream.set_epoch(epoch)
    order = [token for record in stream for token in record_tokens(record)]
    rows = packed()
    rows.set_epoch(epoch)
    plans = list(rows)
    assert [token for plan in plans for token in row_tokens(plan)] == order
    full, left = divmod(len(order), 16)
    assert [len(row_tokens(plan)) for plan in plans] == [16] * full + ([left] if left else [])


def test_whole_rows_hold_each_draw_once_whole_and_repeats_twice() -> None:
    rows = packed(split_records=False)
    plans = list(rows)
    assert all(start == 0 and stop == len(tokens(record)) for plan in plans for record, start, stop in plan)
    assert all(sum(stop for _, _, stop in plan) <= 16 for plan in plans)
    drawn = Counter(make_mixed().epoch_indices(0, np.arange(DRAWS)).tolist())
    assert Counter(record for plan in plans for record, _, _ in plan) == drawn
    assert max(drawn.values()) > 1  # the test packs a record drawn twice


def test_the_schedule_changes_the_draws_from_its_position_on() -> None:
    planned, unchanged = make_mixed(), make_mixed(schedule="none")
    before = planned.epoch_indices(0, np.arange(25))
    assert before.tolist() == unchanged.epoch_indices(0, np.arange(25)).tolist()
    after = planned.epoch_indices(0, np.arange(25, DRAWS))
    assert not (after >= STREAMED + 9).any()  # weight 0 for the list source from position 25 of epoch 0
    assert [len(plan) for plan in packed()] != [len(plan) for plan in packed(schedule="none")]


def test_loader_batches_are_the_rows_and_two_workers_resume_at_zero() -> None:
    def batches(loader: Any) -> list[list[int]]:
        return [batch["input_ids"].reshape(-1).tolist() for batch in loader]

    uninterrupted = batches(ResumableLoader(packed().loader(num_workers=0)))
    plans = list(packed())
    assert uninterrupted[0] == row_tokens(plans[0]) + row_tokens(plans[1])
    loader = ResumableLoader(packed().loader(num_workers=2))
    first = [batch["input_ids"].reshape(-1).tolist() for batch in islice(loader, 3)]
    resumed = ResumableLoader(packed().loader(num_workers=0))
    resumed.load_state_dict(loader.state_dict())
    assert first + batches(resumed) == uninterrupted
    assert len(uninterrupted) == -(-len(plans) // 2)


@settings(max_examples=12, deadline=None)
@given(
    split=st.booleans(),
    schedule=st.sampled_from(sorted(SCHEDULES)),
    stops=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    world=st.integers(1, 3),
    epoch=st.integers(0, 2),
)
def test_twin_restored_from_state_dict_goes_on_as_the_live_one(
    split: bool, schedule: str, stops: list[int], world: int, epoch: int
) -> None:
    assert_twin_goes_on_as_the_live_one(
        lambda: packed(world, world - 1, split_records=split, schedule=schedule), stops, epoch
    )


@pytest.mark.parametrize("split", [True, False])
def test_exact_resume_at_every_step(split: bool) -> None:
    assert_exact_resume_at_every_step(packed, split)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("world", "batch", "resumed_world", "resumed_batch"), RESIZES)
def test_elastic_resume_delivers_every_unconsumed_token_once(
    split: bool, world: int, batch: int, resumed_world: int, resumed_batch: int
) -> None:
    before, after, saver = resized_plans(packed, split, world, batch, resumed_world, resumed_batch)
    assert sum((real_tokens(plans) for plans in before + after), Counter()) == drawn_tokens()
    padding = [plan for plans in after for plan in plans if plan.is_padding]
    rows = saver.rows_in_epoch()
    assert len(padding) == -(-(rows - 2 * batch * world) // resumed_world) * resumed_world - (rows - 2 * batch * world)
    assert all(plan.key.is_padding and plan.key.index < rows for plan in padding)


@settings(max_examples=15, deadline=None)
@given(resize=any_resize(), data=st.data())
def test_any_resize_delivers_every_unconsumed_token_once_with_equal_steps(
    resize: tuple[bool, int, int, int, int], data: st.DataObject
) -> None:
    before, after, _ = resized_plans(packed, *resize, stop_in=data)
    assert sum((real_tokens(plans) for plans in before + after), Counter()) == drawn_tokens()


def test_a_state_of_another_mixture_is_refused_naming_the_mixture() -> None:
    state = packed().state_dict()
    other = PackedStream(make_mixed(weights=(1, 1, 1)), 16, batch_size=2, num_replicas=1, rank=0, window=8)
    with pytest.raises(IncompatibleStateError, match="'mixture'"):
        other.load_state_dict(state)


def test_a_state_of_a_changed_source_is_refused_naming_it() -> None:
    state = packed().state_dict()
    changed = PackedStream(make_mixed([7, 5, 0, 9, 4, 5]), 16, batch_size=2, num_replicas=1, rank=0, window=8)
    with pytest.raises(IncompatibleStateError, match=r"'sources\[0\]'"):
        changed.load_state_dict(state)


def test_a_state_of_a_sharded_stream_is_refused_by_a_mixed_one_and_back() -> None:
    with pytest.raises(IncompatibleStateError, match="'stream.source': saved \"a ShardedStream's state\""):
        packed().load_state_dict(packed_sharded().state_dict())
    with pytest.raises(IncompatibleStateError, match="'stream.source': saved \"a MixedStream's state\""):
        packed_sharded().load_state_dict(packed().state_dict())
    state = packed().state_dict()
    state["stream"]["source"] = "mixed"
    with pytest.raises(IncompatibleStateError, match="'stream.source': saved 'mixed'"):
        packed().load_state_dict(state)


def test_a_mixed_stream_with_ranks_or_a_transform_is_refused() -> None:
    with pytest.raises(ValueError, match="build the MixedStream without them"):
        PackedStream(make_mixed(num_replicas=2, rank=0), 16)
    with pytest.raises(ValueError, match="stream: its transform"):
        PackedStream(make_mixed(transform=torch.tensor), 16)
    shards = ShardedStream(["0"], TokenShards([4]), batch_size=1, transform=torch.tensor)
    with pytest.raises(ValueError, match=r"streams\[0\]: its transform"):
        PackedStream(MixedStream([shards, DICTS], [1, 1], batch_size=2), 16)


def test_a_map_source_without_the_token_field_or_with_an_empty_record_is_refused() -> None:
    with pytest.raises(KeyError, match=r"tokens='ids': a record of streams\[1\] has no such field"):
        PackedStream(MixedStream([LISTS, DICTS], [1, 1], batch_size=2), 16, tokens="ids")
    empty = MixedStream([LISTS, [[1], [], [2]]], [1, 1], batch_size=2)
    with pytest.raises(ValueError, match=r"record 1 of streams\[1\] has 0 tokens in 'input_ids'"):
        PackedStream(empty, 16)


def test_a_lengths_cache_keeps_the_stream_source_s_lengths(tmp_path: Path) -> None:
    def build(reader: CountingShards) -> PackedStream:
        shards = ShardedStream([str(i) for i in range(len(COUNTS))], reader, batch_size=3, window=2, seed=5)
        mixed = MixedStream([shards, DICTS, LISTS], [2, 1, 1], batch_size=4, num_samples=DRAWS, seed=9,
                            schedule=SCHEDULES["mid-epoch"])  # fmt: skip
        return PackedStream(mixed, 16, batch_size=2, num_replicas=1, rank=0, window=8, lengths_cache=tmp_path)

    first, second = CountingShards(COUNTS), CountingShards(COUNTS)
    plans = [list(plan) for plan in build(first)]
    assert sorted(first.read_shards) == [str(i) for i in range(len(COUNTS))]
    restarted = build(second)
    assert second.read_shards == []
    assert [list(plan) for plan in restarted] == plans == [list(plan) for plan in packed()]


# -- on_change="continue": a state saved under one mixture continued under another, spliced at the saved window's end

APPENDED = [tokens(STREAMED + 14 + i) for i in range(6)]  # indices 45..50: a source appended at the resume


def continuing(world: int = 1, rank: int = 0, batch: int = 2, changed: bool = False, **kwargs: Any) -> PackedStream:
    """Packed rows of a mixed stream built to continue another; ``changed``: other weights and a source appended."""
    kwargs.setdefault("window", 8)
    mixed = make_mixed(on_change="continue")
    if changed:
        mixed = MixedStream([*mixed.sources, APPENDED], [1, 1, 2, 3], batch_size=4, num_samples=DRAWS, seed=9,
                            schedule={(1, 10): [1, 1, 1, 1]}, on_change="continue")  # fmt: skip
    return PackedStream(mixed, 16, batch_size=batch, num_replicas=world, rank=rank, **kwargs)


def continued_tokens(state: dict[str, Any], in_order: bool = False) -> Any:
    """Every token of epoch 0's draws in a run saved at ``state`` and resumed changed: the saving mixture's draws up
    to the splice (the end of the saved row's window, or its start if none of it was read), then the changed mixture's, continued there (``in_order``:
    as a list, else a multiset)."""
    splice, window = state["strategy_state"]["splice"], state["packing"]["window"]
    assert splice in (window * 8, min((window + 1) * 8, DRAWS))  # its start when none of the window was read
    saving, resumed = continuing().stream, copy.copy(continuing(changed=True).stream)
    assert isinstance(saving, MixedStream) and isinstance(resumed, MixedStream)
    resumed.mixture = resumed.mixture.continued_at(splice, [*saving.mixture.draws_before(0, splice).tolist(), 0])
    records = saving.epoch_indices(0, np.arange(splice)).tolist()
    records += resumed.epoch_indices(0, np.arange(splice, DRAWS)).tolist()
    delivered = [token for record in records for token in tokens(record)]
    return delivered if in_order else Counter(delivered)


@pytest.mark.parametrize("split", [True, False])
def test_a_state_saved_under_another_mixture_continues_at_the_same_topology(split: bool) -> None:
    uninterrupted = [list(plan) for plan in continuing(split_records=split)]
    for step in (0, 3, 7, len(uninterrupted) // 2 - 1):  # inside epoch 0, the last batch included
        live = continuing(split_records=split)
        seen = list(islice(live, 2 * step))
        state = live.state_dict(consumed_batches=step)
        resumed = continuing(changed=True, split_records=split)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert real_tokens(seen) + real_tokens(rest) == continued_tokens(state)
        if split:  # the run's tokens are the epoch's draws in order: the saving mixture's, then the changed one's
            assert [token for plan in seen + rest for token in row_tokens(plan)] == list(continued_tokens(state, True))
        else:  # the windows before the splice keep their rows: they were planned from the old order
            rows, splice = live.strategy.rows(0), state["strategy_state"]["splice"]
            kept = next((row for row in range(rows.count()) if rows.anchor(row)[0] * 8 >= splice), None)
            kept = rows.count() if kept is None else kept
            assert (
                kept >= 2 * step and [list(plan) for plan in rest[: kept - 2 * step]] == uninterrupted[2 * step : kept]
            )
        assert any(record >= STREAMED + 14 for plan in rest for record, _, _ in plan)  # the appended source is drawn


@pytest.mark.parametrize("split", [True, False])
def test_a_later_checkpoint_of_a_continued_run_reproduces_both_segments(split: bool) -> None:
    live = continuing(split_records=split)
    list(islice(live, 6))
    state = live.state_dict(consumed_batches=3)
    resumed = continuing(changed=True, split_records=split)
    resumed.load_state_dict(state)
    reference = [list(plan) for plan in copy.deepcopy(resumed)]
    for step in range(len(reference) // 2 + 1):
        again = continuing(changed=True, split_records=split)
        again.load_state_dict(state)
        seen = [list(plan) for plan in islice(again, 2 * step)]
        later = again.state_dict(consumed_batches=step)
        twin = continuing(changed=True, split_records=split)
        twin.load_state_dict(later)
        assert twin.state_dict() == later
        assert seen + [list(plan) for plan in twin] == reference
    assert [list(plan) for plan in resumed] == reference
    next_epoch = continuing(changed=True, split_records=split)
    next_epoch.load_state_dict(resumed.state_dict())  # after the continued epoch: its epoch 1, the sources going on
    assert (next_epoch.epoch, resumed.epoch) == (1, 1)
    assert [list(plan) for plan in next_epoch] == [list(plan) for plan in resumed]


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(
    ("world", "batch", "resumed_world", "resumed_batch"), [(4, 1, 3, 1), (3, 1, 4, 1), (2, 2, 2, 1)]
)
def test_a_continued_mixture_at_another_topology_delivers_every_token_once(
    split: bool, world: int, batch: int, resumed_world: int, resumed_batch: int
) -> None:
    before = [list(islice(continuing(world, rank, batch, split_records=split), 2 * batch)) for rank in range(world)]
    saver = continuing(world, 0, batch, split_records=split)
    list(islice(saver, 2 * batch))
    state = saver.state_dict(consumed_batches=2)
    after = []
    for rank in range(resumed_world):
        rows = continuing(resumed_world, rank, resumed_batch, changed=True, split_records=split)
        rows.load_state_dict(state)
        after.append(list(rows))
    assert len({len(plans) for plans in after}) == 1  # equal steps on every rank
    assert sum((real_tokens(plans) for plans in before + after), Counter()) == continued_tokens(state)
    assert all(plan.key.is_padding for plans in after for plan in plans if plan.is_padding)


def test_a_removed_source_or_one_built_to_refuse_is_refused_by_name() -> None:
    state = continuing().state_dict()
    dropped = MixedStream(make_mixed().sources[:2], [1, 1], batch_size=4, num_samples=DRAWS, seed=9,
                          on_change="continue")  # fmt: skip
    with pytest.raises(IncompatibleStateError, match="'sources'"):
        PackedStream(dropped, 16, batch_size=2, num_replicas=1, rank=0, window=8).load_state_dict(state)
    refusing = PackedStream(make_mixed(weights=(1, 2, 3)), 16, batch_size=2, num_replicas=1, rank=0, window=8)
    with pytest.raises(IncompatibleStateError, match="'mixture'"):
        refusing.load_state_dict(state)


def test_mixture_is_the_one_the_rows_continue_after_a_load_and_none_over_a_sharded_stream() -> None:
    live = continuing()
    list(islice(live, 6))
    resumed = continuing(changed=True)
    assert resumed.mixture is resumed.stream.mixture
    resumed.load_state_dict(live.state_dict(consumed_batches=3))
    assert resumed.mixture is not None and resumed.mixture is not resumed.stream.mixture
    splice = resumed.state_dict()["strategy_state"]["splice"]
    assert resumed.mixture.weights_at(0, splice).tolist() == resumed.stream.mixture.weights_at(0, 0).tolist()
    assert resumed.mixture.weights_at(0, 0).tolist() == live.mixture.weights_at(0, 0).tolist() + [0.0]
    assert packed_sharded().mixture is None
