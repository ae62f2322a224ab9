"""Packing inputs at their limits: lengths and totals that do not fit are refused naming the record, and
big-but-valid lengths (a pass of up to 2**62 - 1 tokens) are packed exactly."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import PackedRows, TokenBudgetBatches

MAX_TOKENS = 2**62 - 1


def _covers_each_token_once(plans, lengths):
    """Every record's slices, over all rows, tile [0, length) exactly (checked on slices, not on token arrays)."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for plan in plans:
        if not plan.is_padding:
            for record, start, stop in plan:
                pieces.setdefault(record, []).append((start, stop))
    for record, length in enumerate(lengths):
        reached = 0
        for start, stop in sorted(pieces.get(record, [])):
            assert start == reached and stop > start
            reached = stop
        assert reached == length


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (  # the repro: the total wrapped round and no row came out
            lambda: PackedRows([2**62, 2**62, 5], 4),
            "lengths must hold integer token counts of at most 2**62 - 1, got 4611686018427387904 for record 0",
        ),
        (  # a uint64 column with a -1 marker
            lambda: PackedRows(np.array([3, 2**64 - 1, 4], dtype=np.uint64), 4),
            "lengths must hold integer token counts of at most 2**62 - 1, got 18446744073709551615 for record 1",
        ),
        (
            lambda: PackedRows(np.array([3, 2**64 - 1, 4], dtype=np.uint64), 4, split_records=False, truncate=True),
            "got 18446744073709551615 for record 1",
        ),
        (
            lambda: TokenBudgetBatches(np.array([3, 4, 2**63], dtype=np.uint64), 8),
            "got 9223372036854775808 for record 2",
        ),
        (lambda: PackedRows([2.0, 1e30], 4), "of at most 2**62 - 1, got 1e+30 for record 1"),
        (lambda: PackedRows([5, 2**64], 4), "of at most 2**62 - 1, got 18446744073709551616 for record 1"),
        (lambda: PackedRows([5, -(2**70)], 4), "within int64, got -1180591620717411303424 for record 1"),
        (lambda: PackedRows(np.array([5, -3], dtype=np.int8), 4), "at least 1 token each, got -3 for record 1"),
        (lambda: PackedRows([5, 2.5], 4), "integer token counts, got dtype float64 with 2.5 for record 1"),
        (lambda: PackedRows([5, None], 4), "integer token counts, got NoneType None for record 1"),
        (  # each length fits, the running total does not
            lambda: PackedRows([7, 2**61, 2**61, 5], 4),
            (
                "lengths must add up to at most 2**62 - 1 tokens (a pass's token offsets are int64), got more: "
                "the running total passes it at record 2 (2305843009213693952 tokens)"
            ),
        ),
        (
            lambda: TokenBudgetBatches([2**61, 2**61, 5], 2**62 - 1),
            "the running total passes it at record 1",
        ),
        (lambda: PackedRows([3, 2], 2**62), "seq_len must be at least 1 and at most 4611686018427387903, got 2**62"),
        (
            lambda: TokenBudgetBatches([3, 2], 2**70, padded=False),
            "max_tokens must be at least 1 and at most 4611686018427387903, got 1180591620717411303424",
        ),
    ],
)
def test_a_length_or_total_that_does_not_fit_is_refused_naming_the_record(call, message):
    message = message.replace("got 2**62", f"got {2**62}")
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call()


def test_the_running_total_is_found_past_the_first_chunk_of_a_long_array():
    lengths = np.full(2**20 + 10, 2**42 - 1, dtype=np.int64)  # passes 2**62 - 1 at the 2**20 + 1-th record
    with pytest.raises(ValueError, match=re.escape(f"passes it at record {2**20} ({2**42 - 1} tokens)")):
        PackedRows(lengths, 2**40)
    lengths[-11:] = 1  # now the total fits
    assert PackedRows(lengths, 2**40).strategy.tokens == int(lengths.astype(object).sum())


def test_a_pass_of_2_to_the_62_minus_1_tokens_is_packed_exactly():
    lengths = np.array([2**61, 2**61 - 7, 5, 1], dtype=np.uint64)  # exactly MAX_TOKENS in all
    assert int(lengths.astype(object).sum()) == MAX_TOKENS
    for seq_len in (2**60, 2**61 + 3, MAX_TOKENS):
        rows = PackedRows(lengths, seq_len, seed=3, num_replicas=2, rank=0)
        plans = [rows.plan(0, row) for row in range(rows.rows_in_epoch(0))]
        assert len(plans) == -(-MAX_TOKENS // seq_len)
        assert all(sum(stop - start for _, start, stop in plan) <= seq_len for plan in plans)
        _covers_each_token_once([type("P", (list,), {"is_padding": False})(plan) for plan in plans], lengths.tolist())
    whole = PackedRows(lengths, 2**61, split_records=False, window=2)
    assert sorted(s for row in range(whole.rows_in_epoch(0)) for s in whole.plan(0, row)) == [
        (0, 0, 2**61), (1, 0, 2**61 - 7), (2, 0, 5), (3, 0, 1)]  # fmt: skip
    budget = TokenBudgetBatches(lengths, MAX_TOKENS, padded=False)
    assert [sorted(batch) for batch in budget] == [[0, 1, 2, 3]]  # one batch of exactly the budget
    padded = TokenBudgetBatches(lengths, MAX_TOKENS, padded=True)
    costs = [max(int(lengths[r]) for r in batch) * len(batch) for batch in padded]
    assert all(cost <= MAX_TOKENS for cost in costs) and sorted(r for b in padded for r in b) == [0, 1, 2, 3]


def test_a_users_integer_array_is_used_as_it_is():
    lengths = np.array([3, 2**40, 7], dtype=np.uint64)
    assert PackedRows(lengths, 8).strategy.lengths is lengths


big_lengths = st.lists(st.integers(1, 2**56), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(big_lengths, st.integers(1, 60), st.integers(1, 3), st.integers(1, 8), st.integers(0, 3))
def test_any_valid_lengths_give_every_token_once_per_epoch_in_split_rows(lengths, rows, world_size, window, epoch):
    seq_len = max(1, sum(lengths) // rows)  # at most ~60 rows whatever the lengths
    plans = []
    for rank in range(world_size):
        sampler = PackedRows(lengths, seq_len, window=window, seed=9, num_replicas=world_size, rank=rank)
        sampler.set_epoch(epoch)
        plans += list(sampler)
    assert sum(not plan.is_padding for plan in plans) == -(-sum(lengths) // seq_len)
    assert all(sum(stop - start for _, start, stop in plan) <= seq_len for plan in plans)
    _covers_each_token_once(plans, lengths)


@settings(max_examples=60, deadline=None)
@given(big_lengths, st.integers(1, 3), st.integers(1, 8), st.booleans())
def test_any_valid_lengths_give_each_record_whole_once_per_epoch(lengths, world_size, window, padded):
    capacity = max(lengths) * 3
    plans = []
    for rank in range(world_size):
        plans += list(PackedRows(lengths, capacity, split_records=False, window=window, num_replicas=world_size,
                                 rank=rank))  # fmt: skip
    _covers_each_token_once(plans, lengths)
    batches = TokenBudgetBatches(lengths, capacity, padded=padded, window=window)
    assert sorted(record for batch in batches for record in batch) == list(range(len(lengths)))


def _lookups():
    rows = PackedRows([5, 3, 8, 2], 6, seed=1)
    whole = PackedRows([5, 3, 8, 2], 8, seed=1, split_records=False)
    batches = TokenBudgetBatches([5, 3, 8, 2], 8, seed=1)
    return [(rows.plan, "row", "rows"), (whole.plan, "row", "rows"), (batches.batch, "index", "batches")]


@pytest.mark.parametrize("lookup", range(3), ids=["split-plan", "whole-plan", "batch"])
def test_a_row_lookup_out_of_range_is_refused_naming_the_argument_and_the_range(lookup):
    call, name, unit = _lookups()[lookup]
    count = call.__self__.rows_in_epoch(0)
    assert count == 3
    for row in (-1, -(2**70), count, count + 1, 2**70):
        with pytest.raises(IndexError, match=re.escape(f"{name} must lie in [0, 3), the {unit} of epoch 0 over all ranks, got {row}")):  # fmt: skip
            call(0, row)
    for epoch, shown in ((-1, "-1"), (2**62, str(2**62)), (2**64, str(2**64))):
        with pytest.raises(ValueError, match=re.escape(f"epoch must be at least 0 and at most {2**62 - 1}, got {shown}")):  # fmt: skip
            call(epoch, 0)
    with pytest.raises(ValueError, match="^epoch must be"):
        call.__self__.rows_in_epoch(-1)
    with pytest.raises(TypeError, match=re.escape(f"{name} must be an int, got float 1.0")):
        call(0, 1.0)
    assert [call(0, np.int64(row)) for row in range(count)] == [call(0, row) for row in range(count)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=40), st.booleans(), st.integers(1, 8), st.data())
def test_any_row_outside_the_epoch_is_refused_and_every_row_inside_is_the_one_iterated(lengths, split, window, data):
    rows = PackedRows(lengths, 30, split_records=split, window=window, seed=4)
    batches = TokenBudgetBatches(lengths, 30, window=window, seed=4)
    for sampler, lookup, name in ((rows, rows.plan, "row"), (batches, batches.batch, "index")):
        epoch = data.draw(st.integers(0, 3))
        fresh = type(sampler)(
            lengths, 30, window=window, seed=4, **({"split_records": split} if sampler is rows else {})
        )
        count = sampler.rows_in_epoch(epoch)
        row = data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=count)))
        with pytest.raises(IndexError, match=f"^{name} must lie in \\[0, {count}\\)"):
            fresh.plan(epoch, row) if sampler is rows else fresh.batch(epoch, row)  # a fresh object: no start known
        sampler.set_epoch(epoch)
        assert [list(item) for item in sampler] == [lookup(epoch, at) for at in range(count)]
