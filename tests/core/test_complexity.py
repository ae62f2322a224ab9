"""Resume is O(1): the work to reach the first batch must not depend on where the run resumes.

Counted, not timed: every position the permutation evaluates goes through
``FeistelPermutation.__call__``, so equal counts at positions 10 and 10**9 of a 2*10**9-record
epoch show that nothing is replayed or skipped over.
"""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler

from stateful_sampler import StatefulSampler
from stateful_sampler.order.permutation import FeistelPermutation

SIZE = 2 * 10**9
BATCH = 256


class EvaluationCounter:
    """Counts the positions and the permutations the sampler evaluates."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.positions = 0
        self.built = 0
        self.largest_call = 0
        original_call = FeistelPermutation.__call__
        original_init = FeistelPermutation.__init__

        def counting_call(permutation: FeistelPermutation, positions: np.ndarray) -> np.ndarray:
            self.positions += len(positions)
            self.largest_call = max(self.largest_call, len(positions))
            return original_call(permutation, positions)

        def counting_init(permutation: FeistelPermutation, *args: int) -> None:
            self.built += 1
            original_init(permutation, *args)

        monkeypatch.setattr(FeistelPermutation, "__call__", counting_call)
        monkeypatch.setattr(FeistelPermutation, "__init__", counting_init)

    def reset(self) -> None:
        self.positions = 0
        self.built = 0


def first_batch_after_resume(position: int, *, tail: str = "pad", world_size: int = 1, rank: int = 0) -> list[int]:
    saved = StatefulSampler(SIZE, seed=3, tail=tail, num_replicas=world_size, rank=0, batch_size=BATCH)
    state = saved.state_dict()
    state["position"] = position
    resumed = StatefulSampler(SIZE, seed=3, tail=tail, num_replicas=world_size, rank=rank, batch_size=BATCH)
    resumed.load_state_dict(state)
    return next(iter(BatchSampler(resumed, BATCH, drop_last=False)))


@pytest.mark.parametrize("tail", ["pad", "drop", "uneven", "carry"])
@pytest.mark.parametrize(("world_size", "rank"), [(1, 0), (2, 1)])
def test_resume_work_does_not_depend_on_position(
    monkeypatch: pytest.MonkeyPatch, tail: str, world_size: int, rank: int
) -> None:
    counter = EvaluationCounter(monkeypatch)
    first_batch_after_resume(10, tail=tail, world_size=world_size, rank=rank)
    early = (counter.positions, counter.built)
    counter.reset()
    first_batch_after_resume(10**9, tail=tail, world_size=world_size, rank=rank)
    late = (counter.positions, counter.built)

    assert early == late
    assert early == (1024, 1)  # one first block of the sampler, one permutation built


def test_resumed_batch_is_the_permutation_at_the_saved_position() -> None:
    expected = FeistelPermutation(SIZE, 3, 0)(np.arange(10**9, 10**9 + BATCH, dtype=np.int64))
    assert first_batch_after_resume(10**9) == expected.tolist()


@settings(max_examples=25, deadline=None)
@given(position=st.integers(min_value=0, max_value=SIZE - 10**4))
def test_resume_evaluates_one_first_block_anywhere(position: int) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        counter = EvaluationCounter(monkeypatch)
        first_batch_after_resume(position)
        assert (counter.positions, counter.built) == (1024, 1)


def test_iteration_evaluates_each_position_once_in_bounded_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffering ahead never evaluates a position twice (an epoch costs exactly N evaluations),
    and never more than one block of 2^14 positions at a time: memory is O(block), not O(N)."""
    counter = EvaluationCounter(monkeypatch)
    sampler = StatefulSampler(100_000, seed=1, tail="uneven")
    drawn = list(islice(iter(sampler), 100_000))

    assert sorted(drawn) == list(range(100_000))
    assert (counter.positions, counter.built) == (100_000, 1)
    assert counter.largest_call == 1 << 14
