"""Restored equals live, for the stream: a live ``ShardedStream`` behind a real ``DataLoader`` and, after
every save, a twin restored from the state; every later call goes to both and they must agree.

The twin restored mid-pass stands for the live pass under way: it begins its first pass at once, so
the live loop's next batches are the twin's first ones. Saves happen where a loop saves: inside a pass
with the loop's count (also after its last batch, before the loop ends) and between passes without one
(after the loop ended, or before any pass). Calls: ``set_epoch`` (also forgotten), ``iter`` (also a
second one, abandoning the pass), ``next`` (also past the end), ``epoch``, ``len`` between passes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stateful_sampler.stream import ShardedStream
from tests.helpers import scaled_examples
from tests.stream_helpers import make_stream

_END = "end"


class _Side:
    """One stream, its loader, and the pass under way with the batches the loop took from it."""

    def __init__(self, stream: ShardedStream, workers: int) -> None:
        self.stream = stream
        self.loader = stream.loader(num_workers=workers)
        self.iterator: Any = None
        self.consumed = 0
        self.ended = False

    def begin(self) -> None:
        self.iterator, self.consumed, self.ended = iter(self.loader), 0, False

    def take(self) -> Any:
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.ended = True
            return _END
        self.consumed += 1
        names, rows = batch
        return [f"{name}:{int(row)}" for name, row in zip(names, rows)]

    def save(self) -> dict:
        if self.iterator is None or self.ended:
            return self.stream.state_dict()
        return self.stream.state_dict(consumed_batches=self.consumed)

    @property
    def between_passes(self) -> bool:
        return self.iterator is None or self.ended


class StreamTwins(RuleBasedStateMachine):
    workers = 0

    @initialize(
        counts=st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda counts: sum(counts) > 0),
        batch_size=st.integers(1, 3),
        window=st.integers(1, 3),
        world_and_rank=st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 2)]),
        tail=st.sampled_from(["pad", "drop"]),
        spread=st.sampled_from([None, 1, 2]),
    )
    def build(
        self,
        counts: list[int],
        batch_size: int,
        window: int,
        world_and_rank: tuple[int, int],
        tail: str,
        spread: int | None,
    ) -> None:
        world, rank = world_and_rank
        if tail == "drop" and sum(counts) < world:
            tail = "pad"

        def stream() -> ShardedStream:
            return make_stream(counts, batch_size=batch_size, window=window, seed=4, tail=tail, spread=spread,
                               num_replicas=world, rank=rank)  # fmt: skip

        self.make = stream
        self.live = _Side(stream(), self.workers)
        self.twin: _Side | None = None

    def sides(self) -> list[_Side]:
        return [self.live] if self.twin is None else [self.live, self.twin]

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch: int) -> None:
        for side in self.sides():
            goes_on = not side.between_passes and epoch == side.stream.epoch  # the pass under way goes on
            side.stream.set_epoch(epoch)
            if not goes_on:
                side.iterator = None  # set_epoch(another epoch) leaves the pass under way

    @rule()
    def begin_pass(self) -> None:
        for side in self.sides():
            side.begin()

    @precondition(lambda self: not self.live.between_passes)
    @rule(batches=st.integers(1, 3))
    def take(self, batches: int) -> None:
        for _ in range(batches):
            taken = [side.take() for side in self.sides()]
            assert len({repr(batch) for batch in taken}) == 1, taken

    @rule()
    def save_and_restore(self) -> None:
        state = self.live.save()
        if self.twin is not None:
            assert self.twin.save() == state
        twin = _Side(self.make(), self.workers)
        twin.stream.load_state_dict(state)
        if not self.live.between_passes:
            twin.begin()  # the twin's first pass is the rest of the live pass under way
        self.twin = twin

    @invariant()
    def agree(self) -> None:
        if self.twin is None:
            return
        assert self.twin.stream.epoch == self.live.stream.epoch
        if self.live.between_passes and self.twin.between_passes:
            assert len(self.twin.stream) == len(self.live.stream)
            assert self.twin.stream.remaining_length() == self.live.stream.remaining_length()
            assert self.twin.stream.state_dict() == self.live.stream.state_dict()


TestStreamTwinsWithoutWorkers = StreamTwins.TestCase
TestStreamTwinsWithoutWorkers.settings = settings(max_examples=scaled_examples(200), stateful_step_count=20)


class StreamTwinsWithWorkers(StreamTwins):
    workers = 2


TestStreamTwinsWithWorkers = pytest.mark.slow(StreamTwinsWithWorkers.TestCase)
TestStreamTwinsWithWorkers.settings = settings(max_examples=scaled_examples(30), stateful_step_count=15)
