"""Twin test of ``ResumableLoader`` over a ``ShardedStream`` (issue 18 on issue 17's loader): the
machine of tests/core/test_twin_loader.py, every way a loop is written (counted ``next()``, ``break``, a
loop to ``StopIteration``, ``zip(range(len(loader)), loader)``, ``set_epoch`` after any of them or
forgotten, two interleaved iterators, saves anywhere), with a stream in the place of the sampler.
A live loader per rank and a twin restored from its states must yield the same batches and report
the same ``len``, ``epoch`` and ``state_dict``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from stateful_sampler import ResumableLoader
from tests.core.test_twin_loader import ResumableTwins
from tests.stream_helpers import make_stream
from tests.twin_helpers import worker_variant

EXAMPLES = int(os.environ.get("TWIN_STREAM_LOADER_EXAMPLES", "150"))  # without workers
WORKER_EXAMPLES = int(os.environ.get("TWIN_STREAM_LOADER_WORKER_EXAMPLES", "25"))  # each pass starts 2 processes


def record_id(record: tuple[str, int]) -> int:
    """(shard-007, 3) -> 703: records collate into tensors the machine compares."""
    name, row = record
    return int(name.rsplit("-", 1)[1]) * 100 + row


@dataclass(frozen=True)
class StreamConfig:
    counts: tuple[int, ...]
    batch_size: int
    window: int
    tail: str
    world_size: int


class ResumableStreamTwins(ResumableTwins):
    @initialize(
        counts=st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda counts: sum(counts) > 0),
        batch_size=st.integers(1, 3),
        window=st.integers(1, 3),
        tail=st.sampled_from(["pad", "drop"]),
        world_size=st.integers(1, 2),
    )
    def build(self, counts: list[int], batch_size: int, window: int, tail: str, world_size: int) -> None:
        world_size = min(world_size, self.max_world)
        if tail == "drop" and sum(counts) < world_size:
            tail = "pad"  # drop would leave no record: refused (tests/stream/test_stream_passes.py), not a twin case
        self.config = StreamConfig(tuple(counts), batch_size, window, tail, world_size)  # type: ignore[assignment]
        self.live = [self.make(self.config, rank) for rank in range(world_size)]  # type: ignore[arg-type]
        self.twin = None
        self.slots = []
        self.fresh = False
        self.serial = 0
        self.log = []

    def make(self, config: StreamConfig, rank: int) -> ResumableLoader:  # type: ignore[override]
        stream = make_stream(config.counts, batch_size=config.batch_size, window=config.window, seed=4,
                             tail=config.tail, num_replicas=config.world_size, rank=rank, transform=record_id)  # fmt: skip
        return ResumableLoader(stream.loader(num_workers=self.workers), rng_states=False)


VARIANTS = {
    workers: worker_variant(ResumableStreamTwins, workers, EXAMPLES, WORKER_EXAMPLES, max_world=2) for workers in (0, 2)
}


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_restored_resumable_loader_over_a_stream_behaves_as_the_live_one_for_every_later_call(workers: int) -> None:
    VARIANTS[workers].TestCase().runTest()
