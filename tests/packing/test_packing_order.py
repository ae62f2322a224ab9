"""The pure packing math: the bin rule, concatenate-and-cut rows, whole-record rows, window starts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.order.packing import bin_cost, pack_window
from stateful_sampler.order.rows import RowOrder
from stateful_sampler.order.windows import WindowStarts

lengths_lists = st.lists(st.integers(1, 40), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(lengths_lists, st.integers(40, 120), st.booleans())
def test_pack_window_is_a_partition_within_the_budget(lengths, capacity, padded):
    array = np.array(lengths)
    bins = pack_window(array, capacity, padded=padded)
    members = np.concatenate(bins)
    assert sorted(members.tolist()) == list(range(len(lengths)))
    assert all(bin_cost(array[members], padded=padded) <= capacity for members in bins)
    assert all(len(members) for members in bins)


def test_pack_window_opens_a_bin_only_when_no_open_bin_takes_the_record():
    assert [b.tolist() for b in pack_window(np.array([5, 3, 4, 2]), 7)] == [[0, 3], [1, 2]]
    # padded: longest x count; 6 x 2 = 12 > 10, so every 6 is alone, the 2s go 5 to a bin
    assert [b.tolist() for b in pack_window(np.array([6, 2, 6, 2, 2]), 10, padded=True)] == [[0], [2], [1, 3, 4]]


def test_best_fit_decreasing_packs_lognormal_lengths_nearly_full():
    lengths = np.clip(np.random.default_rng(3).lognormal(5, 1, 4096).astype(np.int64), 1, 2048)
    bins = pack_window(lengths, 2048)
    assert lengths.sum() / (2048 * len(bins)) > 0.99


def _order(lengths, capacity, split, window, seed=0, **kwargs):
    return RowOrder(np.array(lengths, dtype=np.int64), capacity, seed=seed, split=split, window=window, **kwargs)


@settings(max_examples=120, deadline=None)
@given(lengths_lists, st.integers(1, 64), st.integers(1, 50), st.integers(0, 3), st.integers(0, 2**32))
def test_split_rows_cover_every_token_once_in_rows_of_exactly_seq_len(lengths, seq_len, window, epoch, seed):
    rows = _order(lengths, seq_len, True, window, seed).rows(epoch)
    covered = [np.zeros(length, dtype=int) for length in lengths]
    sizes = []
    for row in range(rows.count()):
        plan = rows.row(row)
        sizes.append(sum(stop - start for _, start, stop in plan))
        for record, start, stop in plan:
            assert 0 <= start < stop <= lengths[record]
            covered[record][start:stop] += 1
    assert all((tokens == 1).all() for tokens in covered)
    assert sizes[:-1] == [seq_len] * (len(sizes) - 1) and 1 <= sizes[-1] <= seq_len


@settings(max_examples=120, deadline=None)
@given(lengths_lists, st.integers(40, 100), st.integers(1, 50), st.integers(0, 3), st.booleans())
def test_whole_rows_hold_every_record_once_within_seq_len(lengths, seq_len, window, epoch, padded):
    rows = _order(lengths, seq_len, False, window, padded=padded).rows(epoch)
    seen = []
    for row in range(rows.count()):
        records = rows.batch(row)
        assert bin_cost(np.array(lengths)[records], padded=padded) <= seq_len
        seen += records
    assert sorted(seen) == list(range(len(lengths)))


@settings(max_examples=80, deadline=None)
@given(lengths_lists, st.integers(1, 64), st.integers(1, 30), st.booleans(), st.data())
def test_rows_found_from_a_remembered_anchor_equal_rows_walked_from_the_start(lengths, capacity, window, split, data):
    if not split:
        capacity = max(capacity, max(lengths))
    walked = _order(lengths, capacity, split, window).rows(1)
    count = walked.count()
    row = data.draw(st.integers(0, count - 1))
    index, start = walked.anchor(row)
    fresh = _order(lengths, capacity, split, window).rows(1)
    fresh.starts.remember(index, start)
    if not split:
        fresh.starts.remember(fresh.starts.count, count)
    assert [fresh.row(at) for at in range(row, count)] == [walked.row(at) for at in range(row, count)]
    assert fresh.count() == count


def test_epochs_and_seeds_pack_differently_and_the_same_inputs_alike():
    lengths = np.random.default_rng(0).integers(1, 30, 500)
    first = [_order(lengths, 64, False, 100).rows(0).batch(r) for r in range(5)]
    assert first == [_order(lengths, 64, False, 100).rows(0).batch(r) for r in range(5)]
    assert first != [_order(lengths, 64, False, 100).rows(1).batch(r) for r in range(5)]
    assert first != [_order(lengths, 64, False, 100, seed=1).rows(0).batch(r) for r in range(5)]


def test_window_starts_walk_forward_and_refuse_a_unit_past_the_end():
    starts = WindowStarts(3, lambda index: [4, 2, 5][index])
    assert [starts.locate(unit) for unit in (0, 3, 4, 5, 6, 10)] == [(0, 0), (0, 0), (1, 4), (1, 4), (2, 6), (2, 6)]
    assert starts.total() == 11
    try:
        starts.locate(11)
    except IndexError as error:
        assert "11" in str(error)
    else:
        raise AssertionError("a unit past the end was located")
