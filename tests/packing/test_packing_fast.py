"""Whole-record packing at scale, the second pass (issue 26 item 5): the lock-step count of ``bin_counts`` was
rewritten (an always-present "new bin" room, one level fewer of gathers, a bin count read off the room table). The
rows must stay the rows of every release before it: here the old implementation is the reference, frozen in
``tests/packing/frozen_packing.py``: 0.2's walk, every window packed by best-fit decreasing in Python and its bins put in the window's drawn order.
A sampler's row count, every row it yields and the anchor a state saves must be the walk's."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stateful_sampler import PackedRows, TokenBudgetBatches
from stateful_sampler.order.packing import bin_counts
from stateful_sampler.order.windows import PassWindows
from tests.helpers import scaled_examples
from tests.packing.frozen_packing import reference_pack_window


def _old_rows(lengths: np.ndarray, capacity: int, seed: int, window: int, epoch: int, padded: bool) -> list[list[int]]:
    """Every row of a pass as 0.2 made them: window after window, the window's bins in its drawn order."""
    windows = PassWindows(len(lengths), window, seed, epoch)
    rows: list[list[int]] = []
    for index in range(windows.count):
        records = windows.records(index)
        bins = reference_pack_window(lengths[records].tolist(), capacity, padded)
        for at in windows.rng(index).permutation(len(bins)).tolist():
            rows.append(records[bins[at]].tolist())
    return rows


# every path of the lock-step: the room table's one bitmap level (capacity < 64), two, three (from 4032), the
# slots (few bins a window, or above 2**15), and few windows (below 32: packed one by one)
capacities = st.one_of(st.integers(1, 70), st.integers(100, 700), st.integers(4020, 4110), st.just(2**15 + 1))


@st.composite
def packings(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int]:
    capacity = draw(capacities)
    window = draw(st.integers(1, 64))
    size = draw(st.integers(1, 40 * window))
    top = draw(st.sampled_from([capacity, max(1, capacity // 2), max(1, capacity // 3), min(capacity, 4)]))
    lengths = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(1, top + 1, size)
    return lengths, capacity, window, draw(st.integers(0, 2**20))


@settings(max_examples=scaled_examples(150), deadline=None)
@given(packings(), st.integers(0, 1), st.booleans())
def test_whole_rows_and_token_budget_batches_are_the_old_walks(packing, epoch, padded):
    lengths, capacity, window, seed = packing
    old = _old_rows(lengths, capacity, seed, window, epoch, padded)
    batches = TokenBudgetBatches(lengths, capacity, padded=padded, window=window, seed=seed)
    assert batches.rows_in_epoch(epoch) == len(old)
    assert [batches.batch(epoch, row) for row in range(len(old))] == old
    if not padded:
        rows = PackedRows(lengths, capacity, split_records=False, window=window, seed=seed)
        rows.set_epoch(epoch)
        assert [[record for record, _, _ in plan] for plan in rows] == old


@settings(max_examples=scaled_examples(60), deadline=None)
@given(packings(), st.integers(1, 4), st.data())
def test_a_state_saved_mid_epoch_resumes_to_the_old_walks_rows(packing, world, data):
    lengths, capacity, window, seed = packing
    old = _old_rows(lengths, capacity, seed, window, 0, False)
    assume(len(old) >= world)  # fewer rows than ranks is refused at construction
    rank = data.draw(st.integers(0, world - 1))
    make = lambda: PackedRows(lengths, capacity, split_records=False, window=window, seed=seed, num_replicas=world,
                              rank=rank, tail="drop")  # fmt: skip
    saving = make()
    steps = len(old) // world
    stop = data.draw(st.integers(0, steps))
    iterator = iter(saving)
    for _ in range(stop):
        next(iterator)
    state = saving.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    expected = [old[step * world + rank] for step in range(stop, steps)]
    assert [[record for record, _, _ in plan] for plan in resumed] == expected


def test_log_normal_windows_at_the_default_window_are_the_old_counts():
    lengths = np.clip(np.random.default_rng(11).lognormal(5, 1, (40, 4096)), 1, 2048).astype(np.int32)
    for capacity, padded in ((2048, False), (16384, False), (16384, True), (4095, False), (4032, False)):
        expected = [len(reference_pack_window(row.tolist(), capacity, padded)) for row in lengths]
        assert bin_counts(lengths, capacity, padded=padded).tolist() == expected


def test_rooms_that_pile_up_on_one_value_are_counted():
    # 2,000 bins left with the same room (48), and records of exactly capacity: counts far above a byte
    lengths = np.array([[1000] * 4000 + [2048] * 96] * 32)
    assert bin_counts(lengths, 2048).tolist() == [2096] * 32
