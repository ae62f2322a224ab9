"""``PackedRows``/``TokenBudgetBatches(strategy=...)``: rows of a strategy's draws (a record drawn twice is packed
twice), exact and elastic resume, the twin property, ``ResumableLoader`` with real workers, and the refusals."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import (
    Curriculum,
    IncompatibleStateError,
    Mixture,
    PackedRows,
    ResumableLoader,
    Stratified,
    TokenBudgetBatches,
    Uniform,
    Weighted,
)
from stateful_sampler.order import Grouped

STRATEGIES = {
    "weighted": lambda n: Weighted(np.arange(1, n + 1), num_samples=n + 5),
    "mixture": lambda n: Mixture([2, n - 2], [3, 1], num_samples=n + 3, schedule={1: [1, 1]}),
    # weights changed mid-epoch, inside a window (a schedule key (epoch, position)), and again at epoch 1
    "mixture-mid-epoch": lambda n: Mixture(
        [2, n - 2], [3, 1], num_samples=n + 3, schedule={(0, n // 2 + 1): [1, 4], (1, 3): [2, 1]}
    ),
    "curriculum": lambda n: Curriculum(np.arange(n) % 3, schedule=[1, 2, 3]),
    "stratified": lambda n: Stratified(np.arange(n) % 2),
    "in-order": lambda n: Uniform(shuffle=False),
}
lengths_lists = st.lists(st.integers(1, 30), min_size=6, max_size=60)
SEED = 5


def _draws(strategy, size, epoch):
    """The strategy's epoch, read through its own protocol: what a StatefulSampler with it reads."""
    return strategy.pass_order(size, SEED, epoch)(np.arange(strategy.pass_length(size, epoch), dtype=np.int64))


def _make(kind, lengths, name, **kwargs):
    strategy = STRATEGIES[name](len(lengths))
    if kind == "budget":
        kwargs.pop("batch_size", None)  # one item is one batch
        return TokenBudgetBatches(lengths, 40, strategy=strategy, seed=SEED, **kwargs)
    return PackedRows(lengths, 16, split_records=kind == "split", strategy=strategy, seed=SEED, **kwargs)


def _flat(item):
    return [tuple(piece) if isinstance(piece, tuple) else int(piece) for piece in item], item.key


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@settings(max_examples=25, deadline=None)
@given(lengths=lengths_lists, window=st.integers(1, 12), epoch=st.integers(0, 2))
def test_rows_hold_exactly_the_strategys_draws(name, lengths, window, epoch):
    draws = _draws(STRATEGIES[name](len(lengths)), len(lengths), epoch).tolist()
    split = _make("split", lengths, name, window=window)
    split.set_epoch(epoch)
    pieces = [piece for plan in split for piece in plan]
    # every token of every draw once, in the draw order: the pieces tile the records drawn one after the other
    tiled = []
    for record, start, stop in pieces:
        if tiled and tiled[-1][0] == record and tiled[-1][2] == start and start != 0:
            tiled[-1] = (record, tiled[-1][1], stop)
        else:
            tiled.append((record, start, stop))
    assert tiled == [(record, 0, lengths[record]) for record in draws]
    assert split.rows_in_epoch(epoch) == -(-sum(lengths[r] for r in draws) // 16)
    for kind in ("whole", "budget"):
        sampler = _make(kind, [min(n, 16) for n in lengths], name, window=window)
        sampler.set_epoch(epoch)
        records = [piece[0] if kind == "whole" else piece for item in sampler for piece in item]
        assert Counter(records) == Counter(draws)  # a record drawn twice is packed twice


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
@settings(max_examples=15, deadline=None)
@given(lengths=lengths_lists, window=st.integers(1, 12), data=st.data())
def test_twin_a_restored_sampler_yields_what_the_live_one_does(kind, name, lengths, window, data):
    """The twin property: restored from ``state_dict()`` at any step, the sampler yields what the live one
    yields from there on, over this epoch and the next."""
    lengths = [min(n, 16) for n in lengths]
    live = _make(kind, lengths, name, window=window, batch_size=2 if kind != "budget" else None)
    batch = 1 if kind == "budget" else 2
    steps = data.draw(st.integers(0, -(-len(live) // batch)))
    list(islice(iter(live), steps * batch))
    state = json.loads(json.dumps(live.state_dict(consumed_batches=steps)))
    fresh = _make(kind, lengths, name, window=window, batch_size=2 if kind != "budget" else None)
    fresh.load_state_dict(state)
    rest = [_flat(item) for item in fresh]
    uninterrupted = [_flat(item) for item in _make(kind, lengths, name, window=window)]
    assert rest == uninterrupted[steps * batch :]
    for sampler in (live, fresh):
        sampler.set_epoch(1)
    assert [_flat(item) for item in fresh] == [_flat(item) for item in live]
    assert fresh.state_dict() == live.state_dict()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
def test_at_four_then_three_ranks_every_unconsumed_token_once_in_equal_steps(kind, name):
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 17, 40)]
    batch = 1 if kind == "budget" else 2
    bs = None if kind == "budget" else batch
    before = [_make(kind, lengths, name, window=7, num_replicas=4, rank=r, batch_size=bs) for r in range(4)]
    consumed, states = [], []
    for sampler in before:
        consumed += list(islice(iter(sampler), batch))
        states.append(json.loads(json.dumps(sampler.state_dict(consumed_batches=1))))
    assert all(state == states[0] for state in states)
    after = [_make(kind, lengths, name, window=7, num_replicas=3, rank=r, batch_size=bs) for r in range(3)]
    shares = []
    for sampler in after:
        sampler.load_state_dict(states[0])
        shares.append(list(sampler))
    assert len({len(share) for share in shares}) == 1  # equal steps
    everything = [item for item in consumed + [i for share in shares for i in share] if not item.is_padding]
    assert sorted(item.key.index for item in everything) == list(range(after[0].rows_in_epoch(0)))
    draws = _draws(STRATEGIES[name](len(lengths)), len(lengths), 0).tolist()
    if kind == "split":
        tokens = Counter((record, t) for item in everything for record, a, b in item for t in range(a, b))
        wanted = Counter((record, t) for record in draws for t in range(lengths[record]))
        assert tokens == wanted
    else:
        records = [piece[0] if kind == "whole" else piece for item in everything for piece in item]
        assert Counter(records) == Counter(draws)


class Echo:
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item: Any) -> Any:
        return (list(item), item.key.index, item.key.is_padding) if isinstance(item, list) else item


def _collate(items):
    return items


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["split", "budget"])
def test_a_resume_through_resumable_loader_with_real_workers_is_exact(kind, workers):
    lengths = [int(n) for n in np.random.default_rng(2).integers(1, 17, 60)]

    def loader():
        strategy = Mixture([20, 40], [1, 3], num_samples=70, schedule={1: [1, 1]})
        if kind == "budget":
            batches = TokenBudgetBatches(lengths, 40, strategy=strategy, seed=SEED)
            inner = DataLoader(Echo(60), batch_sampler=batches, collate_fn=_collate, num_workers=workers)
        else:
            rows = PackedRows(lengths, 16, strategy=strategy, seed=SEED, batch_size=2)
            inner = DataLoader(Echo(60), sampler=rows, batch_size=2, collate_fn=_collate, num_workers=workers)
        return ResumableLoader(inner)

    uninterrupted = list(loader())
    live = loader()
    first = list(islice(iter(live), 5))
    state = json.loads(json.dumps(live.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert first + list(resumed) == uninterrupted


def test_a_changed_strategy_on_resume_is_refused_naming_the_setting():
    lengths = list(range(1, 21))
    saved = PackedRows(lengths, 16, strategy=Weighted(np.arange(1, 21)), batch_size=1)
    list(islice(iter(saved), 3))
    state = saved.state_dict(consumed_batches=3)
    with pytest.raises(IncompatibleStateError, match=r"packing\.settings\.strategy_fingerprint"):
        PackedRows(lengths, 16, strategy=Weighted(np.arange(20, 0, -1)), batch_size=1).load_state_dict(state)
    with pytest.raises(IncompatibleStateError, match=r"packing\.settings\.strategy.*'weighted'.*'uniform'"):
        PackedRows(lengths, 16, batch_size=1).load_state_dict(state)
    uniform = PackedRows(lengths, 16, batch_size=1)
    list(islice(iter(uniform), 3))
    with pytest.raises(IncompatibleStateError, match=r"packing\.settings\.strategy.*'uniform'.*'stratified'"):
        PackedRows(lengths, 16, strategy=Stratified(np.arange(20) % 2), batch_size=1).load_state_dict(
            uniform.state_dict(consumed_batches=3)
        )


def test_the_default_and_uniform_are_todays_rows_and_state():
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 40, 50)]
    default, uniform = PackedRows(lengths, 32, seed=2), PackedRows(lengths, 32, seed=2, strategy=Uniform())
    assert [list(p) for p in default] == [list(p) for p in uniform]
    assert "strategy" not in default.state_dict()["packing"]["settings"]
    assert default.state_dict() == uniform.state_dict()


def test_bad_strategies_are_refused_naming_the_argument():
    with pytest.raises(TypeError, match="strategy must be a Strategy"):
        PackedRows([3, 4], 8, strategy="weighted")
    with pytest.raises(TypeError, match="strategy=Grouped"):
        TokenBudgetBatches([3, 4], 8, strategy=Grouped([0, 1]))
    with pytest.raises(ValueError, match=r"does not order the 3 records of lengths: weights .* length 3, got 2"):
        PackedRows([3, 4, 5], 8, strategy=Weighted([1, 2]))
    with pytest.raises(ValueError, match="does not order the 2 records of lengths: sizes must add up"):
        TokenBudgetBatches([3, 4], 8, strategy=Mixture([2, 2], [1, 1], num_samples=4))
    with pytest.raises(ValueError, match="tail='carry' needs passes of one length"):
        PackedRows([3, 4], 8, strategy=Weighted([1, 2]), tail="carry", batch_size=1)
