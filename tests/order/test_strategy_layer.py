"""The strategy layer: every strategy gets tails, sharding, elastic resume and state from one glue,
and a state refuses a sampler whose strategy would place other records."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from stateful_sampler import IncompatibleStateError, StatefulSampler, Strategy, Uniform
from stateful_sampler.order.strategy import PassOrder, check_length, id_array, weight_array
from tests.helpers import json_round_trip


class EvenFirst(Strategy):
    """A toy strategy: the even records of ``keep`` first, then the odd ones, reversed every other pass;
    pass p holds ``length + p % 2`` positions when ``vary`` (records repeat modulo N)."""

    name = "even-first"

    def __init__(self, keep: Any, vary: bool = False) -> None:
        self.keep = id_array("keep", keep)
        self.vary = vary
        self.passes_vary = vary

    def check(self, size: int) -> None:
        check_length("keep", self.keep, size)

    def pass_length(self, size: int, pass_index: int) -> int:
        return size + (pass_index % 2 if self.vary else 0)

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        order = np.concatenate([np.arange(0, size, 2), np.arange(1, size, 2)]).astype(np.int64)
        if pass_index % 2:
            order = order[::-1].copy()
        return lambda positions: order[positions % size]

    def _identity(self) -> tuple[Any, ...]:
        return (self.keep, self.vary)


def test_a_strategy_orders_each_pass_and_the_tails_apply_to_its_order() -> None:
    sampler = StatefulSampler(5, strategy=EvenFirst([1] * 5), num_replicas=2, rank=1, tail="pad", yield_keys=True)
    keys = list(sampler)
    assert [key.index for key in keys] == [2, 1, 0]  # global order 0 2 4 1 3 | 0 (padding); rank 1 takes 1, 3, 5
    assert [key.is_padding for key in keys] == [False, False, True]
    sampler.set_epoch(1)
    assert [key.index for key in sampler] == [1, 2, 3]  # global order 3 1 4 2 0 | 3


def test_an_elastic_resume_works_for_any_strategy_without_strategy_specific_code() -> None:
    strategy = EvenFirst(range(11))
    before = [StatefulSampler(11, strategy=strategy, num_replicas=3, rank=r, batch_size=2) for r in range(3)]
    consumed = [list(sampler)[:2] for sampler in before]
    state = json_round_trip(before[0].state_dict(consumed_batches=1))
    after = [StatefulSampler(11, strategy=EvenFirst(range(11)), num_replicas=2, rank=r, batch_size=2) for r in range(2)]
    for sampler in after:
        sampler.load_state_dict(state)
    rest = [list(sampler) for sampler in after]
    assert len(rest[0]) == len(rest[1])
    assert sorted(i for part in consumed + rest for i in part) == sorted([*range(11), 0])  # one marked repeat


def test_a_state_from_another_strategy_or_other_arrays_is_refused_by_name() -> None:
    state = StatefulSampler(6, strategy=EvenFirst([0, 1, 2, 3, 4, 5]), batch_size=2).state_dict(consumed_batches=1)
    other_arrays = StatefulSampler(6, strategy=EvenFirst([0, 1, 2, 3, 4, 6]), batch_size=2)
    with pytest.raises(IncompatibleStateError) as caught:
        other_arrays.load_state_dict(state)
    assert caught.value.field == "strategy_fingerprint"
    with pytest.raises(
        IncompatibleStateError, match=re.escape("state field 'strategy': saved 'even-first', expected 'uniform'")
    ):
        StatefulSampler(6, batch_size=2).load_state_dict(state)


def test_the_fingerprint_is_stable_and_covers_the_arrays() -> None:
    assert EvenFirst([1, 2]).fingerprint() == EvenFirst(np.array([1, 2])).fingerprint()
    assert EvenFirst([1, 2]).fingerprint() != EvenFirst([2, 1]).fingerprint()
    assert Uniform().fingerprint() == Uniform(shuffle=False).fingerprint()  # shuffle is a field of its own
    assert StatefulSampler(3).state_dict()["strategy"] == "uniform"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"strategy": "uniform"}, TypeError, "strategy must be a Strategy such as Uniform() or Weighted(...), got str"),
        ({"strategy": EvenFirst([0] * 4)}, ValueError, "keep must have one entry per record: length 5, got 4"),
        (
            {"strategy": EvenFirst([0] * 5), "shuffle": False},
            ValueError,
            "shuffle=False applies to the Uniform strategy only",
        ),
        (
            {"strategy": EvenFirst([0] * 5), "order": "torch"},
            ValueError,
            "order='torch' applies to the Uniform strategy only",
        ),
        (
            {"strategy": EvenFirst([0] * 5, vary=True), "tail": "carry", "batch_size": 2},
            ValueError,
            "tail='carry' needs passes of one length",
        ),
    ],
)
def test_strategy_options_that_cannot_apply_are_refused(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        StatefulSampler(5, **kwargs)


def test_passes_of_varying_length_give_epochs_of_their_own_length() -> None:
    sampler = StatefulSampler(4, strategy=EvenFirst(range(4), vary=True), tail="uneven")
    lengths = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        lengths.append(len(list(sampler)))
    assert lengths == [4, 5, 4, 5]


@pytest.mark.parametrize(
    ("helper", "values", "error", "message"),
    [
        (id_array, [1.5, 2], TypeError, "labels must hold integer ids, got dtype float64 with 1.5 at position 0"),
        (id_array, [[1, 2]], ValueError, "labels must be 1-D, got shape (1, 2)"),
        (id_array, [-1, 2], ValueError, "labels must hold non-negative ids, got -1 at position 0"),
        (id_array, "12", TypeError, "labels must be a list, a NumPy array or a 1-D tensor, got str"),
        (weight_array, [1, float("nan")], ValueError, "labels must be finite and non-negative, got nan at position 1"),
        (weight_array, [0, 0], ValueError, "labels must have a positive sum, got all zeros (2 weights)"),
        (weight_array, [1, float("inf")], ValueError, "labels must be finite and non-negative, got inf at position 1"),
    ],
)
def test_array_arguments_are_checked_naming_the_argument(helper: Any, values: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        helper("labels", values)


def test_array_arguments_accept_lists_arrays_and_tensors() -> None:
    torch = pytest.importorskip("torch")
    expected = np.array([3, 1, 2])
    for values in ([3, 1, 2], np.array([3, 1, 2]), torch.tensor([3, 1, 2]), [3.0, 1.0, 2.0]):
        assert np.array_equal(id_array("labels", values), expected)
