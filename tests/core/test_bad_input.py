"""Bad input gets a specific error naming the field and the value expected, and loses nothing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.state import STATE_VERSION


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"data_source": -1},
            ValueError,
            "data_source (its length N) must be at least 0 and at most 4611686018427387903, got -1",
        ),
        ({"data_source": 2**62}, ValueError, "data_source (its length N) must be at least 0 and at most"),
        ({"data_source": object()}, TypeError, "data_source must be a sized dataset or an int, got object"),
        ({"data_source": 3.5}, TypeError, "data_source must be a sized dataset or an int, got float"),
        ({"data_source": True}, TypeError, "data_source must be a sized dataset or an int, got bool"),
        ({"data_source": 10, "seed": 1.5}, TypeError, "seed must be an int, got float 1.5"),
        ({"data_source": 10, "seed": "1"}, TypeError, "seed must be an int, got str '1'"),
        (
            {"data_source": 10, "seed": -1},
            ValueError,
            "seed must be at least 0 and at most 9223372036854775807, got -1",
        ),
        (
            {"data_source": 10, "seed": 2**63},
            ValueError,
            "seed must be at least 0 and at most 9223372036854775807, got 9223372036854775808",
        ),
        ({"data_source": 10, "seed": True}, TypeError, "seed must be an int, got bool True"),
        (
            {"data_source": 10, "rank": 3, "num_replicas": 3},
            ValueError,
            "rank must lie in [0, num_replicas) = [0, 3), got 3",
        ),
        (
            {"data_source": 10, "rank": -1, "num_replicas": 3},
            ValueError,
            "rank must be at least 0 and at most 1073741823, got -1",
        ),
        (
            {"data_source": 10, "num_replicas": 0},
            ValueError,
            "num_replicas must be at least 1 and at most 1073741824, got 0",
        ),
        (
            {"data_source": 10, "tail": "wrap"},
            ValueError,
            "tail must be one of ['pad', 'drop', 'uneven', 'carry'], got 'wrap'",
        ),
        ({"data_source": 10, "order": "random"}, ValueError, "order must be one of ['fast', 'torch'], got 'random'"),
        (
            {"data_source": 10, "batch_size": 0},
            ValueError,
            "batch_size must be at least 1 and at most 1073741824, got 0",
        ),
        ({"data_source": 10, "shuffle": 1}, TypeError, "shuffle must be a bool, got int 1"),
        (
            {"data_source": 2, "num_replicas": 3, "rank": 0, "tail": "drop"},
            ValueError,
            "tail='drop' with 2 records on num_replicas=3",
        ),
    ],
)
def test_constructor_errors_name_the_argument(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    data_source = kwargs.pop("data_source")
    with pytest.raises(error, match=re.escape(message)):
        StatefulSampler(data_source, **kwargs)


def test_set_epoch_and_consumed_batches_are_checked() -> None:
    sampler = StatefulSampler(10)
    with pytest.raises(ValueError, match=re.escape("epoch must be at least 0 and at most 4611686018427387903, got -2")):
        sampler.set_epoch(-2)
    with pytest.raises(TypeError, match=re.escape("epoch must be an int, got str '1'")):
        sampler.set_epoch("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("needs StatefulSampler(..., batch_size=B)")):
        sampler.state_dict(consumed_batches=1)


def saved_state(**overrides: Any) -> dict[str, Any]:
    sampler = StatefulSampler(100, seed=3, batch_size=4)
    iterator = iter(sampler)
    for _ in range(8):
        next(iterator)
    return {**sampler.state_dict(), **overrides}


@pytest.mark.parametrize(
    ("state", "field", "saved", "expected"),
    [
        (saved_state(size=101), "size", 101, 100),
        (saved_state(seed=4), "seed", 4, 3),
        (saved_state(shuffle=False), "shuffle", False, True),
        (saved_state(tail="drop"), "tail", "drop", "pad"),
        (saved_state(order="torch"), "order", "torch", "fast"),
        (saved_state(version=4), "version", 4, STATE_VERSION),
        (saved_state(position=101), "position", 101, "at most epoch_end = 100"),
        (saved_state(position=-1), "position", -1, "an int in [0, 9223372036854775807]"),
        (saved_state(epoch="1"), "epoch", "1", "int"),
        (saved_state(position=8.0), "position", 8.0, "int"),
        (saved_state(shuffle=1), "shuffle", 1, "bool"),
        (saved_state(world_size=0), "world_size", 0, "an int in [1, 1073741824]"),
        (saved_state(carry_start=5), "carry_start", 5, 0),
        (saved_state(tail="spiral"), "tail", "spiral", ["pad", "drop", "uneven", "carry"]),
        (saved_state(extra=1), "extra", 1, "<absent>"),
        ({k: v for k, v in saved_state().items() if k != "epoch"}, "epoch", "<missing>", "int"),
        ({k: v for k, v in saved_state().items() if k != "version"}, "version", "<missing>", STATE_VERSION),
        ([1, 2, 3], "state", "list", "a dict from StatefulSampler.state_dict()"),
    ],
)
def test_incompatible_states_are_refused_and_leave_the_sampler_unchanged(
    state: Any, field: str, saved: Any, expected: Any
) -> None:
    sampler = StatefulSampler(100, seed=3, batch_size=4)
    sampler.set_epoch(2)
    iterator = iter(sampler)
    drawn = [next(iterator) for _ in range(5)]
    before = sampler.state_dict()
    with pytest.raises(IncompatibleStateError) as caught:
        sampler.load_state_dict(state)
    assert (caught.value.field, caught.value.saved, caught.value.current) == (field, saved, expected)
    assert f"state field {field!r}: saved {saved!r}, expected {expected!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert sampler.state_dict() == before
    assert drawn + list(iterator) == sampler.indices(2).tolist()


def test_a_grown_or_shrunk_dataset_is_refused_not_silently_reshuffled() -> None:
    state = saved_state()
    for size in (99, 120):
        with pytest.raises(IncompatibleStateError, match="state field 'size': saved 100, expected"):
            StatefulSampler(size, seed=3, batch_size=4).load_state_dict(state)


@given(
    size=st.integers(0, 2**62 - 1),
    seed=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**40),
    world_size=st.integers(1, 4096),
    tail=st.sampled_from(["pad", "drop", "uneven", "carry"]),
    batch_size=st.one_of(st.none(), st.integers(1, 2**20)),
)
def test_state_is_small_json_whatever_the_size(
    size: int, seed: int, epoch: int, world_size: int, tail: str, batch_size: int | None
) -> None:
    if tail == "drop" and 0 < size < world_size:
        size = world_size
    if tail == "carry":
        batch_size = batch_size or 1
    sampler = StatefulSampler(size, seed=seed, num_replicas=world_size, rank=0, tail=tail, batch_size=batch_size)
    sampler.set_epoch(epoch)
    encoded = json.dumps(sampler.state_dict())
    assert len(encoded.encode()) < 512
    StatefulSampler(size, seed=seed, num_replicas=world_size, rank=0, tail=tail, batch_size=batch_size).load_state_dict(
        json.loads(encoded)
    )


VALID = saved_state()
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@given(field=st.sampled_from(sorted(VALID)), value=WRONG_VALUES, drop=st.booleans())
@example(field="epoch_end", value=0, drop=False)  # short of the epoch: was refused naming position
@example(field="epoch_end", value=8, drop=False)  # at the saved position: was taken as the epoch's end
def test_any_corrupted_field_is_refused_by_name_and_loses_nothing(field: str, value: Any, drop: bool) -> None:
    """A state with one field removed or replaced either still describes this sampler's order (the
    value happened to be valid, e.g. another world size) or is refused naming that field."""
    state = {k: v for k, v in VALID.items() if k != field} if drop else {**VALID, field: value}
    sampler = StatefulSampler(100, seed=3, batch_size=4)
    sampler.set_epoch(1)
    before = sampler.state_dict()
    try:
        sampler.load_state_dict(state)
    except IncompatibleStateError as error:
        assert error.field == field
        assert sampler.state_dict() == before
        assert list(sampler) == sampler.indices(1).tolist()
    else:
        assert not drop
        assert field in ("world_size", "batch_size", "epoch", "position") or state[field] == VALID[field]
        assert sampler.state_dict(consumed_batches=0)["epoch"] == state["epoch"]
