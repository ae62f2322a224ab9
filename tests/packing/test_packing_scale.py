"""Whole-record packing at scale (issue 26 item 5): an epoch's row count is counted for every window at once in
NumPy (``packing.bin_counts``), and must be exactly the count of the bins ``pack_window`` makes, window by window.

``tests.packing.frozen_packing.reference_pack_window`` is best-fit decreasing as ``order/packing.py`` defined it when the vectorised count
came in (a frozen copy): ``pack_window`` must keep making these bins, and ``bin_counts`` must count them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import PackedRows, TokenBudgetBatches
from stateful_sampler.order.packing import bin_counts, pack_window
from stateful_sampler.order.rows import RowOrder
from stateful_sampler.order.windows import PassWindows, WindowStarts
from tests.packing.frozen_packing import reference_pack_window

# capacities on every path: the room table's one bitmap level (< 64), two, three (>= 4032), and above 2**15 (the
# slots alone; a window of few bins takes the slots at any capacity)
capacities = st.one_of(
    st.integers(1, 70), st.integers(64, 600), st.integers(4000, 4200), st.integers(2**15 - 3, 2**15 + 3)
)


@st.composite
def windows_of_lengths(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    capacity = draw(capacities)
    rows = draw(st.integers(1, 40))  # from 32 rows on, the lock-step path
    width = draw(st.integers(1, 40))
    # few distinct lengths as often as many: equal rooms and equal records are where best fit has ties
    top = draw(st.sampled_from([capacity, max(1, capacity // 2), max(1, capacity // 3), min(capacity, 5)]))
    seed = draw(st.integers(0, 2**32 - 1))
    lengths = np.random.default_rng(seed).integers(1, top + 1, (rows, width))
    if draw(st.booleans()):  # some records exactly capacity, or just above half of it
        lengths[:, 0] = draw(st.sampled_from([capacity, capacity // 2 + 1, max(1, capacity // 2)]))
    return lengths, capacity


@settings(max_examples=400, deadline=None)
@given(windows_of_lengths(), st.booleans())
def test_bin_counts_are_the_reference_best_fit_bins_counted(windows, padded):
    lengths, capacity = windows
    reference = [reference_pack_window(row, capacity, padded) for row in lengths]
    assert [[members.tolist() for members in pack_window(row, capacity, padded=padded)] for row in lengths] == (
        reference
    )
    assert bin_counts(lengths, capacity, padded=padded).tolist() == [len(bins) for bins in reference]


def test_bin_counts_of_log_normal_windows_at_the_defaults_match_the_scalar_packer():
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(5, 1, (48, 4096)), 1, 2048).astype(np.int32)
    for capacity, padded in ((2048, False), (16384, False), (16384, True), (4096, True)):
        expected = [len(pack_window(row, capacity, padded=padded)) for row in lengths]
        assert bin_counts(lengths, capacity, padded=padded).tolist() == expected


def test_bin_counts_of_no_windows_and_of_records_all_alone():
    assert bin_counts(np.zeros((0, 5), dtype=np.int64), 10).tolist() == []
    assert bin_counts(np.full((40, 3), 6), 10).tolist() == [3] * 40  # every record longer than half
    assert bin_counts(np.ones((40, 3), dtype=np.int64), 1).tolist() == [3] * 40


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3000),
    st.integers(1, 300),
    st.integers(0, 2),
    st.integers(0, 2**32),
    st.booleans(),
    st.sampled_from([64, 200, 2048]),
)
def test_a_pass_row_count_is_the_sum_of_its_windows_packed_one_by_one(size, window, epoch, seed, padded, capacity):
    lengths = np.random.default_rng(seed).integers(1, capacity + 1, size)
    order = RowOrder(lengths, capacity, seed=seed, split=False, window=window, padded=padded)
    windows = PassWindows(size, window, seed, epoch)
    walked = [
        len(pack_window(lengths[windows.records(index)], capacity, padded=padded)) for index in range(windows.count)
    ]
    rows = order.rows(epoch)
    assert rows.count() == sum(walked)
    starts = np.concatenate(([0], np.cumsum(walked)))
    for index in {0, windows.count // 2, windows.count - 1}:  # every window's rows start where the walk says
        assert rows.anchor(int(starts[index])) == (index, int(starts[index]))


def test_truncated_records_are_counted_at_seq_len():
    lengths = np.random.default_rng(1).integers(1, 300, 20_000)
    order = RowOrder(lengths, 100, seed=3, split=False, window=256, truncate=True)
    windows = PassWindows(len(lengths), 256, 3, 0)
    kept = np.minimum(lengths, 100)
    assert order.rows(0).count() == sum(len(pack_window(kept[windows.records(i)], 100)) for i in range(windows.count))


def test_a_unit_far_past_the_known_starts_takes_every_window_at_once():
    measured: list[int] = []
    starts = WindowStarts(10, lambda index: measured.append(index) or 2, lambda: np.full(10, 2))
    assert starts.locate(17) == (8, 16)  # four windows walked, then all ten counted at once
    assert measured == [0, 1, 2, 3]
    assert starts.total() == 20 and starts.locate(3) == (1, 2)
    try:
        starts.locate(20)
    except IndexError as error:
        assert "20" in str(error)
    else:
        raise AssertionError("a unit past the end was located")


@pytest.mark.slow  # 200,000 records packed one by one
def test_samplers_draw_the_rows_their_count_promises_at_scale():
    lengths = np.clip(np.random.default_rng(2).lognormal(5, 1, 200_000), 1, 2048).astype(np.int32)
    rows = PackedRows(lengths, 2048, split_records=False, seed=5)
    plans = list(rows)
    assert len(plans) == rows.rows_in_epoch(0)
    assert sorted(record for plan in plans for record, _, _ in plan) == list(range(len(lengths)))
    for padded in (True, False):
        batches = TokenBudgetBatches(lengths, 16384, padded=padded, seed=5)
        drawn = list(batches)
        assert len(drawn) == batches.rows_in_epoch(0)
        assert sorted(record for batch in drawn for record in batch) == list(range(len(lengths)))
