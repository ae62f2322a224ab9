"""``PackedRows``: coverage over ranks, equal steps, exact and elastic resume, the state, bad input."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, PackedDataset, PackedRows

lengths_lists = st.lists(st.integers(1, 30), min_size=1, max_size=80)


def _ranks(lengths, seq_len, world_size, **kwargs):
    return [PackedRows(lengths, seq_len, num_replicas=world_size, rank=r, **kwargs) for r in range(world_size)]


def _tokens(plans, lengths):
    covered = [np.zeros(length, dtype=int) for length in lengths]
    for plan in plans:
        if not plan.is_padding:
            for record, start, stop in plan:
                covered[record][start:stop] += 1
    return covered


@settings(max_examples=60, deadline=None)
@given(lengths_lists, st.integers(30, 60), st.integers(1, 4), st.booleans(), st.integers(1, 40), st.integers(0, 2))
def test_every_token_once_per_epoch_over_ranks_in_equal_steps(lengths, seq_len, world_size, split, window, epoch):
    ranks = _ranks(lengths, seq_len, world_size, split_records=split, window=window, seed=7)
    shares, announced = [], []
    for sampler in ranks:
        sampler.set_epoch(epoch)
        announced.append(len(sampler))
        shares.append(list(sampler))
    assert len({len(share) for share in shares}) == 1  # equal steps
    assert announced == [len(share) for share in shares]
    # a pass that ended says the next epoch's length, as a sampler restored from its state does
    following = _ranks(lengths, seq_len, world_size, split_records=split, window=window, seed=7)
    for sampler in following:
        sampler.set_epoch(epoch + 1)
    assert [len(sampler) for sampler in ranks] == [len(sampler) for sampler in following]
    plans = [plan for share in shares for plan in share]
    assert all((tokens == 1).all() for tokens in _tokens(plans, lengths))
    assert all(sum(stop - start for _, start, stop in plan) <= seq_len for plan in plans)
    assert sum(not plan.is_padding for plan in plans) == ranks[0].rows_in_epoch(epoch)
    if not split:
        assert all(stop == lengths[record] and start == 0 for plan in plans for record, start, stop in plan)


def _consume(sampler, steps, batch_size):
    """Draw ``steps`` batches of the current pass; return them and the state after them."""
    plans = list(islice(iter(sampler), steps * batch_size))
    return plans, json.loads(json.dumps(sampler.state_dict(consumed_batches=steps)))


@settings(max_examples=60, deadline=None)
@given(
    lengths_lists,
    st.booleans(),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 20),
    st.data(),
)
def test_a_resume_on_other_ranks_takes_each_remaining_row_once(lengths, split, w1, w2, b1, b2, window, data):
    seq_len = 32
    kwargs = {"split_records": split, "window": window, "seed": 3}
    before = _ranks(lengths, seq_len, w1, batch_size=b1, **kwargs)
    steps = data.draw(st.integers(0, -(-len(before[0]) // b1)))
    consumed, states = [], []
    for sampler in before:
        plans, state = _consume(sampler, steps, b1)
        consumed += plans
        states.append(state)
    assert all(state == states[0] for state in states)  # one global position
    after = _ranks(lengths, seq_len, w2, batch_size=b2, **kwargs)  # fresh objects: no window start learnt
    shares = []
    for sampler in after:
        sampler.load_state_dict(states[0])
        shares.append(list(sampler))
    assert len({len(share) for share in shares}) == 1
    rows = [plan.key.index for plan in consumed + [p for share in shares for p in share] if not plan.is_padding]
    assert sorted(rows) == list(range(after[0].rows_in_epoch(0)))
    everything = consumed + [plan for share in shares for plan in share]
    assert all((tokens == 1).all() for tokens in _tokens(everything, lengths))
    reference = PackedRows(lengths, seq_len, **kwargs)
    assert all(list(plan) == reference.plan(plan.key.epoch, plan.key.index) for plan in everything)


@settings(max_examples=40, deadline=None)
@given(lengths_lists, st.booleans(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 10), st.data())
def test_a_resume_on_the_same_ranks_yields_exactly_the_uninterrupted_plans(
    lengths, split, world_size, batch, window, data
):
    kwargs = {"split_records": split, "window": window, "seed": 11, "batch_size": batch}
    for rank in range(world_size):
        uninterrupted = PackedRows(lengths, 32, num_replicas=world_size, rank=rank, **kwargs)
        whole = list(uninterrupted)
        live = PackedRows(lengths, 32, num_replicas=world_size, rank=rank, **kwargs)
        steps = data.draw(st.integers(0, -(-len(whole) // batch)))
        first, state = _consume(live, steps, batch)
        twin = PackedRows(lengths, 32, num_replicas=world_size, rank=rank, **kwargs)
        twin.load_state_dict(state)
        rest = list(twin)
        assert [(list(p), p.key) for p in first + rest] == [(list(p), p.key) for p in whole]
        assert [list(p) for p in twin] == [list(p) for p in uninterrupted]  # both moved on to the next epoch


def test_the_state_is_a_few_hundred_bytes_and_covers_the_lengths():
    lengths = np.random.default_rng(0).integers(1, 500, 10_000)
    sampler = PackedRows(lengths, 512, split_records=False, batch_size=8)
    _, state = _consume(sampler, 5, 8)
    assert len(json.dumps(state)) < 600
    other = lengths.copy()
    other[17] += 1
    with pytest.raises(IncompatibleStateError, match="packing.settings.lengths"):
        PackedRows(other, 512, split_records=False, batch_size=8).load_state_dict(state)
    with pytest.raises(IncompatibleStateError, match="seed"):
        PackedRows(lengths, 512, split_records=False, batch_size=8, seed=1).load_state_dict(state)


def test_an_altered_anchor_is_refused_and_the_sampler_keeps_its_position():
    lengths = np.random.default_rng(1).integers(1, 100, 3000)
    sampler = PackedRows(lengths, 128, window=256, batch_size=4)
    _, state = _consume(sampler, 50, 4)
    resumed = PackedRows(lengths, 128, window=256, batch_size=4)
    anchor = state["packing"]
    for field, value in (("start", anchor["start"] + 1), ("window", anchor["window"] + 1), ("rows", 5), ("pass", 1)):
        altered = json.loads(json.dumps(state))
        altered["packing"][field] = value
        with pytest.raises(IncompatibleStateError, match="packing"):
            resumed.load_state_dict(altered)
    missing = {key: value for key, value in state.items() if key != "packing"}
    with pytest.raises(IncompatibleStateError, match="packing"):
        resumed.load_state_dict(missing)
    assert resumed.state_dict()["position"] == 0


def test_carry_rolls_split_rows_into_the_next_epoch_and_whole_rows_refuse_it():
    lengths = list(range(1, 40))
    sampler = PackedRows(lengths, 16, tail="carry", batch_size=3, num_replicas=2, rank=0)
    assert len(list(sampler)) % 3 == 0
    with pytest.raises(ValueError, match="carry"):
        PackedRows(lengths, 64, split_records=False, tail="carry", batch_size=3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: PackedRows([3, 0, 2], 8), "lengths must be at least 1 token each, got 0 for record 1"),
        (lambda: PackedRows([3, -4, 2], 8), "got -4 for record 1"),
        (lambda: PackedRows([], 8), "at least one record"),
        (lambda: PackedRows([[1, 2]], 8), "1-D"),
        (lambda: PackedRows([1.5], 8), "integer token counts"),
        (lambda: PackedRows([3, 2], 0), "seq_len must be at least 1 and at most 4611686018427387903, got 0"),
        (lambda: PackedRows([3, 2], 8, window=0), "window must be at least 1"),
        (
            lambda: PackedRows([3, 20, 2, 30], 8, split_records=False),
            "record 3 has 30 tokens, more than seq_len=8 \\(2 records",
        ),
        (lambda: PackedRows([3, 2], 8, truncate=True), "truncate=True applies to split_records=False only"),
        (lambda: PackedRows([3, 2], 8, seed=-1), "seed must be at least 0"),
    ],
)
def test_bad_input_is_refused_naming_the_field(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_truncate_keeps_the_first_seq_len_tokens_of_a_longer_record():
    sampler = PackedRows([3, 20, 2], 8, split_records=False, truncate=True)
    plans = [list(plan) for plan in sampler]
    assert sorted(slice_ for plan in plans for slice_ in plan) == [(0, 0, 3), (1, 0, 8), (2, 0, 2)]


def test_packed_dataset_refuses_a_dataset_of_another_size_and_lengths_that_are_not_its_own():
    rows = PackedRows([3, 2, 4], seq_len=4)
    with pytest.raises(ValueError, match="lengths must have one entry per record of the dataset: the dataset has 2"):
        PackedDataset([[1, 2, 3], [4, 5]], rows)
    packed = PackedDataset([[1, 2, 3], [4, 5], [6, 7, 8]], rows)
    with pytest.raises(ValueError, match="lengths\\[2\\] is 4 but record 2 of the dataset has 3 tokens"):
        [packed[plan] for plan in rows]
    with pytest.raises(TypeError, match="expects a RowPlan"):
        packed[0]


def test_packed_rows_give_restarting_positions_masked_labels_and_cu_seqlens():
    documents = [list(range(10 * i + 1, 10 * i + 1 + n)) for i, n in enumerate([3, 2, 4, 5])]
    rows = PackedRows([len(d) for d in documents], seq_len=6, seed=2, num_replicas=3, rank=2)
    packed = PackedDataset(documents, rows)
    plans = list(rows)
    items = [packed[plan] for plan in plans]
    batch = packed.collate(items)
    assert batch["input_ids"].shape == (len(items), 6)
    for at, plan in enumerate(plans):
        expected = [t for record, start, stop in plan for t in documents[record][start:stop]]
        assert batch["input_ids"][at, : len(expected)].tolist() == expected
        positions = [p for _, start, stop in plan for p in range(stop - start)]
        assert batch["position_ids"][at, : len(positions)].tolist() == positions
        firsts = np.cumsum([0] + [stop - start for _, start, stop in plan])[:-1]
        labels = batch["labels"][at].tolist()
        assert all(labels[f] == -100 for f in firsts)
        assert all(labels[i] == -100 for i in range(len(expected), 6))
        if plan.is_padding:
            assert set(labels) == {-100}
    assert batch["cu_seqlens"][-1] == 6 * len(items) and batch["cu_seqlens"].dtype.is_signed
    masked = PackedDataset(documents, rows, attention="mask").collate(items)
    assert masked["attention_mask"].shape == (len(items), 6, 6)


def test_the_packing_audit_reports_each_epoch_s_efficiency_from_the_sampler_s_rows():
    from stateful_sampler import TokenBudgetBatches
    from stateful_sampler.audit import audit, audit_packing

    lengths = np.random.default_rng(4).integers(1, 60, 3000)
    ranks = _ranks(lengths, 64, 3, split_records=False, window=500)
    report = audit_packing(ranks[0], epochs=2)
    for epoch in report:
        plans = [plan for sampler in _ranks(lengths, 64, 3, split_records=False, window=500)
                 for plan in (sampler.set_epoch(epoch.epoch) or list(sampler))]  # fmt: skip
        real = sum(stop - start for plan in plans if not plan.is_padding for _, start, stop in plan)
        assert epoch.tokens == real == lengths.sum()
        assert epoch.rows + epoch.padding_rows == len(plans) and len(set(epoch.steps)) == 1
        assert epoch.efficiency == real / (64 * len(plans)) and epoch.fill > 0.98
        assert "packing efficiency" in epoch.summary()
    split = audit_packing(PackedRows(lengths, 64), epochs=1)[0]
    assert split.tokens == lengths.sum() and split.rows == -(-lengths.sum() // 64)
    padded = audit_packing(TokenBudgetBatches(lengths, 512, num_replicas=2, rank=0))[0]
    assert padded.cost >= padded.tokens and "padding within batches" in padded.summary()
    with pytest.raises(TypeError, match="use stateful_sampler.audit.audit_packing"):
        audit(ranks[0])


def test_a_resume_into_a_later_epoch_never_walks_the_windows_of_the_epoch_the_sampler_was_in():
    lengths = np.random.default_rng(5).integers(1, 60, 2000)
    saving = PackedRows(lengths, 64, split_records=False, window=100, batch_size=4)
    saving.set_epoch(2)
    _, state = _consume(saving, 10, 4)
    resumed = PackedRows(lengths, 64, split_records=False, window=100, batch_size=4)  # a fresh process
    resumed.load_state_dict(state)
    assert resumed.strategy.rows(0).starts.known_total() is None  # epoch 0 was never packed
    assert resumed.epoch == 2 and next(iter(resumed)).key.index == 40
    refused = PackedRows(lengths, 64, split_records=False, window=100, batch_size=4)
    bad = json.loads(json.dumps(state))
    bad["position"] = 10**9
    with pytest.raises(IncompatibleStateError, match="position"):
        refused.load_state_dict(bad)
    assert refused.epoch == 0  # a refused state leaves the sampler where it was


def _whole(epoch):
    return epoch.epoch, epoch.rows, epoch.padding_rows, epoch.tokens, epoch.cost, epoch.capacity, epoch.steps


def _fed(plans, lengths, capacity, padded=False):
    """(rows, padding rows, real tokens, cost) of the plans or batches actually fed, counted from them."""
    real = [plan for plan in plans if not plan.is_padding]
    if isinstance(real[0][0], tuple):
        tokens = sum(stop - start for plan in real for _, start, stop in plan)
        return len(real), len(plans) - len(real), tokens, tokens
    tokens = sum(int(lengths[r]) for batch in real for r in batch)
    cost = sum(max(int(lengths[r]) for r in b) * len(b) if padded else sum(int(lengths[r]) for r in b) for b in real)
    return len(real), len(plans) - len(real), tokens, cost


@pytest.mark.parametrize(
    ("make", "tail"),
    [
        (lambda lengths, **kw: PackedRows(lengths, 64, window=40, **kw), "pad"),
        (lambda lengths, **kw: PackedRows(lengths, 64, split_records=False, window=40, **kw), "pad"),
        (lambda lengths, **kw: PackedRows(lengths, 64, window=40, **kw), "carry"),
        (lambda lengths, **kw: PackedRows(lengths, 64, split_records=False, window=40, **kw), "drop"),
    ],
    ids=["split", "whole", "split-carry", "whole-drop"],
)
def test_the_packing_audit_of_a_partly_drawn_or_resumed_sampler_answers_for_the_whole_epoch(make, tail):
    from stateful_sampler.audit import audit_packing

    lengths = np.random.default_rng(6).integers(1, 60, 301)
    kwargs = {"tail": tail, "batch_size": 2, "seed": 3}
    fresh = audit_packing(make(lengths, num_replicas=2, rank=0, **kwargs), epochs=3)
    live = [make(lengths, num_replicas=2, rank=r, **kwargs) for r in range(2)]
    drawn = [plan for sampler in live for plan in islice(iter(sampler), 14)]  # 7 batches of 2 on each of 2 ranks
    partly = audit_packing(live[0], epochs=3)  # partly drawn: the same whole epochs (the numbers were the rest's)
    assert [_whole(epoch) for epoch in partly] == [_whole(epoch) for epoch in fresh]
    assert (partly[0].segment_start, partly[0].remaining_steps) == (28, (fresh[0].steps[0] - 14,) * 2)
    state = json.loads(json.dumps(live[0].state_dict()))
    resumed = [make(lengths, num_replicas=3, rank=r, **kwargs) for r in range(3)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    audited = audit_packing(resumed[0], epochs=2)
    rest = [plan for sampler in resumed for plan in sampler]  # what the resumed ranks feed of epoch 0
    epoch = audited[0]
    assert (epoch.rows, epoch.padding_rows, epoch.tokens, epoch.cost) == _fed(drawn + rest, lengths, 64)
    assert epoch.rows + epoch.padding_rows == sum(epoch.steps) == len(drawn) + len(rest)
    assert (epoch.segment_start, epoch.remaining_steps) == (28, tuple(len(rest) // 3 for _ in range(3)))
    assert "steps per rank equal" in epoch.summary() and "UNEQUAL" not in epoch.summary()
    later = [plan for sampler in resumed for plan in sampler]  # epoch 1 on the resumed ranks, from its start
    assert (audited[1].rows, audited[1].padding_rows, audited[1].tokens) == _fed(later, lengths, 64)[:3]


def test_the_token_budget_audit_of_a_partly_drawn_sampler_answers_for_the_whole_epoch():
    from stateful_sampler import TokenBudgetBatches
    from stateful_sampler.audit import audit_packing

    lengths = np.random.default_rng(7).integers(1, 200, 500)
    ranks = [TokenBudgetBatches(lengths, 600, num_replicas=2, rank=r, seed=1) for r in range(2)]
    fresh = audit_packing(TokenBudgetBatches(lengths, 600, num_replicas=2, rank=0, seed=1))[0]
    drawn = [batch for sampler in ranks for batch in islice(iter(sampler), 5)]
    assert _whole(audit_packing(ranks[0])[0]) == _whole(fresh)
    rest = [batch for sampler in ranks for batch in sampler]
    assert (fresh.rows, fresh.padding_rows, fresh.tokens, fresh.cost) == _fed(drawn + rest, lengths, 600, padded=True)
