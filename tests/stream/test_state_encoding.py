"""The stream state's encoding (version 3: version 2's packed order and the order's ``spread``): at most 120 B
pickled (Mosaic's 115-120 B on the same benchmark), every check of version 1 kept, and states of versions 1
and 2, saved before ``spread`` existed, still loaded, to exactly the order they were saved with."""

from __future__ import annotations

import base64
import pickle
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError
from stateful_sampler.order.layout import MAX_EPOCH
from stateful_sampler.stream import StreamState
from tests.stream_helpers import loop_batches, make_stream

COUNTS = [30, 0, 17, 25, 9, 40]
# What version 1 saved for make_stream(COUNTS, batch_size=4, window=2).state_dict(consumed_batches=3).
V1 = {"version": 1, "shards": 6, "records": 121, "digest": 836252706113051324, "locator": 2279065033966225382,
      "seed": 0, "window": 2, "tail": "pad", "epoch": 0, "position": 12, "world_size": 1, "batch_size": 4}  # fmt: skip
V2 = {"version": 2, "epoch": 0, "position": 12, "order": "vNpT0mf3mgvmB5LJkt2gHwZ5AgAA"}
# The same state as version 3 writes it: the order's spread is the last varint (1, and the default 8).
V3_WHOLE_SHARDS = {"version": 3, "epoch": 0, "position": 12, "order": "vNpT0mf3mgvmB5LJkt2gHwZ5AgAAAQ"}
V3 = {"version": 3, "epoch": 0, "position": 12, "order": "vNpT0mf3mgvmB5LJkt2gHwZ5AgAACA"}
# What the release before spread delivered from V2 (loop_batches at 2 workers), and the first batches of epoch 1.
V2_REST = [[("shard-003", 4), ("shard-003", 14), ("shard-003", 3), ("shard-004", 5)],
           [("shard-004", 2), ("shard-003", 1), ("shard-003", 11), ("shard-003", 8)],
           [("shard-003", 5), ("shard-004", 6), ("shard-004", 8), ("shard-003", 17)]]  # fmt: skip
V2_NEXT_EPOCH = [[("shard-000", 15), ("shard-000", 29), ("shard-000", 9), ("shard-000", 4)],
                 [("shard-002", 10), ("shard-000", 5), ("shard-002", 15), ("shard-000", 12)]]  # fmt: skip


def stream(**kwargs):
    return make_stream(COUNTS, **{"batch_size": 4, "window": 2, **kwargs})


def test_the_state_is_version_3_with_the_order_and_its_spread_packed() -> None:
    assert stream().state_dict(consumed_batches=3) == V3
    assert stream(spread=1).state_dict(consumed_batches=3) == V3_WHOLE_SHARDS


def test_a_version_2_state_resumes_to_exactly_the_order_it_was_saved_with() -> None:
    """Saved before spread existed (the release's default, spread 1), resumed by a stream built with the
    defaults: the state's order, in this epoch and the next, saved again with spread 1."""
    resumed = stream()
    resumed.load_state_dict(V2)
    assert resumed.spread == 1 and resumed.state_dict() == V3_WHOLE_SHARDS
    rest = loop_batches(resumed, 2)
    assert rest[:3] == V2_REST and len(rest) == 28
    whole_shards = stream(spread=1)
    whole_shards.load_state_dict(V3_WHOLE_SHARDS)
    assert loop_batches(whole_shards, 0) == rest
    resumed.set_epoch(1)
    assert loop_batches(resumed, 0)[:2] == V2_NEXT_EPOCH
    fresh = stream()
    assert fresh.spread == 8 and loop_batches(fresh, 0) != loop_batches(stream(spread=1), 0)


def test_a_spread_given_that_contradicts_the_state_is_refused_naming_it() -> None:
    live = stream(spread=8)
    with pytest.raises(IncompatibleStateError, match=r"state field 'spread': saved 1, expected 8: the state belongs to "
                                                     r"another order: build the stream with spread=1, or leave spread "
                                                     r"unset to take the state's"):  # fmt: skip
        live.load_state_dict(V2)
    assert (live.epoch, live.position, live.spread) == (0, 0, 8)
    with pytest.raises(IncompatibleStateError, match=r"state field 'spread': saved 8, expected 2"):
        stream(spread=2).load_state_dict(V3)
    taken = stream()
    taken.load_state_dict(stream(spread=3).state_dict())
    assert taken.spread == 3 and taken.order.spread == 3


def test_the_benchmark_stream_state_is_at_most_120_bytes_pickled() -> None:
    """benchmarks/stream_peers.py's stream (64 shards, batch 256, window 8) at half an epoch, measured as it
    measures: ``len(pickle.dumps(state))``. At 10^5, 10^6 and 10^7 records: 95, 97 and 99 B (version 2: 94, 96, 97;
    version 1: 181-183)."""
    for records, size in ((10**5, 95), (10**6, 97), (10**7, 99)):
        counts = [records // 64 + (shard < records % 64) for shard in range(64)]
        live = make_stream(counts, batch_size=256, window=8)
        state = live.state_dict(consumed_batches=records // 256 // 2)
        assert len(pickle.dumps(state)) == size <= 120


def test_the_largest_state_stays_small() -> None:
    """The largest seed, 10^5 shards of 10^9 records in all, a spread of 1000, late in a late epoch: 120 B pickled."""
    largest = StreamState(10**5, 10**9, (1 << 61) - 2, (1 << 61) - 2, (1 << 63) - 1, 10**5, "drop", 1000, 10**6,
                          10**9 - 1)  # fmt: skip
    assert len(pickle.dumps(largest.to_dict())) == 120
    assert StreamState.from_dict(largest.to_dict()) == largest


def test_a_version_1_state_resumes_exactly_as_its_version_2_twin() -> None:
    from_v1, from_v2 = stream(), stream()
    from_v1.load_state_dict(V1)
    from_v2.load_state_dict(V2)
    assert (from_v1.epoch, from_v1.position, from_v1.spread) == (0, 12, 1)
    assert from_v1.state_dict() == V3_WHOLE_SHARDS  # saved again, as version 3
    batches = loop_batches(from_v1, 2)
    assert batches == loop_batches(from_v2, 2) and len(batches) == 28  # the epoch's 109 records left, by 4


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"seed": 1}, r"state field 'seed': saved 1, expected 0: the state belongs to another order"),
        ({"window": 3}, r"state field 'window': saved 3, expected 2"),
        ({"tail": "drop"}, r"state field 'tail': saved 'drop', expected 'pad'"),
        ({"tail": "carry"}, r"state field 'tail': saved 'carry', expected \['pad', 'drop'\]"),
        ({"records": 122}, r"state field 'records': saved 122, expected 121"),
        ({"shards": 7}, r"state field 'shards': saved 7, expected 6: shards were added or removed"),
        ({"digest": V1["digest"] + 1}, r"state field 'shards': saved 'several shards"),
        ({"position": 122}, r"state field 'position': saved 122, expected 'at most 121'"),
        ({"world_size": -1}, r"state field 'world_size': saved -1, expected 'a non-negative int'"),
        ({"batch_size": "4"}, r"state field 'batch_size': saved '4', expected 'a non-negative int'"),
        ({"order": V2["order"]}, r"state field 'order': saved 'vNpT.*', expected '<absent>': not a field"),
    ],
)  # fmt: skip
def test_a_version_1_state_keeps_every_check(change, match) -> None:
    live = stream()
    with pytest.raises(IncompatibleStateError, match=match):
        live.load_state_dict({**V1, **change})
    assert (live.epoch, live.position) == (0, 0)


def test_a_version_1_state_missing_a_field_is_refused_naming_it() -> None:
    state = {name: value for name, value in V1.items() if name != "world_size"}
    with pytest.raises(IncompatibleStateError, match=r"state field 'world_size': saved '<missing>', expected 'int'"):
        stream().load_state_dict(state)


def test_a_changed_shard_is_named_from_a_version_2_state() -> None:
    changed = make_stream(COUNTS[:3] + [26] + COUNTS[4:], batch_size=4, window=2)
    with pytest.raises(IncompatibleStateError, match=r"state field 'shards\[3\]'.*shard 'shard-003' changed"):
        changed.load_state_dict(V2)


def with_bytes(edit) -> str:
    raw = bytearray(base64.urlsafe_b64decode(V2["order"] + "=" * (-len(V2["order"]) % 4)))
    return base64.urlsafe_b64encode(bytes(edit(raw))).decode().rstrip("=")


@pytest.mark.parametrize(
    ("order", "match"),
    [
        (with_bytes(lambda raw: raw[:-1] + bytes([2])), r"state field 'tail': saved 2, expected \['pad', 'drop'\]"),
        (with_bytes(lambda raw: raw[:-1]), r"state field 'order'"),  # no tail
        (with_bytes(lambda raw: raw + bytes([0])), r"state field 'order'"),  # a sixth value
        (with_bytes(lambda raw: raw[:-1] + bytes([0x80])), r"state field 'order'"),  # a varint cut short
        (with_bytes(lambda raw: raw[:-1] + bytes([0x80, 0])), r"state field 'order'"),  # an overlong zero
        (with_bytes(lambda raw: raw[:10]), r"state field 'order'"),  # not even the two sums
        (V2["order"] + "=", r"state field 'order'"),  # padding: not what state_dict writes
        ("not base64!", r"state field 'order': saved 'not base64!', expected 'the packed order"),
        (12, r"state field 'order': saved 12, expected 'str'"),
    ],
)  # fmt: skip
def test_a_malformed_order_is_refused_naming_the_field(order, match) -> None:
    live = stream()
    with pytest.raises(IncompatibleStateError, match=match):
        live.load_state_dict({**V2, "order": order})
    assert (live.epoch, live.position) == (0, 0)


def test_version_3_keeps_the_checks_of_the_packed_fields() -> None:
    saved = StreamState.from_dict(V3)
    for field, value, match in [("seed", 5, r"'seed': saved 5, expected 0"), ("window", 1, r"'window': saved 1"),
                                ("records", 120, r"'records': saved 120, expected 121"),
                                ("shards", 5, r"'shards': saved 5, expected 6"),
                                ("spread", 2, r"'spread': saved 2, expected 8")]:  # fmt: skip
        with pytest.raises(IncompatibleStateError, match=match):
            stream(spread=8).load_state_dict(replace(saved, **{field: value}).to_dict())


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda raw: raw[:-1] + bytes([0]), r"state field 'spread': saved 0, expected 'at least 1'"),
        (lambda raw: raw[:-1], r"state field 'order'"),  # version 2's five values under version 3
        (lambda raw: raw + bytes([1]), r"state field 'order'"),  # a seventh value
    ],
)  # fmt: skip
def test_a_malformed_version_3_order_is_refused_naming_the_field(edit, match) -> None:
    raw = bytearray(base64.urlsafe_b64decode(V3["order"] + "=" * (-len(V3["order"]) % 4)))
    order = base64.urlsafe_b64encode(bytes(edit(raw))).decode().rstrip("=")
    live = stream()
    with pytest.raises(IncompatibleStateError, match=match):
        live.load_state_dict({**V3, "order": order})
    assert (live.epoch, live.position, live.spread) == (0, 0, 8)


counts = st.integers(0, 2**40)


@given(
    shards=counts, records=counts, digest=st.integers(0, 2**61 - 2), locator=st.integers(0, 2**61 - 2),
    seed=st.integers(0, 2**63 - 1), window=st.integers(1, 2**20), tail=st.sampled_from(["pad", "drop"]),
    spread=st.integers(1, 2**20), epoch=st.integers(0, MAX_EPOCH), position=counts,
)  # fmt: skip
def test_every_state_survives_its_encoding(
    shards, records, digest, locator, seed, window, tail, spread, epoch, position
):
    state = StreamState(shards, records, digest, locator, seed, window, tail, spread, epoch, position)
    saved = state.to_dict()
    assert StreamState.from_dict(saved) == state
    assert StreamState.from_dict(pickle.loads(pickle.dumps(saved))).to_dict() == saved
