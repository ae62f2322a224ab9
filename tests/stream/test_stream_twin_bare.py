"""Restored equals live, for a ``ShardedStream`` iterated directly (``for record in stream``, no loader).

Issue 25, item 7b. The stream hands each record of such a pass out itself, so, as ``StatefulSampler`` at 0
workers, it knows at every point how far the loop got: ``state_dict()`` needs no count inside the pass, a
``consumed_batches`` of more records than it handed out is refused, and the pass is begun at ``iter()``.

A live stream and, after every save, a twin restored fresh from the saved state (through JSON). The twin
restored inside a pass stands for the live pass under way: it begins its pass at once (a resumed process's
first ``iter()``), so the live iterator's next records are the twin's first ones. After every rule both
must agree on ``epoch``, ``position``, ``len``, ``remaining_length`` and ``state_dict()`` (or refuse alike),
and every record both yield must be the same. Rules: ``iter`` (also abandoning a pass), ``next`` one record
at a time (also past the end), a batch taken with ``islice`` (a loop that batches, which sees the end inside
a short batch), ``set_epoch`` (any epoch, also the one under way), a save with and without a count, and
records drawn from an older iterator, which must move nothing.
"""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stateful_sampler.stream import ShardedStream
from tests.helpers import scaled_examples
from tests.stream_helpers import make_stream
from tests.twin_helpers import outcome


class _Side:
    """One stream, its iterator under way, the records the loop took from it, whether it saw the end."""

    def __init__(self, stream: ShardedStream) -> None:
        self.stream = stream
        self.iterator: Any = None
        self.older: Any = None
        self.taken = 0
        self.stopped = False

    def begin(self) -> None:
        self.older = self.iterator
        self.iterator, self.taken, self.stopped = iter(self.stream), 0, False

    def records(self, count: int) -> list[Any]:
        got: list[Any] = []
        if self.iterator is None:
            return got
        for _ in range(count):
            try:
                got.append(next(self.iterator))
            except StopIteration:
                self.stopped = True
                got.append("StopIteration")
                break
        self.taken += sum(record != "StopIteration" for record in got)
        return got

    def batch(self) -> list[Any]:
        if self.iterator is None:
            return []
        got = list(islice(self.iterator, self.stream.batch_size))
        self.taken += len(got)
        self.stopped = self.stopped or len(got) < self.stream.batch_size  # islice asked past the end
        return got

    @property
    def under_way(self) -> bool:
        return self.iterator is not None and not self.stopped


def reports(stream: ShardedStream) -> dict[str, Any]:
    return {
        "epoch": outcome(lambda: stream.epoch),
        "position": outcome(lambda: stream.position),
        "len": outcome(lambda: len(stream)),
        "remaining_length": outcome(stream.remaining_length),
        "state_dict": outcome(stream.state_dict),
    }


class BareStreamTwins(RuleBasedStateMachine):
    @initialize(
        counts=st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(lambda counts: sum(counts) > 0),
        batch_size=st.integers(1, 3),
        window=st.integers(1, 2),
        world_and_rank=st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 2)]),
        tail=st.sampled_from(["pad", "drop"]),
    )
    def build(
        self, counts: list[int], batch_size: int, window: int, world_and_rank: tuple[int, int], tail: str
    ) -> None:
        world, rank = world_and_rank
        if tail == "drop" and sum(counts) < world:
            tail = "pad"

        def stream() -> ShardedStream:
            return make_stream(counts, batch_size=batch_size, window=window, seed=4, tail=tail,
                               num_replicas=world, rank=rank)  # fmt: skip

        self.make = stream
        self.live = _Side(stream())
        self.twin: _Side | None = None
        self.log: list[str] = []

    def sides(self) -> list[_Side]:
        return [self.live] if self.twin is None else [self.live, self.twin]

    @rule()
    def open_iter(self) -> None:
        self.log.append("iter")
        for side in self.sides():
            side.begin()

    @precondition(lambda self: self.live.iterator is not None)
    @rule(count=st.integers(1, 4))
    def next_records(self, count: int) -> None:
        self.log.append(f"next x{count}")
        taken = [side.records(count) for side in self.sides()]
        assert len({repr(got) for got in taken}) == 1, (taken, self.log)

    @precondition(lambda self: self.live.iterator is not None)
    @rule()
    def take_batch(self) -> None:
        self.log.append("islice batch")
        taken = [side.batch() for side in self.sides()]
        assert len({repr(got) for got in taken}) == 1, (taken, self.log)

    @precondition(lambda self: self.live.older is not None)
    @rule(count=st.integers(1, 3))
    def draw_from_an_older_iterator(self, count: int) -> None:
        """An iterator replaced by a newer ``iter()`` (no twin has one): its records move no state."""
        self.log.append(f"older x{count}")
        list(islice(self.live.older, count))

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch: int) -> None:
        self.log.append(f"set_epoch({epoch})")
        for side in self.sides():
            goes_on = side.under_way and epoch == side.stream.epoch  # the pass under way goes on
            side.stream.set_epoch(epoch)
            if not goes_on:
                side.iterator = side.older = None

    @rule()
    def save(self) -> None:
        self._restore(outcome(self.live.stream.state_dict), "save")

    @precondition(lambda self: self.live.iterator is not None)
    @rule()
    def save_consumed(self) -> None:
        """Inside the loop, with the loop's count: at a batch boundary, or after the pass's last record
        before the loop saw the end (a short last batch taken by ``next``). Once the stream saw the end,
        the count is refused: the live stream has moved on, and the count would resume inside the pass."""
        batch, taken = self.live.stream.batch_size, self.live.taken
        if self.live.stopped:
            refused = outcome(lambda: self.live.stream.state_dict(consumed_batches=-(-taken // batch)))
            assert refused[0] == "raised" and "is iterated directly and has ended" in refused[2], (refused, self.log)
            return
        if taken % batch and taken != self.live.stream.pass_length():
            return
        self._restore(outcome(lambda: self.live.stream.state_dict(consumed_batches=-(-taken // batch))), "save k")

    def _restore(self, state: tuple[Any, ...], what: str) -> None:
        self.log.append(what)
        assert state[0] == "ok", (state, self.log)  # a directly iterated stream knows its state everywhere
        if self.twin is not None:
            assert outcome(self.twin.stream.state_dict) == state, self.log
        twin = _Side(self.make())
        twin.stream.load_state_dict(json.loads(json.dumps(state[1])))
        if self.live.under_way:
            twin.begin()  # the twin's first pass is the rest of the live pass under way
        elif self.live.iterator is not None:
            twin.iterator, twin.stopped = iter(()), True  # the live iterator saw its end: nothing more from it
        self.twin = twin

    @invariant()
    def reports_agree(self) -> None:
        if self.twin is not None:
            assert reports(self.twin.stream) == reports(self.live.stream), self.log


TestBareStreamTwins = BareStreamTwins.TestCase
TestBareStreamTwins.settings = settings(max_examples=scaled_examples(250), stateful_step_count=25, deadline=None)


# -- the two cases of the issue, and the refusal


def test_a_pass_drawn_to_its_last_record_before_the_loop_saw_the_end_restores_as_live() -> None:
    """1 record, batches of 2: the loop took the one record and has not seen the end."""
    live = make_stream([1], batch_size=2)
    iterator = iter(live)
    record = next(iterator)
    state = live.state_dict(consumed_batches=1)
    assert state == live.state_dict() and (state["epoch"], state["position"]) == (0, 1)
    twin = make_stream([1], batch_size=2)
    twin.load_state_dict(state)
    assert [reports(twin)] == [reports(live)] and live.epoch == 0
    rest = iter(twin)
    assert [next(iterator, "end"), next(rest, "end")] == ["end", "end"]
    assert (live.epoch, twin.epoch) == (1, 1) and list(live) == list(twin) == [record]  # then epoch 1


def test_a_count_once_a_batching_helper_saw_the_pass_end_is_refused_and_state_dict_is_the_next_epoch() -> None:
    """1 record, batches of 2 taken with islice: islice asked past the record, so the stream moved on to epoch
    1 while the loop holds its batch; a count would resume inside epoch 0 (a restored stream saying epoch 0)."""
    live = make_stream([1], batch_size=2)
    iterator = iter(live)
    assert list(islice(iterator, 2)) == [("shard-000", 0)] and live.epoch == 1
    with pytest.raises(ValueError, match=r"consumed_batches=1: this pass of epoch 0 is iterated directly and has "
                                         r"ended .* call state_dict\(\), which saves that epoch's start"):  # fmt: skip
        live.state_dict(consumed_batches=1)
    twin = make_stream([1], batch_size=2)
    twin.load_state_dict(live.state_dict())
    assert reports(twin) == reports(live) and (twin.epoch, twin.position) == (1, 0)
    assert list(islice(iterator, 2)) == [] and list(live) == list(twin)


def test_a_state_taken_between_iter_and_the_first_record_describes_the_pass_begun() -> None:
    live = make_stream([4, 5], batch_size=2)
    list(live)
    iterator = iter(live)
    assert live.state_dict(consumed_batches=0) == live.state_dict()
    assert (live.state_dict()["epoch"], live.state_dict()["position"]) == (1, 0)
    twin = make_stream([4, 5], batch_size=2)
    twin.load_state_dict(live.state_dict(consumed_batches=0))
    epoch_1 = make_stream([4, 5], batch_size=2)
    epoch_1.set_epoch(1)
    assert list(iterator) == list(twin) == list(epoch_1)


@pytest.mark.parametrize(("records", "batches"), [(0, 1), (1, 1), (3, 2)])
def test_a_count_of_more_records_than_the_pass_handed_out_is_refused(records: int, batches: int) -> None:
    live = make_stream([6], batch_size=2)
    iterator = iter(live)
    for _ in range(records):
        next(iterator)
    with pytest.raises(ValueError, match=rf"consumed_batches={batches} counts {2 * batches} records of this pass "
                                         rf"of epoch 0, but it is iterated directly and has handed out {records}"):  # fmt: skip
        live.state_dict(consumed_batches=batches)
    assert live.state_dict(consumed_batches=records // 2)["position"] == records // 2 * 2  # what the loop took
