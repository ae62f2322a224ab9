"""``order/layout.py`` on its own: which global positions an epoch has under each tail policy, how the ranks
stride through them, and where they sit in the stream of passes (the carry stream)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stateful_sampler.order.layout import EpochLayout, carry_epoch_start
from stateful_sampler.order.policies import Tail

TAILS = st.sampled_from(list(Tail))


def positions_of(layout: EpochLayout, rank: int) -> list[int]:
    return layout.global_positions(rank, 0, layout.local_length(rank)).tolist()


# --- exact layouts ------------------------------------------------------------------------------------------


def test_pad_rounds_up_with_marked_repeats_that_wrap_onto_the_pass_start() -> None:
    layout = EpochLayout.build(Tail.PAD, size=10, world_size=4, epoch=3, global_batch=8, carry_start=0)
    assert (layout.length, layout.segment_start, layout.stream_start) == (12, 0, 30)
    assert [positions_of(layout, rank) for rank in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    positions = np.arange(12)
    assert layout.is_padding(positions).tolist() == [False] * 10 + [True, True]
    assert layout.pass_offsets(positions).tolist() == list(range(10)) + [0, 1]
    assert layout.unused_offsets() == range(0)


def test_drop_cuts_the_last_partial_round_and_reports_the_cut_offsets() -> None:
    layout = EpochLayout.build(Tail.DROP, size=10, world_size=4, epoch=1, global_batch=4, carry_start=0)
    assert layout.length == 8
    assert [layout.local_length(rank) for rank in range(4)] == [2, 2, 2, 2]
    assert layout.unused_offsets() == range(8, 10)
    assert not layout.is_padding(np.arange(8)).any()
    assert layout.pass_offsets(np.arange(8)).tolist() == list(range(8))


def test_uneven_takes_every_position_once_and_ranks_differ_by_at_most_one() -> None:
    layout = EpochLayout.build(Tail.UNEVEN, size=10, world_size=4, epoch=0, global_batch=4, carry_start=0)
    assert layout.length == 10
    assert [positions_of(layout, rank) for rank in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    # the longer ranks take their last position in the step the shorter ones end: every rank reports the end
    assert [layout.position_after(rank, layout.local_length(rank)) for rank in range(4)] == [10] * 4
    assert [layout.position_after(rank, 1) for rank in range(4)] == [4] * 4
    # resumed at 8: two positions left for four ranks; the two without one report the segment's start
    tail_end = EpochLayout.build(Tail.UNEVEN, 10, 4, epoch=0, global_batch=4, carry_start=0, segment_start=8)
    assert [positions_of(tail_end, rank) for rank in range(4)] == [[8], [9], [], []]
    assert [tail_end.position_after(rank, 0) for rank in range(4)] == [8] * 4
    assert [tail_end.position_after(rank, tail_end.local_length(rank)) for rank in range(4)] == [10, 10, 8, 8]


def test_carry_keeps_whole_global_batches_and_reads_the_remainder_of_the_pass_before() -> None:
    size, batch = 10, 8  # 4 ranks of 2: a global batch of 8
    first = EpochLayout.build(Tail.CARRY, size, 4, epoch=0, global_batch=batch, carry_start=0)
    assert (first.length, first.stream_start) == (8, 0)
    assert first.unused_offsets() == range(8, 10)  # rolled over into epoch 1
    start = carry_epoch_start(size, batch, 1)
    assert start == 8
    second = EpochLayout.build(Tail.CARRY, size, 4, epoch=1, global_batch=batch, carry_start=start)
    assert (second.length, second.stream_start) == (8, 8)
    # relative to pass 1's start (stream position 10): the last two of pass 0, then six of pass 1
    assert second.pass_offsets(np.arange(8)).tolist() == [-2, -1, 0, 1, 2, 3, 4, 5]
    assert second.unused_offsets() == range(6, 10)


def test_a_global_batch_beyond_the_pass_takes_nothing_under_carry_and_hands_on_the_whole_pass() -> None:
    layout = EpochLayout.build(Tail.CARRY, size=5, world_size=2, epoch=0, global_batch=8, carry_start=0)
    assert layout.length == 0
    assert [layout.local_length(rank) for rank in range(2)] == [0, 0]
    assert [layout.position_after(rank, 0) for rank in range(2)] == [0, 0]
    assert layout.unused_offsets() == range(5)


def test_a_resumed_segment_is_laid_out_on_the_new_ranks_from_the_saved_position() -> None:
    # 7 of 20 positions consumed (by any ranks); the rest on 3 ranks, padded to a whole round
    layout = EpochLayout.build(Tail.PAD, 20, 3, epoch=0, global_batch=3, carry_start=0, segment_start=7)
    assert (layout.segment_start, layout.length) == (7, 22)
    assert [positions_of(layout, rank) for rank in range(3)] == [
        [7, 10, 13, 16, 19],
        [8, 11, 14, 17, 20],
        [9, 12, 15, 18, 21],
    ]
    assert [layout.local_before(rank) for rank in range(3)] == [3, 2, 2]  # of 0..6 striding from 0 on 3 ranks
    assert [layout.position_after(rank, 0) for rank in range(3)] == [7, 7, 7]
    assert [layout.position_after(rank, 2) for rank in range(3)] == [13, 13, 13]
    assert layout.is_padding(np.array([19, 20, 21])).tolist() == [False, True, True]


def test_a_known_end_is_kept() -> None:
    layout = EpochLayout.build(Tail.PAD, 10, 4, epoch=0, global_batch=4, carry_start=0, segment_start=4, end=12)
    assert layout.length == 12
    kept = EpochLayout.build(Tail.UNEVEN, 10, 3, epoch=0, global_batch=3, carry_start=0, segment_start=4, end=9)
    assert kept.length == 9  # where the saving run's epoch finished, not 10
    assert [positions_of(kept, rank) for rank in range(3)] == [[4, 7], [5, 8], [6]]


def test_carry_epoch_start_keeps_the_boundaries_an_anchor_crossed() -> None:
    assert [carry_epoch_start(10, 4, epoch) for epoch in range(5)] == [0, 8, 20, 28, 40]
    # a run that moved to a global batch of 6 at epoch 2 (start 20): its later epochs follow from there
    assert carry_epoch_start(10, 6, 2, anchor_epoch=2, anchor_start=20) == 20
    assert [carry_epoch_start(10, 6, epoch, 2, 20) for epoch in (3, 4)] == [26, 38]
    # an epoch before the anchor is laid out from epoch 0
    assert carry_epoch_start(10, 6, 1, anchor_epoch=2, anchor_start=20) == carry_epoch_start(10, 6, 1) == 6


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[EpochLayout, int]:
    """A layout of any policy, possibly a resumed segment (with the global batch of its ranks)."""
    tail = draw(TAILS)
    size = draw(st.integers(1, 60))
    world_size = draw(st.integers(1, 9))
    batch = draw(st.integers(1, 4))
    epoch = draw(st.integers(0, 5))
    global_batch = batch * world_size
    carry_start = carry_epoch_start(size, global_batch, epoch) if tail is Tail.CARRY else 0
    limit = EpochLayout.build(tail, size, world_size, epoch, global_batch, carry_start).length
    segment_start = draw(st.integers(0, limit))
    return EpochLayout.build(tail, size, world_size, epoch, global_batch, carry_start, segment_start), global_batch


@given(layouts())
def test_every_position_of_the_segment_is_dealt_to_exactly_one_rank_slot(case: tuple[EpochLayout, int]) -> None:
    layout, _ = case
    dealt = [position for rank in range(layout.world_size) for position in positions_of(layout, rank)]
    assert sorted(dealt) == list(range(layout.segment_start, layout.length))
    for rank in range(layout.world_size):
        lane = (layout.segment_start + rank) % layout.world_size
        assert {position % layout.world_size for position in positions_of(layout, rank)} <= {lane}


@given(layouts())
def test_ranks_take_equal_shares_except_under_uneven(case: tuple[EpochLayout, int]) -> None:
    layout, global_batch = case
    shares = [layout.local_length(rank) for rank in range(layout.world_size)]
    if layout.tail is Tail.UNEVEN:
        assert max(shares) - min(shares) <= 1
        assert layout.length == max(layout.size, layout.segment_start)
    else:
        assert len(set(shares)) == 1
    if layout.tail is Tail.CARRY:
        assert (layout.length - layout.segment_start) % global_batch == 0


@given(layouts())
def test_padding_is_marked_and_only_pad_has_it(case: tuple[EpochLayout, int]) -> None:
    layout, _ = case
    positions = np.arange(layout.length)
    padding = layout.is_padding(positions)
    offsets = layout.pass_offsets(positions)
    if layout.tail is Tail.PAD:
        assert padding.tolist() == (positions >= layout.size).tolist()
        assert int(padding.sum()) < layout.world_size  # only the last round is evened out
        assert offsets.tolist() == (positions % layout.size).tolist()  # a repeat is a record of the pass
    else:
        assert not padding.any()
    if layout.tail is Tail.DROP:
        assert layout.length <= layout.size


@given(layouts())
def test_position_after_and_local_before_agree_with_the_positions_dealt(case: tuple[EpochLayout, int]) -> None:
    layout, _ = case
    for rank in range(layout.world_size):
        assert layout.local_before(rank) == sum(1 for p in range(layout.segment_start) if p % layout.world_size == rank)
        taken = positions_of(layout, rank)
        assert layout.position_after(rank, 0) == layout.segment_start
        for count in range(1, len(taken)):
            # after `count` takes, the run as a whole is at the start of the step holding the next one
            after = layout.position_after(rank, count)
            assert after == layout.segment_start + count * layout.world_size
            assert after <= taken[count] < after + layout.world_size
        if taken:
            assert layout.position_after(rank, len(taken)) == layout.length


@given(size=st.integers(1, 50), world_size=st.integers(1, 6), batch=st.integers(1, 5), epochs=st.integers(1, 8))
def test_carry_epochs_tile_the_stream_of_passes_without_gap_or_overlap(
    size: int, world_size: int, batch: int, epochs: int
) -> None:
    global_batch = batch * world_size
    end = 0
    for epoch in range(epochs):
        start = carry_epoch_start(size, global_batch, epoch)
        layout = EpochLayout.build(Tail.CARRY, size, world_size, epoch, global_batch, start)
        assert layout.stream_start == start == end
        assert epoch * size - global_batch < start <= epoch * size  # never a whole global batch behind
        offsets = layout.pass_offsets(np.arange(layout.length))
        assert (offsets + epoch * size).tolist() == list(range(start, start + layout.length))
        unused = layout.unused_offsets()
        assert unused.start == start - epoch * size + layout.length and unused.stop == max(unused.start, size)
        end = start + layout.length


@given(
    size=st.integers(1, 50),
    world_size=st.integers(1, 6),
    epoch=st.integers(0, 6),
    tail=st.sampled_from([Tail.PAD, Tail.DROP, Tail.UNEVEN]),
)
def test_each_epoch_of_pad_drop_and_uneven_reads_its_own_pass_and_reports_what_it_leaves(
    size: int, world_size: int, epoch: int, tail: Tail
) -> None:
    layout = EpochLayout.build(tail, size, world_size, epoch, world_size, carry_start=0)
    assert layout.stream_start == epoch * size
    taken = set(layout.pass_offsets(np.arange(layout.length)).tolist())
    left = set(layout.unused_offsets())
    assert taken.isdisjoint(left) and taken | left == set(range(size))
    assert bool(left) == (tail is Tail.DROP and size % world_size != 0)


@given(
    size=st.integers(1, 10**6),
    global_batch=st.integers(1, 5000),
    anchor=st.integers(0, 20),
    epoch=st.integers(0, 40),
)
def test_carry_epoch_start_from_an_anchor_it_computed_is_the_start_from_epoch_0(
    size: int, global_batch: int, anchor: int, epoch: int
) -> None:
    """The closed form telescopes: s(e) from any anchor (a, s(a)) on the same global batch is s(e) from 0,
    and it is the recursion s(e+1) = s(e) + G * floor(((e+1) * N - s(e)) / G)."""
    anchor_start = carry_epoch_start(size, global_batch, anchor)
    assert carry_epoch_start(size, global_batch, epoch, anchor, anchor_start) == carry_epoch_start(
        size, global_batch, epoch
    )
    start = 0
    for step in range(min(epoch, 10)):
        start += global_batch * (((step + 1) * size - start) // global_batch)
    assert carry_epoch_start(size, global_batch, min(epoch, 10)) == start
