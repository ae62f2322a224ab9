"""``Mixture(schedule=)`` keys at a position inside an epoch, ``(e, position)``: the bound restarts there, every
source walks on through its own permutation, and a resume (same or another world size) is exact."""

from __future__ import annotations

import re
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import StatefulSampler
from stateful_sampler.order.mixture import Mixture
from tests.helpers import json_round_trip
from tests.strategy_resume_checks import elastic_resume


@st.composite
def mixtures(draw: st.DrawFn) -> Mixture:
    sources = draw(st.integers(2, 4))
    sizes = draw(st.lists(st.integers(1, 9), min_size=sources, max_size=sources))
    weights = lambda: draw(st.lists(st.integers(0, 5), min_size=sources, max_size=sources).filter(any))
    num_samples = draw(st.integers(3, 17))
    starts = draw(st.sets(st.integers(1, 3 * num_samples - 1), max_size=3))
    schedule = {divmod(start, num_samples): weights() for start in starts}
    return Mixture(sizes, weights(), num_samples=num_samples, schedule=schedule)


def stream(mixture: Mixture, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, record) at every stream position of the first ``epochs`` epochs."""
    positions = np.arange(mixture.num_samples)
    sources = np.concatenate([mixture.locate(e, positions)[0] for e in range(epochs)])
    records = np.concatenate([mixture.pass_order(sum(mixture.sizes), 5, e)(positions) for e in range(epochs)])
    return sources, records


@settings(max_examples=60, deadline=None)
@given(mixtures())
def test_within_each_segment_every_count_stays_within_1_of_its_share(mixture: Mixture) -> None:
    sources, _ = stream(mixture, 3)
    starts = [e * mixture.num_samples + p for e, p in mixture.segment_starts()] + [len(sources)]
    for first, end in pairwise(starts):
        if first >= end:
            continue
        weights = mixture.weights_at(*divmod(first, mixture.num_samples))
        onehot = np.eye(len(mixture.sizes), dtype=np.int64)[sources[first:end]]
        target = np.outer(np.arange(1, end - first + 1), weights)
        assert np.abs(np.cumsum(onehot, axis=0) - target).max() < 1  # floor <= count <= ceil: strictly < 1


@settings(max_examples=60, deadline=None)
@given(mixtures())
def test_no_record_of_a_source_repeats_before_its_permutation_is_used_up(mixture: Mixture) -> None:
    sources, records = stream(mixture, 3)
    for d, size in enumerate(mixture.sizes.tolist()):
        mine = records[sources == d] - mixture.offsets[d]
        for start in range(0, len(mine), size):
            chunk = mine[start : start + size].tolist()
            assert len(set(chunk)) == len(chunk) and set(chunk) <= set(range(size))
    assert (mixture.draws_before(3) == np.bincount(sources, minlength=len(mixture.sizes))).all()


@settings(max_examples=25, deadline=None)
@given(mixtures(), st.integers(1, 3), st.data())
def test_a_state_saved_at_any_step_restores_a_twin_that_yields_exactly_the_rest(
    mixture: Mixture, batch_size: int, data: st.DataObject
) -> None:
    size = sum(mixture.sizes.tolist())
    make = lambda: StatefulSampler(size, strategy=mixture, batch_size=batch_size, seed=3)
    epoch = data.draw(st.integers(0, 2))
    whole = make()
    whole.set_epoch(epoch)
    expected = list(whole)
    steps = data.draw(st.integers(0, -(-len(expected) // batch_size)))
    saving = make()
    saving.set_epoch(epoch)
    head = list(saving)[: steps * batch_size]
    restored = make()
    restored.load_state_dict(json_round_trip(saving.state_dict(consumed_batches=steps)))
    assert head + list(restored) == expected
    restored.set_epoch(epoch + 1)
    whole.set_epoch(epoch + 1)
    assert list(restored) == list(whole)  # and every later epoch


@pytest.mark.parametrize(("worlds", "tail"), [((4, 3), "pad"), ((3, 4), "drop"), ((2, 3), "uneven")])
def test_a_resume_at_another_world_size_gives_every_unconsumed_draw_once(worlds: tuple[int, int], tail: str) -> None:
    strategy = lambda: Mixture([5, 8, 13], [3, 1, 1], num_samples=48, schedule={(0, 7): [1, 1, 4], (1, 30): [0, 2, 1]})
    for epoch, steps in ((0, 1), (0, 3), (1, 2), (1, 4)):
        elastic_resume(strategy, 26, worlds, batch_size=2, steps=steps, tail=tail, epoch=epoch)


def test_an_epoch_key_and_its_pair_give_one_mixture() -> None:
    by_epoch = Mixture([4, 7], [2, 1], num_samples=9, schedule={1: [1, 3], 3: [1, 1]})
    by_pair = Mixture([4, 7], [2, 1], num_samples=9, schedule={(1, 0): [1, 3], (3, 0): [1, 1]})
    orders = lambda m: [m.pass_order(11, 2, e)(np.arange(9)).tolist() for e in range(5)]
    assert orders(by_epoch) == orders(by_pair)
    assert by_epoch.fingerprint() == by_pair.fingerprint()
    moved = Mixture([4, 7], [2, 1], num_samples=9, schedule={(1, 1): [1, 3], (3, 0): [1, 1]})
    assert moved.fingerprint() != by_pair.fingerprint()
    assert (
        orders(moved)[0] == orders(by_pair)[0]
        and orders(moved)[1][:1] == orders(Mixture([4, 7], [2, 1], num_samples=9))[1][:1]
    )


def test_a_change_inside_an_epoch_keeps_the_epoch_before_it_and_the_draws_carry_on() -> None:
    plain = Mixture([6, 9], [1, 2], num_samples=12)
    changed = Mixture([6, 9], [1, 2], num_samples=12, schedule={(1, 5): [1, 0]})
    order = lambda m, e: m.pass_order(15, 4, e)(np.arange(12)).tolist()
    assert order(changed, 0) == order(plain, 0) and order(changed, 1)[:5] == order(plain, 1)[:5]
    sources, _ = changed.locate(1, np.arange(12))
    assert sources[5:].tolist() == [0] * 7
    assert changed.draws_before(1, 5).tolist() == plain.draws_before(1, 5).tolist() == [6, 11]
    assert changed.segment_starts() == [(0, 0), (1, 5)]
    assert changed.weights_at(1, 4).tolist() == [1 / 3, 2 / 3] and changed.weights_at(1, 5).tolist() == [1, 0]
    with pytest.raises(ValueError, match=re.escape("epoch 1 of this mixture has no single epoch-aligned segment")):
        changed.segment_start(1)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({(1, 12): [1, 1]}, "position < num_samples = 12, not (0, 0), got (1, 12)"),
        ({(0, 0): [1, 1]}, "got (0, 0)"),
        ({(-1, 3): [1, 1]}, "got (-1, 3)"),
        ({(1, 2, 3): [1, 1]}, "got (1, 2, 3)"),
        ({(1, 2.0): [1, 1]}, "got (1, 2.0)"),
        ({(True, 2): [1, 1]}, "got (True, 2)"),
        ({1: [1, 1], (1, 0): [1, 2]}, "schedule keys must be distinct stream positions, got 1 and (1, 0)"),
        ({(2, 0): [1, 1], 2: [1, 2]}, "got (2, 0) and 2 (both stream position 24)"),
        ({(1, 3): [1]}, "schedule[(1, 3)] must have one entry per source: 2 sources, got 1"),
    ],
)
def test_bad_schedule_keys_are_refused_naming_schedule_and_the_key(schedule: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Mixture([3, 4], [1, 1], num_samples=12, schedule=schedule)
