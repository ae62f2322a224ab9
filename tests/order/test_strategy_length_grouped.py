"""``LengthGrouped``: megabatches of a uniform shuffle sorted by length, so batches pad little; every record
once per pass, a resume sorts one megabatch, and every rank's batch of a step has similar lengths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.audit.lengths import audit_lengths
from stateful_sampler.order.length_grouped import LengthGrouped
from tests.helpers import json_round_trip
from tests.strategy_resume_checks import loader_resume, sigkilled_run


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=300),
    batch_size=st.integers(1, 8),
    megabatch=st.integers(1, 6),
    longest_first=st.booleans(),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 5),
)
def test_every_record_appears_once_a_pass_and_each_megabatch_is_sorted_longest_first(
    lengths: list[int], batch_size: int, megabatch: int, longest_first: bool, seed: int, epoch: int
) -> None:
    strategy = LengthGrouped(lengths, batch_size=batch_size, megabatch=megabatch, longest_first=longest_first)
    sampler = StatefulSampler(len(lengths), strategy=strategy, seed=seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    assert sorted(order) == list(range(len(lengths)))
    span = batch_size * megabatch
    by_length = np.array(lengths)[order]
    for start in range(0, len(order), span):
        assert (np.diff(by_length[start : start + span]) <= 0).all()
    if longest_first:
        assert order[0] == int(np.argmax(lengths))


def test_the_order_changes_every_pass_and_ties_keep_their_shuffled_order() -> None:
    strategy = LengthGrouped([5] * 40, batch_size=4, megabatch=2)  # all ties: the plain shuffle shows through
    sampler = StatefulSampler(40, strategy=strategy, seed=1)
    first = list(sampler)
    sampler.set_epoch(1)
    assert first != list(sampler)
    uniform = list(StatefulSampler(40, strategy=LengthGrouped([5] * 40, batch_size=8, megabatch=1), seed=1))
    assert first == uniform  # same shuffle whatever the megabatch, as nothing is reordered


def test_a_resume_sorts_only_the_megabatch_it_lands_in() -> None:
    strategy = LengthGrouped(np.arange(10_000) * 7919 % 1000, batch_size=32, megabatch=50)
    order = strategy.pass_order(10_000, 3, 0)
    first_batch = np.arange(5000, 5032)  # inside megabatch 3 (positions 4800..6399)
    whole = strategy.pass_order(10_000, 3, 0)(np.arange(10_000))
    assert order(first_batch).tolist() == whole[5000:5032].tolist()
    assert list(order._sorted) == [3]  # type: ignore[attr-defined]


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_batches_of_one_step_are_strided_slices_of_one_sorted_global_batch_on_every_rank(world_size: int) -> None:
    lengths = np.random.default_rng(0).integers(1, 500, 1000)
    strategy = LengthGrouped(lengths, batch_size=4 * world_size, megabatch=5)
    ranks = [StatefulSampler(1000, strategy=strategy, num_replicas=world_size, rank=r, seed=2, batch_size=4)
             for r in range(world_size)]  # fmt: skip
    per_rank = [list(sampler) for sampler in ranks]
    whole = strategy.pass_order(1000, 2, 0)(np.arange(1000))
    for step in range(1000 // (4 * world_size)):
        step_batches = [per_rank[r][step * 4 : step * 4 + 4] for r in range(world_size)]
        global_batch = whole[step * 4 * world_size : (step + 1) * 4 * world_size]
        assert [list(global_batch[r::world_size]) for r in range(world_size)] == step_batches
    audit = audit_lengths(lengths, whole, 4, world_size)
    uniform = audit_lengths(lengths, np.array(list(StatefulSampler(1000, seed=2))), 4, world_size)
    assert audit.rank_spread < uniform.rank_spread / 4  # the ranks' longest records of a step are close


def test_padding_waste_is_padding_tokens_over_padded_tokens() -> None:
    audit = audit_lengths(np.array([1, 2, 3, 4, 10]), np.array([0, 1, 2, 3, 4]), batch_size=2)
    assert audit.padding_waste == pytest.approx(2 / 22)  # batches (1,2) (3,4) (10): 4 + 8 + 10 tokens, 2 padding
    assert audit.batch_spread.tolist() == [1, 1, 0]
    lengths = np.clip(np.random.default_rng(1).lognormal(5, 0.9, 20_000), 1, 4096).astype(np.int64)
    grouped = np.array(list(StatefulSampler(20_000, strategy=LengthGrouped(lengths, batch_size=32), seed=0)))
    shuffled = np.array(list(StatefulSampler(20_000, seed=0)))
    assert audit_lengths(lengths, grouped, 32).padding_waste < 0.25
    assert audit_lengths(lengths, shuffled, 32).padding_waste > 0.7


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly(workers: int) -> None:
    lengths = np.arange(90) * 37 % 101
    make = lambda: StatefulSampler(90, seed=3, batch_size=4, strategy=LengthGrouped(lengths, batch_size=4, megabatch=3))
    whole, resumed = loader_resume(make, workers, consumed=9)
    assert resumed == whole


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Path) -> None:
    whole, cut = sigkilled_run("length-grouped", tmp_path, workers=(0, 2))
    assert len(whole) == 45
    assert cut == whole


@settings(max_examples=40, deadline=None)
@given(
    split=st.sampled_from([(1, 4, 4, 1), (2, 2, 4, 1), (4, 1, 2, 2), (2, 3, 3, 2), (1, 6, 6, 1)]),
    size=st.integers(1, 120),
    steps=st.integers(0, 30),
    tail=st.sampled_from(["pad", "drop", "uneven"]),
)
def test_an_elastic_resume_with_the_same_global_batch_serves_every_remaining_position_once(
    split: tuple[int, int, int, int], size: int, steps: int, tail: str
) -> None:
    before, batch_before, after, batch_after = split  # ranks x per-rank batch: the global batch is kept
    lengths = np.arange(size) * 13 % 29
    strategy = lambda: LengthGrouped(lengths, batch_size=before * batch_before, megabatch=2)
    if tail == "drop" and size < max(before, after):
        tail = "pad"
    saving = [StatefulSampler(size, strategy=strategy(), num_replicas=before, rank=r, seed=5, tail=tail,
                              batch_size=batch_before) for r in range(before)]  # fmt: skip
    batches = min(steps, -(-len(saving[0]) // batch_before))
    consumed = [list(sampler)[: batches * batch_before] for sampler in saving]
    state = json_round_trip(saving[0].state_dict(consumed_batches=batches))
    resumed = [StatefulSampler(size, strategy=strategy(), num_replicas=after, rank=r, seed=5, tail=tail,
                               batch_size=batch_after) for r in range(after)]  # fmt: skip
    for sampler in resumed:
        sampler.load_state_dict(state)
    rest = [list(sampler) for sampler in resumed]
    if tail != "uneven":
        assert len({len(part) for part in rest}) == 1
    order = strategy().pass_order(size, 5, 0)(np.arange(size)).tolist()
    position = min(state["position"], size)
    assert [consumed[k % before][k // before] for k in range(position)] == order[:position]
    left = order[position:] if state["position"] < state["epoch_end"] else []
    served = [rest[k % after][k // after] for k in range(sum(map(len, rest)))]
    if tail == "drop":
        assert served == left[: len(served)] and len(left) - len(served) < after
    else:
        assert served[: len(left)] == left and len(served) - len(left) < (after if tail == "pad" else 1)


def test_a_state_of_another_global_batch_or_megabatch_is_refused_by_the_fingerprint() -> None:
    lengths = np.arange(30) % 7
    state = StatefulSampler(30, strategy=LengthGrouped(lengths, batch_size=4), batch_size=4).state_dict()
    for other in (
        LengthGrouped(lengths, megabatch=49),
        LengthGrouped(lengths, batch_size=4, longest_first=True),
        LengthGrouped(lengths + 1, batch_size=4),
    ):
        with pytest.raises(IncompatibleStateError) as caught:
            StatefulSampler(30, strategy=other, batch_size=4).load_state_dict(state)
        assert caught.value.field == "strategy_fingerprint"
    with pytest.raises(IncompatibleStateError) as caught:  # another global batch: taken from the sampler
        StatefulSampler(30, strategy=LengthGrouped(lengths), batch_size=8).load_state_dict(state)
    assert caught.value.field == "strategy_fingerprint"


@pytest.mark.parametrize(
    ("lengths", "options", "error", "message"),
    [
        ([1, 2], {"megabatch": 0}, ValueError, "megabatch must be at least 1, got 0"),
        ([1, 2], {"batch_size": 0}, ValueError, "batch_size must be at least 1, got 0"),
        ([1, -2], {}, ValueError, "lengths must hold non-negative ids, got -2 at position 1"),
        ([1.5, 2], {}, TypeError, "lengths must hold integer ids, got dtype float64 with 1.5 at position 0"),
        ([[1, 2]], {}, ValueError, "lengths must be 1-D, got shape (1, 2)"),
        ([1, 2], {"longest_first": 1}, TypeError, "longest_first must be a bool, got int 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(
    lengths: Any, options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        LengthGrouped(lengths, **{"batch_size": 2, **options})


def test_lengths_of_the_wrong_length_are_refused_by_the_sampler() -> None:
    with pytest.raises(ValueError, match=re.escape("lengths must have one entry per record: length 5, got 4")):
        StatefulSampler(5, strategy=LengthGrouped([1, 2, 3, 4], batch_size=2))
    with pytest.raises(ValueError, match="batch_size"):  # the global batch is taken from the sampler, which has none
        StatefulSampler(2, strategy=LengthGrouped([1, 2]))
