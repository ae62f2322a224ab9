"""The shard-and-window order's ``spread``: each shard cut into ``spread`` contiguous pieces, a window of
about k shards' records drawn from one piece of each of k * spread shards. Pure order math, no stream."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.order.shards import ShardedShuffle

counts_lists = st.lists(st.integers(0, 40), min_size=1, max_size=20).filter(lambda counts: sum(counts) > 0)


def test_spread_1_is_the_order_of_the_release_before_spread() -> None:
    """Pinned from that release: ``ShardedShuffle([5, 0, 7, 3, 9, 4], 2, 11).epoch(3).records(range(28))``."""
    before = [11, 14, 9, 10, 7, 13, 5, 6, 12, 8, 21, 15, 18, 17, 19, 20, 23, 22, 16, 2, 4, 3, 1, 25, 27, 24, 0, 26]
    order = ShardedShuffle([5, 0, 7, 3, 9, 4], 2, 11).epoch(3)
    assert order.records(np.arange(28)).tolist() == before
    assert ShardedShuffle([5, 0, 7, 3, 9, 4], 2, 11, spread=1).epoch(3).records(np.arange(28)).tolist() == before


@settings(max_examples=80)
@given(counts=counts_lists, window=st.integers(1, 4), spread=st.integers(1, 5), seed=st.integers(0, 2**63 - 1),
       epoch=st.integers(0, 10**6))  # fmt: skip
def test_each_window_takes_one_contiguous_piece_of_each_shard_of_its_group(
    counts: list[int], window: int, spread: int, seed: int, epoch: int
) -> None:
    order = ShardedShuffle(counts, window, seed, spread).epoch(epoch)
    positions = np.arange(sum(counts))
    shards, rows = order.locate(positions)
    assert sorted(zip(shards.tolist(), rows.tolist())) == [(s, r) for s, n in enumerate(counts) for r in range(n)]
    windows = order.window_of(positions)
    assert np.all(np.diff(windows) >= 0)  # positions walk the windows in order
    for w in np.unique(windows).tolist():
        inside = windows == w
        assert set(shards[inside].tolist()) <= set(order.window_shards(w).tolist())  # its group's shards
        for shard in np.unique(shards[inside]).tolist():
            taken = np.sort(rows[inside][shards[inside] == shard])
            piece = counts[shard] // spread
            assert np.array_equal(taken, np.arange(taken[0], taken[0] + len(taken)))  # one contiguous piece
            assert piece <= len(taken) <= piece + 1  # a spread-th of the shard
    # spread windows per group of k * spread shards
    assert order.windows == -(-len(counts) // (window * spread)) * spread


def test_a_window_holds_k_shards_records_from_k_times_spread_shards() -> None:
    counts = [96] * 64
    whole = ShardedShuffle(counts, 4, 0).epoch(0)
    spread = ShardedShuffle(counts, 4, 0, spread=8).epoch(0)
    assert np.diff(whole.window_starts).tolist() == [384] * 16
    assert np.diff(spread.window_starts).tolist() == [384] * 16  # the same memory
    first_batch = np.arange(64)
    assert len(set(whole.locate(first_batch)[0].tolist())) == 4
    assert len(set(spread.locate(first_batch)[0].tolist())) > 20  # of the window's 32 shards


def test_the_pieces_rotate_so_no_window_takes_every_shards_first_rows() -> None:
    order = ShardedShuffle([80] * 16, 2, 5, spread=8).epoch(0)
    shards, rows = order.locate(np.arange(int(order.window_starts[1])))  # window 0
    first_rows = {int(shard): int(rows[shards == shard].min()) for shard in np.unique(shards).tolist()}
    assert len(first_rows) == 16 and len(set(first_rows.values())) > 3
    assert set(first_rows.values()) <= {10 * piece for piece in range(8)}


def test_the_order_is_a_function_of_seed_epoch_and_spread() -> None:
    counts = [30, 0, 17, 25, 9, 40, 12]
    records = {
        (seed, epoch, spread): ShardedShuffle(counts, 2, seed, spread).epoch(epoch).records(np.arange(133)).tolist()
        for seed in (0, 1)
        for epoch in (0, 1)
        for spread in (1, 2, 3)
    }
    assert len({tuple(order) for order in records.values()}) == len(records)
    assert ShardedShuffle(counts, 2, 1, 3).epoch(1).records(np.arange(133)).tolist() == records[(1, 1, 3)]


def test_locating_a_few_positions_equals_locating_the_epoch() -> None:
    order = ShardedShuffle([37, 0, 51, 8, 64, 19, 44], 2, 9, spread=3).epoch(2)
    everything = order.records(np.arange(223))
    picked = np.array([222, 0, 150, 151, 17, 99])
    assert order.records(picked).tolist() == everything[picked].tolist()


def test_a_spread_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"spread must be at least 1 piece per shard, got 0"):
        ShardedShuffle([3], 1, 0, spread=0)


@settings(max_examples=60)
@given(counts=counts_lists, window=st.integers(1, 4), spread=st.integers(1, 5), seed=st.integers(0, 2**63 - 1),
       epoch=st.integers(0, 100))  # fmt: skip
def test_piece_bounds_are_exactly_the_rows_a_window_takes_of_each_shard(
    counts: list[int], window: int, spread: int, seed: int, epoch: int
) -> None:
    shuffle = ShardedShuffle(counts, window, seed, spread)
    order = shuffle.epoch(epoch)
    positions = np.arange(sum(counts))
    shards, rows = order.locate(positions)
    starts, stops = shuffle.piece_bounds(shards, rows)
    windows = order.window_of(positions)
    for w in np.unique(windows).tolist():
        inside = windows == w
        for shard in np.unique(shards[inside]).tolist():
            mine = inside & (shards == shard)
            taken = np.sort(rows[mine])
            assert set(starts[mine].tolist()) == {int(taken[0])} and set(stops[mine].tolist()) == {int(taken[-1]) + 1}
            assert len(taken) == taken[-1] + 1 - taken[0]  # the piece is every row the window takes of the shard


orders = st.tuples(counts_lists, st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**63 - 1), st.integers(0, 10**6))


@settings(max_examples=80)
@given(cases=st.lists(st.tuples(orders, st.data()), min_size=1, max_size=6))
def test_locate_many_is_each_epoch_s_locate_bit_for_bit(cases: list[tuple[Any, st.DataObject]]) -> None:
    from stateful_sampler.order.shards import locate_many

    shuffles, epochs, positions, expected = [], [], [], []
    for (counts, window, spread, seed, epoch), data in cases:
        shuffle = ShardedShuffle(counts, window, seed, spread)
        picked = np.array(data.draw(st.lists(st.integers(0, shuffle.size - 1), max_size=12)), dtype=np.int64)
        shuffles.append(shuffle), epochs.append(epoch), positions.append(picked)
        expected.append(tuple(found.tolist() for found in shuffle.epoch(epoch).locate(picked)))
    groups = np.repeat(np.arange(len(positions)), [len(picked) for picked in positions])
    mixed = np.random.default_rng(len(groups)).permutation(len(groups))  # the orders' positions interleaved
    shards, rows = np.empty_like(groups), np.empty_like(groups)
    shards[mixed], rows[mixed] = locate_many(shuffles, epochs, groups[mixed], np.concatenate(positions)[mixed])
    cuts = np.cumsum([len(picked) for picked in positions])[:-1]
    found = zip(np.split(shards, cuts), np.split(rows, cuts))
    assert [(shards.tolist(), rows.tolist()) for shards, rows in found] == expected
