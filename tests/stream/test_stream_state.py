"""The stream's state: small, JSON, and refused with a clear error when it belongs to another order."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stateful_sampler import IncompatibleStateError
from stateful_sampler.stream import ShardedStream, StreamState
from tests.stream_helpers import MemoryReader, make_stream

COUNTS = [30, 0, 17, 25, 9, 40]


def saved_state(**kwargs) -> dict:
    return json.loads(json.dumps(make_stream(COUNTS, batch_size=4, window=2, **kwargs).state_dict(consumed_batches=3)))


def test_the_state_is_a_few_hundred_bytes_of_json_whatever_the_shard_count() -> None:
    small = json.dumps(saved_state())
    large = json.dumps(make_stream([1000] * 100_000, batch_size=4).state_dict(consumed_batches=3))
    assert len(small) < 300 and len(large) < 300


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda counts: counts[:3] + [26] + counts[4:], (r"state field 'shards\[3\]'.*'shard-003' with 26 records.*"
                                                          r"shard 'shard-003' changed since the save")),
        (lambda counts: counts + [5], r"state field 'shards': saved 6, expected 7: shards were added or removed"),
        (lambda counts: [counts[1], counts[0]] + counts[2:], (r"state field 'shards': saved 'several shards of "
                                                              r"other names, record counts or contents'")),
    ],
)  # fmt: skip
def test_a_changed_shard_list_or_count_is_refused_naming_the_shard(change, match) -> None:
    stream = make_stream(change(list(COUNTS)), batch_size=4, window=2)
    with pytest.raises(IncompatibleStateError, match=match):
        stream.load_state_dict(saved_state())
    assert (stream.epoch, stream.position) == (0, 0)  # a refused state changes nothing


def test_a_renamed_shard_is_named() -> None:
    reader = MemoryReader(COUNTS)
    names = reader.names
    reader.sizes["renamed"] = reader.sizes.pop(names[4])
    stream = ShardedStream(names[:4] + ["renamed"] + names[5:], reader, batch_size=4, window=2)
    with pytest.raises(IncompatibleStateError, match=r"shard 'renamed' changed since the save"):
        stream.load_state_dict(saved_state())


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("seed", 1, r"state field 'seed': saved 1, expected 0: the state belongs to another order"),
        ("window", 3, r"state field 'window': saved 3, expected 2"),
        ("tail", "drop", r"state field 'tail': saved 'drop', expected 'pad'"),
        ("position", 122, r"state field 'position': saved 122, expected 'at most 121'"),
        ("position", -1, r"state field 'position': saved -1, expected 'a non-negative int'"),
        ("epoch", 2**62, r"state field 'epoch': saved 4611686018427387904, expected 'at most 4611686018427387903'"),
        ("version", 4, r"state field 'version': saved 4, expected 3: unknown stream state version"),
        ("extra", 0, r"state field 'extra': saved 0, expected '<absent>'"),
    ],
)
def test_a_state_of_another_order_or_a_malformed_one_is_refused_naming_the_field(field, value, match) -> None:
    state = saved_state()
    if field in ("seed", "window", "tail"):  # packed in the state's "order" (tests/stream/test_state_encoding.py)
        state = replace(StreamState.from_dict(state), **{field: value}).to_dict()
    else:
        state = {**state, field: value}
    with pytest.raises(IncompatibleStateError, match=match):
        make_stream(COUNTS, batch_size=4, window=2).load_state_dict(state)


def test_world_size_batch_size_and_workers_may_change_on_load() -> None:
    stream = make_stream(COUNTS, batch_size=8, window=2, num_replicas=3, rank=2)
    stream.load_state_dict(saved_state())
    assert (stream.epoch, stream.position) == (0, 12)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be at least 1, got 0"),
        ({"batch_size": 2, "window": 0}, ValueError, r"window must be at least 1, got 0"),
        ({"batch_size": 2, "tail": "carry"}, ValueError, r"tail must be 'pad' or 'drop' for a stream, got 'carry'"),
        ({"batch_size": 2, "counts": [1, 2]}, ValueError, r"counts must give one count per shard \(6\), got 2"),
        (
            {"batch_size": 2, "counts": [1, 2, 3, 4, 5, -1]},
            ValueError,
            r"counts\[5\] \('shard-005'\) must be at least 0",
        ),
        (
            {"batch_size": 2, "num_replicas": 2, "rank": 2},
            ValueError,
            r"rank must lie in \[0, num_replicas\) = \[0, 2\)",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(kwargs, error, match) -> None:
    reader = MemoryReader(COUNTS)
    with pytest.raises(error, match=match):
        len(ShardedStream(reader.names, reader, **kwargs))


def test_a_reader_without_the_protocol_is_refused() -> None:
    with pytest.raises(TypeError, match=r"reader must have count\(shard\) and read\(shard, start, stop\), got dict"):
        ShardedStream(["a"], {}, batch_size=2)
