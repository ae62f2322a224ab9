"""``TokenBudgetBatches``: whole records under a budget, equal steps, exact resume on other ranks, bad input."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import KeyedDataset, ResumableLoader, SampleKey, TokenBudgetBatches

lengths_lists = st.lists(st.integers(1, 30), min_size=1, max_size=80)


def _cost(lengths, batch, padded):
    chosen = np.array(lengths)[list(batch)]
    return int(chosen.max()) * len(chosen) if padded else int(chosen.sum())


@settings(max_examples=60, deadline=None)
@given(lengths_lists, st.integers(30, 90), st.booleans(), st.integers(1, 4), st.integers(1, 30), st.integers(0, 2))
def test_every_record_once_within_budget_and_one_batch_per_rank_per_step(
    lengths, budget, padded, world_size, window, epoch
):
    ranks = [TokenBudgetBatches(lengths, budget, padded=padded, window=window, num_replicas=world_size, rank=r)
             for r in range(world_size)]  # fmt: skip
    shares, announced = [], []
    for sampler in ranks:
        sampler.set_epoch(epoch)
        announced.append(len(sampler))
        shares.append(list(sampler))
    assert len({len(share) for share in shares}) == 1
    assert [len(share) for share in shares] == announced
    # a pass that ended says the next epoch's length, as a sampler restored from its state does
    following = [TokenBudgetBatches(lengths, budget, padded=padded, window=window, num_replicas=world_size, rank=r)
                 for r in range(world_size)]  # fmt: skip
    for sampler in following:
        sampler.set_epoch(epoch + 1)
    assert [len(sampler) for sampler in ranks] == [len(sampler) for sampler in following]
    batches = [batch for share in shares for batch in share]
    assert all(_cost(lengths, batch, padded) <= budget for batch in batches)
    assert sorted(r for batch in batches if not batch.is_padding for r in batch) == list(range(len(lengths)))
    padding = [batch for batch in batches if batch.is_padding]
    assert len(padding) < world_size  # only the last step is evened out
    assert all(list(batch) == ranks[0].batch(epoch, batch.key.index) for batch in batches)


@settings(max_examples=50, deadline=None)
@given(lengths_lists, st.booleans(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 20), st.data())
def test_a_resume_on_other_ranks_takes_each_remaining_batch_once(lengths, padded, w1, w2, window, data):
    kwargs = {"padded": padded, "window": window, "seed": 5}
    before = [TokenBudgetBatches(lengths, 40, num_replicas=w1, rank=r, **kwargs) for r in range(w1)]
    steps = data.draw(st.integers(0, len(before[0])))
    taken, states = [], []
    for sampler in before:
        taken += list(islice(iter(sampler), steps))
        states.append(json.loads(json.dumps(sampler.state_dict(consumed_batches=steps))))
    assert all(state == states[0] for state in states)
    after = [TokenBudgetBatches(lengths, 40, num_replicas=w2, rank=r, **kwargs) for r in range(w2)]
    for sampler in after:
        sampler.load_state_dict(states[0])
        taken += list(sampler)
    assert sorted(r for batch in taken if not batch.is_padding for r in batch) == list(range(len(lengths)))


def test_resumable_loader_resumes_the_exact_batches():
    lengths = np.random.default_rng(0).integers(1, 200, 2000)
    data = [torch.full((int(n),), i) for i, n in enumerate(lengths)]

    def loader():
        return ResumableLoader(DataLoader(data, batch_sampler=TokenBudgetBatches(lengths, 1024, seed=2),
                                          collate_fn=lambda items: [int(item[0]) for item in items]))  # fmt: skip

    whole = list(loader())
    first = loader()
    iterator = iter(first)
    head = [next(iterator) for _ in range(7)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole


def test_yield_keys_marks_the_padding_batch_for_keyed_datasets():
    sampler = TokenBudgetBatches([5, 5, 5], 5, num_replicas=2, rank=1, yield_keys=True)
    batches = list(sampler)
    assert all(isinstance(key, SampleKey) for batch in batches for key in batch)
    assert [batch.is_padding for batch in batches] == [False, True]
    loaded = next(iter(DataLoader(KeyedDataset(["a", "b", "c"]), batch_sampler=sampler)))
    assert len(loaded) == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: TokenBudgetBatches([3, 0], 8), "got 0 for record 1"),
        (lambda: TokenBudgetBatches([3, -1], 8), "got -1 for record 1"),
        (lambda: TokenBudgetBatches([3, 4], 2), "record 1 has 4 tokens, more than max_tokens=2 \\(2 records"),
        (lambda: TokenBudgetBatches([3, 4], 0), "max_tokens must be at least 1 and at most 4611686018427387903, got 0"),
        (lambda: TokenBudgetBatches([3, 4], 8, padded="yes"), "padded must be a bool"),
        (lambda: TokenBudgetBatches([3, 4], 8, tail="nope"), "tail must be one of"),
    ],
)
def test_bad_input_is_refused_naming_the_field(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.slow
def test_two_workers_resume_the_exact_batches_through_resumable_loader():
    lengths = np.random.default_rng(1).integers(1, 100, 1500)
    data = [torch.full((int(n),), i) for i, n in enumerate(lengths)]

    def loader():
        batches = TokenBudgetBatches(lengths, 800, padded=False, seed=4, num_replicas=2, rank=1)
        return ResumableLoader(DataLoader(data, batch_sampler=batches, num_workers=2, collate_fn=_first_tokens))

    whole = list(loader())
    first = loader()
    iterator = iter(first)
    head = [next(iterator) for _ in range(9)]  # the workers have prefetched beyond these
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole


def _first_tokens(items):
    return [int(item[0]) for item in items]
