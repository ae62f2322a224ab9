"""The shard-and-window order and its deal to ranks and workers: every record exactly once per
epoch, windows of k shards, and a resume at any point continues exactly (any W, workers, batch)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.order.shards import DEFAULT_SPREAD, ShardedShuffle
from tests.stream_helpers import loop_batches, make_stream

counts_lists = st.lists(st.integers(0, 30), min_size=1, max_size=12).filter(lambda counts: sum(counts) > 0)


def keys_of(batches: list[list]) -> list:
    return [key for batch in batches for _, key in batch]


@settings(max_examples=60)
@given(
    counts=counts_lists, window=st.integers(1, 5), seed=st.integers(0, 2**63 - 1), epoch=st.integers(0, 10**6),
    spread=st.integers(1, 4),
)  # fmt: skip
def test_each_epoch_is_a_permutation_whose_windows_hold_pieces_of_k_times_spread_consecutive_shards_of_the_shard_order(
    counts: list[int], window: int, seed: int, epoch: int, spread: int
) -> None:
    order = ShardedShuffle(counts, window, seed, spread).epoch(epoch)
    size = sum(counts)
    positions = np.arange(size)
    shards, rows = order.locate(positions)
    assert sorted(zip(shards.tolist(), rows.tolist())) == [(s, r) for s, n in enumerate(counts) for r in range(n)]
    slot_of = {shard: slot for slot, shard in enumerate(order.shard_order.tolist())}
    windows = order.window_of(positions)
    assert [slot_of[s] // (window * spread) for s in shards.tolist()] == (windows // spread).tolist()
    assert np.all(np.diff(windows) >= 0)  # positions walk the windows in order


def test_the_order_depends_on_seed_and_epoch_and_nothing_else() -> None:
    counts = [50] * 20
    first = ShardedShuffle(counts, 4, 3).epoch(1).records(np.arange(1000))
    assert np.array_equal(first, ShardedShuffle(counts, 4, 3).epoch(1).records(np.arange(1000)))
    assert not np.array_equal(first, ShardedShuffle(counts, 4, 3).epoch(2).records(np.arange(1000)))
    assert not np.array_equal(first, ShardedShuffle(counts, 4, 4).epoch(1).records(np.arange(1000)))


@settings(max_examples=60)
@given(
    counts=counts_lists,
    window=st.integers(1, 5),
    world_size=st.integers(1, 4),
    workers=st.integers(0, 3),
    batch_size=st.integers(1, 5),
    tail=st.sampled_from(["pad", "drop"]),
    seed=st.integers(0, 1000),
)
def test_every_record_is_delivered_exactly_once_per_epoch_and_every_rank_takes_as_many_steps(
    counts: list[int], window: int, world_size: int, workers: int, batch_size: int, tail: str, seed: int
) -> None:
    size = sum(counts)
    if tail == "drop" and size < world_size:
        return
    config = {"window": window, "batch_size": batch_size, "tail": tail, "seed": seed, "yield_keys": True}
    per_rank = [
        loop_batches(make_stream(counts, num_replicas=world_size, rank=rank, **config), workers)
        for rank in range(world_size)
    ]
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps: DDP cannot hang
    keys = [key for batches in per_rank for key in keys_of(batches)]
    real = [key for key in keys if not key.is_padding]
    kept = size if tail == "pad" else size // world_size * world_size
    assert sorted(key.position for key in real) == list(range(kept))
    assert len({key.index for key in real}) == kept
    padding = [key for key in keys if key.is_padding]
    assert len(padding) == (-size % world_size if tail == "pad" else 0)
    order = ShardedShuffle(counts, window, seed, DEFAULT_SPREAD).epoch(0)
    assert [key.index for key in real] == order.records(np.array([key.position for key in real])).tolist()


@settings(max_examples=60)
@given(
    counts=counts_lists,
    window=st.integers(1, 4),
    world_sizes=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    workers=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    batch_sizes=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    consumed=st.integers(0, 40),
    spread=st.integers(1, 4),
)
def test_a_resume_with_other_world_size_workers_and_batch_size_delivers_exactly_the_rest_of_the_epoch(
    counts: list[int],
    window: int,
    spread: int,
    world_sizes: tuple[int, int],
    workers: tuple[int, int],
    batch_sizes: tuple[int, int],
    consumed: int,
) -> None:
    (world, new_world), (batch, new_batch) = world_sizes, batch_sizes

    def ranks(world_size: int, batch_size: int) -> list:
        return [
            make_stream(counts, window=window, batch_size=batch_size, seed=5, num_replicas=world_size, rank=rank,
                        yield_keys=True, spread=spread)
            for rank in range(world_size)
        ]  # fmt: skip

    uninterrupted = [loop_batches(stream, workers[0]) for stream in ranks(world, batch)]
    consumed = min(consumed, len(uninterrupted[0]))  # a count past the pass is refused (test_stream_passes.py)
    before = ranks(world, batch)
    taken = [loop_batches(stream, workers[0], limit=consumed) for stream in before]
    assert all(taken[rank] == uninterrupted[rank][:consumed] for rank in range(world))
    state = json.loads(json.dumps(before[0].state_dict(consumed_batches=consumed)))
    assert all(stream.state_dict(consumed_batches=consumed) == state for stream in before)

    after = ranks(new_world, new_batch)
    for stream in after:
        stream.load_state_dict(state)
        stream.set_epoch(0)  # the restored epoch keeps its position
    rest = [loop_batches(stream, workers[1]) for stream in after]
    assert len({len(batches) for batches in rest}) == 1
    delivered = Counter(key.position for part in (taken, rest) for batches in part for key in keys_of(batches)
                        if not key.is_padding)  # fmt: skip
    assert sorted(delivered) == list(range(sum(counts))) and set(delivered.values()) == {1}
    if (new_world, new_batch) == (world, batch):  # the worker count alone changed: the very same batches
        assert [taken[rank] + rest[rank] for rank in range(world)] == uninterrupted


def test_a_resume_at_the_end_of_an_epoch_delivers_nothing_until_the_next_epoch() -> None:
    stream = make_stream([7, 5], batch_size=4, window=1)
    state = stream.state_dict(consumed_batches=3)
    assert state["position"] == 12
    resumed = make_stream([7, 5], batch_size=4, window=1)
    resumed.load_state_dict(state)
    assert (len(resumed), resumed.remaining_length()) == (12, 0) and list(resumed) == []
    assert (resumed.epoch, resumed.remaining_length()) == (1, 12)  # the empty pass ended the epoch: the next follows
    again = make_stream([7, 5], batch_size=4, window=1)
    again.load_state_dict(state)
    list(again)
    again.set_epoch(1)
    live = make_stream([7, 5], batch_size=4, window=1)
    live.set_epoch(1)
    assert list(again) == list(resumed) == list(live)


def test_padding_repeats_the_last_records_of_the_epoch_marked() -> None:
    streams = [make_stream([3, 4], batch_size=2, window=2, num_replicas=3, rank=r, yield_keys=True) for r in range(3)]
    keys = [key for stream in streams for _, key in stream]
    order = ShardedShuffle([3, 4], 2, 0, DEFAULT_SPREAD).epoch(0)
    padding = sorted((key.position, key.index) for key in keys if key.is_padding)
    assert padding == [(7, int(order.records(np.array([6]))[0])), (8, int(order.records(np.array([5]))[0]))]


def test_drop_with_fewer_records_than_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tail='drop' with 2 records on num_replicas=3 ranks would drop every"):
        len(make_stream([2], batch_size=1, tail="drop", num_replicas=3, rank=0))
