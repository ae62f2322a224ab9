"""``bin_counts``' kernels (issue 26 item 5) over degenerate inputs: each must count exactly the bins of the frozen
best-fit decreasing, window by window. The kernels: a row of slots a window, one a bin up to the window's bin
bound (few bins: the default), a room table (many bins in a capacity up to 2**15; forced here by a slot limit of
0), and ``pack_window`` one window at a time (fewer than 32 windows, or capacity x width from 2**60 on). The
choice between them is private, so these tests set it through ``order.packing``'s private limits."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.order import packing
from stateful_sampler.order.packing import bin_counts
from tests.helpers import scaled_examples
from tests.packing.frozen_packing import reference_pack_window

KINDS = ("capacity", "above half", "half", "ones", "any", "singles and small")


@st.composite
def degenerate_windows(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    capacity = draw(st.sampled_from([1, 2, 3, 4, 64, 2**15, 2**15 + 1, 2**20, 2**40, 2**59]))
    rows = draw(st.sampled_from([1, 2, 31, 32, 33, 40]))  # below 32 windows: packed one by one
    width = draw(st.sampled_from([1, 2, 3, 7, 40]))
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    half = capacity // 2
    if kind == "capacity":
        lengths = np.full((rows, width), capacity, dtype=np.int64)
    elif kind == "above half":  # every record alone in its bin
        lengths = rng.integers(half + 1, capacity + 1, (rows, width))
    elif kind == "half":  # two a bin (one at capacity 1): the last bin's records at most half of it
        lengths = np.full((rows, width), max(1, half), dtype=np.int64)
    elif kind == "ones":
        lengths = np.ones((rows, width), dtype=np.int64)
    elif kind == "any":
        lengths = rng.integers(1, capacity + 1, (rows, width))
    else:  # a few records alone, the rest small: the slots they open come before the steps'
        lengths = rng.integers(1, max(2, capacity // 8 + 1), (rows, width))
        lengths[:, : width // 3] = rng.integers(half + 1, capacity + 1, (rows, width // 3))
    dtype = draw(st.sampled_from([np.int64, np.int32])) if capacity < 2**31 else np.int64
    return lengths.astype(dtype), capacity


@settings(max_examples=scaled_examples(300), deadline=None)
@given(degenerate_windows(), st.booleans())
def test_every_kernel_counts_the_reference_bins_of_degenerate_windows(windows, table):
    lengths, capacity = windows
    expected = [len(reference_pack_window(row.tolist(), capacity, False)) for row in lengths]
    # private: the kernel choice is private; a slot limit of 0 takes the table wherever the capacity allows it
    with mock.patch.object(packing, "_SLOT_LIMIT", 0 if table else packing._SLOT_LIMIT):
        assert bin_counts(lengths, capacity).tolist() == expected


def test_a_window_past_its_slots_is_packed_alone_and_counted_exactly():
    # three records of half the capacity make two bins; with one slot a window the second finds no slot
    lengths = np.full((32, 3), 3, dtype=np.int64)
    lengths[5] = [1, 1, 1]  # one bin: fits its one slot
    # private: a bound too low cannot come from real inputs (it is proven), so it is put in here
    with mock.patch.object(packing, "_bin_bounds", lambda windows, capacity: np.ones(len(windows), dtype=np.int64)):
        assert bin_counts(lengths, 6).tolist() == [2] * 5 + [1] + [2] * 26


def test_few_bins_take_the_slots_and_many_bins_in_a_small_capacity_the_table():
    lengths = np.full((32, 800), 2, dtype=np.int64)  # capacity 4, two records a bin: bound 533, the table
    counted: list[str] = []
    slots, table = packing._slot_counts, packing._table_counts  # private: which kernel counted is private
    with (
        mock.patch.object(packing, "_slot_counts", lambda *a: counted.append("slots") or slots(*a)),
        mock.patch.object(packing, "_table_counts", lambda *a: counted.append("table") or table(*a)),
    ):
        assert bin_counts(lengths, 4).tolist() == [400] * 32
        assert bin_counts(lengths[:, :600], 4).tolist() == [300] * 32  # bound 400: the slots
        assert bin_counts(np.full((32, 600), 2**14 + 1), 2**15 + 2).tolist() == [300] * 32  # bound 600, past the table
    assert counted == ["table", "slots", "slots"]


@settings(max_examples=scaled_examples(100), deadline=None)
@given(degenerate_windows(), st.booleans(), st.integers(1, 7))
def test_windows_counted_in_several_even_batches_count_the_reference_bins(windows, table, cells):
    lengths, capacity = windows
    expected = [len(reference_pack_window(row.tolist(), capacity, False)) for row in lengths]
    # private: the cells a batch holds, so small that 32-40 windows make several batches, some of one window
    with (
        mock.patch.object(packing, "_SLOT_LIMIT", 0 if table else packing._SLOT_LIMIT),
        mock.patch.object(packing, "_TABLE_CELLS", cells * capacity),
        mock.patch.object(packing, "_SLOT_CELLS", cells),
    ):
        assert bin_counts(lengths, capacity).tolist() == expected


def test_even_batches_split_windows_into_the_fewest_batches_of_at_most_the_most():
    for count in range(1, 300):
        for most in range(1, 40):
            size = packing.even_batch(count, most)
            batches = -(-count // size)
            last = count - (batches - 1) * size
            # as few batches as batches of ``most``, and the last short of the others by fewer than the batches
            assert size <= most and batches == -(-count // most) and size - last < batches


@settings(max_examples=scaled_examples(200), deadline=None)
@given(degenerate_windows())
def test_padded_counts_are_the_reference_bins_of_degenerate_windows(windows):
    lengths, capacity = windows
    given_lengths = lengths.tolist()
    expected = [len(reference_pack_window(row, capacity, True)) for row in given_lengths]
    assert bin_counts(lengths, capacity, padded=True).tolist() == expected
    assert lengths.tolist() == given_lengths  # the caller's windows are not sorted in place


@st.composite
def windows_of_few_lengths(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Windows of a few distinct lengths (long runs of equal records), some windows far longer in runs than others:
    a step is one visit a window, so windows finish at different steps and a bin takes many records of a run."""
    capacity = draw(st.sampled_from([1, 2, 5, 12, 64, 100, 2048, 2**15 + 1, 2**33]))
    rows, width = draw(st.sampled_from([32, 35])), draw(st.integers(1, 90))
    values = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.choice(np.array(values, dtype=np.int64), (rows, width))
    lengths[: rows // 2, width // 2 :] = min(values)  # half the windows end in one long run
    return lengths, capacity


@settings(max_examples=scaled_examples(200), deadline=None)
@given(windows_of_few_lengths(), st.booleans(), st.sampled_from([1, 3, 16]))
def test_runs_of_equal_lengths_count_the_reference_bins(windows, table, every):
    lengths, capacity = windows
    expected = [len(reference_pack_window(row.tolist(), capacity, False)) for row in lengths]
    # private: the kernel choice, and how often the lock-step looks for windows that placed every record
    with (
        mock.patch.object(packing, "_SLOT_LIMIT", 0 if table else packing._SLOT_LIMIT),
        mock.patch.object(packing, "_DONE_EVERY", every),
    ):
        assert bin_counts(lengths, capacity).tolist() == expected
