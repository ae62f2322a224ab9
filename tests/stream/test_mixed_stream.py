"""``MixedStream``: two map-style corpora and streamed sources mixed at weights, exact at any stop and elastic.

Records are ints unique across sources (``Tagged`` streams: base + 100*shard + row; map-style: 5000+i), so a
batch says which source and record it holds. Ranks are simulated in one process (``num_replicas``/``rank``), and
a rank's loop is ``loop_batches`` (a DataLoader's delivery order) unless a real DataLoader is the point.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.stream import MixedStream, ShardedStream
from tests.helpers import scaled_examples
from tests.stream.test_stream_twin import StreamTwins, _Side
from tests.stream_helpers import loop_batches

COUNTS_A, COUNTS_B = [7, 5, 0, 9], [4, 6, 3]  # 21 and 13 records
MAP_SIZE = 11


class Tagged:
    """Shard i of a source at ``base`` holds records base + 100*i + row; every read is logged."""

    def __init__(self, base: int, counts: list[int]) -> None:
        self.base, self.counts = base, list(counts)
        self.reads: list[tuple[str, int, int]] = []

    def count(self, shard: str) -> int:
        return self.counts[int(shard)]

    def read(self, shard: str, start: int, stop: int) -> list[int]:
        self.reads.append((shard, start, stop))
        return [self.base + 100 * int(shard) + row for row in range(start, stop)]


def source(base: int, counts: list[int], **kwargs: Any) -> ShardedStream:
    options = {"batch_size": 1, "window": 2, "seed": base, **kwargs}
    return ShardedStream([str(i) for i in range(len(counts))], Tagged(base, counts), **options)


def sources(appended: bool = False) -> list[Any]:
    found: list[Any] = [list(range(5000, 5000 + MAP_SIZE)), source(10_000, COUNTS_A), source(20_000, COUNTS_B)]
    if appended:
        found.append(source(30_000, [8, 8]))
    return found


def mixed(weights: Any = (2, 1, 1), **kwargs: Any) -> MixedStream:
    options: dict[str, Any] = {"batch_size": 3, "num_samples": 40, "seed": 7, **kwargs}
    appended = len(weights) == 4
    return MixedStream(sources(appended), list(weights), **options)


def own_orders(stream: MixedStream, index: int, epochs: int = 6) -> list[int]:
    """Source ``index``'s records in its own order, source-epoch after source-epoch."""
    found = stream.sources[index]
    if not isinstance(found, ShardedStream):
        return []
    order: list[int] = []
    for epoch in range(epochs):
        found.set_epoch(epoch)
        order += list(found)
    return order


def ranks(world: int, **kwargs: Any) -> list[MixedStream]:
    return [mixed(num_replicas=world, rank=rank, yield_keys=True, **kwargs) for rank in range(world)]


def keyed_loop(stream: MixedStream, workers: int = 2) -> list[list[tuple[int, int, bool]]]:
    """(record, position, is_padding) of each batch a rank's loop takes."""
    return [
        [(record, key.position, key.is_padding) for record, key in batch] for batch in loop_batches(stream, workers)
    ]


# -- the order


def test_each_source_walks_its_own_order_at_the_mixture_s_counts() -> None:
    stream = mixed(num_samples=97)
    drawn = [record for record in stream]
    sizes = [MAP_SIZE, sum(COUNTS_A), sum(COUNTS_B)]
    expected, _ = Mixture(sizes, [2, 1, 1], num_samples=97).locate(0, np.arange(97))
    bases = [5000, 10_000, 20_000]
    assert [max(i for i, base in enumerate(bases) if record >= base) for record in drawn] == expected.tolist()
    for index, base in ((1, 10_000), (2, 20_000)):
        mine = [record for record in drawn if base <= record < base + 10_000]
        assert mine == own_orders(stream, index)[: len(mine)]  # source-epochs follow each other, reshuffled
    corpus = [record for record in drawn if record < 10_000]  # the map-style source: a permutation per source-epoch
    assert sorted(corpus[:MAP_SIZE]) == sorted(corpus[MAP_SIZE : 2 * MAP_SIZE]) == list(range(5000, 5000 + MAP_SIZE))
    assert corpus[:MAP_SIZE] != corpus[MAP_SIZE : 2 * MAP_SIZE]


def pieces_drawn(stream: MixedStream, index: int, draws: int) -> list[tuple[str, int, int]]:
    """(shard, start, stop) of each window piece that holds one of source ``index``'s first ``draws`` draws, once
    per source-epoch and window: what one stream's reader reads for those records."""
    found = stream.sources[index]
    pieces = set()
    for source_epoch in range(-(-draws // found.epoch_size)):
        inside = np.arange(source_epoch * found.epoch_size, min(draws, (source_epoch + 1) * found.epoch_size))
        windows = found.order.epoch(source_epoch)
        shards, rows = windows.locate(inside - source_epoch * found.epoch_size)
        starts, stops = found.order.piece_bounds(shards, rows)
        pieces |= set(zip([source_epoch] * len(inside), shards.tolist(), starts.tolist(), stops.tolist()))
    return sorted((str(shard), start, stop) for _, shard, start, stop in pieces)


def test_each_source_piece_is_read_once_a_pass_as_one_stream_reads_it() -> None:
    stream = mixed(num_samples=120)
    list(stream)
    drawn, _ = Mixture([MAP_SIZE, sum(COUNTS_A), sum(COUNTS_B)], [2, 1, 1], num_samples=120).locate(0, np.arange(120))
    for index in (1, 2):
        found = stream.sources[index]
        reads = found.reader.reads
        draws = int(np.sum(drawn == index))  # 30: 120 draws at weight 1/4, over its source-epochs
        assert draws == 30
        assert sorted(reads) == pieces_drawn(stream, index, draws)  # each piece its draws fall in, once
        epochs = -(-draws // found.epoch_size)
        assert sum(stop - start for _, start, stop in reads) <= found.epoch_size * epochs  # no shard read whole
        assert found.spread == 8 and all(stop - start < found.counts[int(shard)] for shard, start, stop in reads)


class RowsTagged(Tagged):
    """``Tagged`` that also reads records at given rows on their own (as ``ParquetReader.read_rows`` does)."""

    def read_rows(self, shard: str, rows: Any) -> list[int]:
        self.reads.append((shard, -1, len(rows)))
        return [self.base + 100 * int(shard) + row for row in np.asarray(rows).tolist()]


def test_a_resumed_pass_reads_its_first_batch_s_rows_alone_then_the_pieces() -> None:
    many = [ShardedStream(["0", "1", "2"], RowsTagged(1000 * i, [20, 20, 20]), batch_size=1, window=1, seed=i)
            for i in range(10)]  # fmt: skip
    live = MixedStream(many, [1] * 10, batch_size=4, num_samples=300)
    whole = list(live)
    state = live.state_at(0, 101)
    for found in many:
        found.reader.reads.clear()
    resumed = MixedStream(many, [1] * 10, batch_size=4, num_samples=300)
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    first = [next(iterator) for _ in range(4)]
    assert first == whole[101:105]
    reads = [read for found in many for read in found.reader.reads]
    assert reads and all(start == -1 for _, start, _ in reads)  # read_rows only
    assert sum(count for _, _, count in reads) == 4  # the first batch's 4 rows, nothing else
    assert [next(iterator) for _ in range(8)] == whole[105:113]  # then each source's pieces
    assert any(start >= 0 for found in many for _, start, _ in found.reader.reads)


def test_a_resumed_first_batch_over_source_epochs_keys_transforms_and_a_map_source_is_the_live_one() -> None:
    """Sources of 5 records (a first batch of 24 spans several of each one's source-epochs and draws some shards
    twice), with keys, a source's transform and a map-style source beside them: each shard of each source is read
    once, its rows alone, and the batch equals the uninterrupted run's."""

    def build() -> MixedStream:
        many: list[Any] = [
            ShardedStream(["0", "1"], RowsTagged(1000 * i, [2, 3]), batch_size=1, window=1, seed=i,
                          transform=(lambda record: -record) if i == 1 else None)
            for i in range(3)
        ]  # fmt: skip
        return MixedStream([*many, list(range(5000, 5004))], [3, 2, 1, 2], batch_size=24, num_samples=400,
                           yield_keys=True)  # fmt: skip

    live = build()
    whole = [(record, key.index, key.position) for record, key in live]
    state = live.state_at(0, 133)
    resumed = build()
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    first = [(record, key.index, key.position) for record, key in (next(iterator) for _ in range(24))]
    assert first == whole[133:157]
    assert any(record < 0 for record, _, _ in first)  # source 1's transform ran on the rows read alone
    reads = [(i, shard) for i, found in enumerate(resumed.sources[:3]) for shard, _, _ in found.reader.reads]
    assert sorted(reads) == sorted(set(reads)) and len(reads) <= 6  # each shard of each source read once


# -- exact resume and elastic resume


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_at_the_same_topology_gives_the_uninterrupted_batches_step_by_step(workers: int) -> None:
    full = [keyed_loop(stream, workers) for stream in ranks(2)]
    steps = len(full[0])
    assert all(len(batches) == steps for batches in full) and steps == 7  # 40 draws, 2 ranks of batch 3
    for stop in range(steps + 1):
        states = [stream.state_dict(consumed_batches=stop) for stream in ranks(2)]
        assert all(state == states[0] for state in states)
        resumed = ranks(2)
        for stream in resumed:
            stream.load_state_dict(pickle.loads(pickle.dumps(states[0])))
        assert [keyed_loop(stream, workers) for stream in resumed] == [batches[stop:] for batches in full]


@pytest.mark.parametrize(("world", "batch", "new_world", "new_batch"), [(4, 2, 3, 2), (3, 2, 4, 2), (2, 4, 2, 2)])
@pytest.mark.parametrize("schedule", [None, {(0, 17): [0, 1, 3]}])
def test_an_elastic_resume_delivers_every_unconsumed_draw_once_with_equal_steps(
    world: int, batch: int, new_world: int, new_batch: int, schedule: Any
) -> None:
    uninterrupted = {
        position: record
        for stream in ranks(1, batch_size=1, schedule=schedule)
        for batch_ in keyed_loop(stream)
        for record, position, padding in batch_
        if not padding
    }
    assert sorted(uninterrupted) == list(range(40))
    for stop in (1, 3):
        before = [keyed_loop(stream)[:stop] for stream in ranks(world, batch_size=batch, schedule=schedule)]
        state = ranks(world, batch_size=batch, schedule=schedule)[0].state_dict(consumed_batches=stop)
        after = ranks(new_world, batch_size=new_batch, schedule=schedule)
        for stream in after:
            stream.load_state_dict(state)
        rest = [keyed_loop(stream) for stream in after]
        assert len({len(batches) for batches in rest}) == 1  # equal steps on every rank
        delivered = [item for batches in before + rest for batch_ in batches for item in batch_ if not item[2]]
        assert Counter(position for _, position, _ in delivered) == Counter(range(40))  # every draw exactly once
        assert all(uninterrupted[position] == record for record, position, _ in delivered)
        padding = [item for batches in rest for batch_ in batches for item in batch_ if item[2]]
        assert all(uninterrupted[79 - position] == record for record, position, _ in padding)  # mirrored from the end


def test_a_schedule_change_mid_epoch_keeps_each_source_s_order_and_resumes_exactly() -> None:
    schedule = {(0, 17): [0, 1, 3], (1, 5): [1, 0, 0]}
    stream = mixed(schedule=schedule)
    first, second = list(stream), list(stream)
    assert all(record >= 10_000 for record in first[17:])  # source 0 has weight 0 from (0, 17)
    assert all(record < 10_000 for record in second[5:])
    for index, base in ((1, 10_000), (2, 20_000)):
        mine = [record for record in first + second if base <= record < base + 10_000]
        assert mine == own_orders(stream, index)[: len(mine)]  # each source goes on where it stood
    for stop in (4, 6, 9):
        live = mixed(schedule=schedule)
        state = live.state_dict(consumed_batches=stop)
        twin = mixed(schedule=schedule)
        twin.load_state_dict(state)
        assert list(twin) == first[3 * stop :]


def test_on_change_continue_takes_over_with_a_source_appended_and_a_later_resume_reproduces_it() -> None:
    live = mixed()
    before = [batch for batch in loop_batches(live, 0)]
    state = live.state_dict(consumed_batches=5)
    with pytest.raises(IncompatibleStateError, match="'mixture'.*on_change='continue'") as refused:
        mixed((1, 1, 1, 4)).load_state_dict(state)
    assert refused.value.field == "mixture"
    changed = mixed((1, 1, 1, 4), on_change="continue")
    changed.load_state_dict(state)
    rest = [record for batch in loop_batches(changed, 0) for record in batch]
    assert sum(record >= 30_000 for record in rest) >= len(rest) // 2  # the appended source at 4/7
    taken = [record for batch in before[:5] for record in batch] + rest
    for index, base in ((1, 10_000), (2, 20_000)):  # saved sources go on through their own order
        mine = [record for record in taken if base <= record < base + 10_000]
        assert mine == own_orders(live, index)[: len(mine)]
    later = changed.state_dict(consumed_batches=2)  # a checkpoint after the change
    for on_change in ("continue", "refuse"):  # its own state: no change to accept
        again = mixed((1, 1, 1, 4), on_change=on_change)
        again.load_state_dict(later)
        assert [record for batch in loop_batches(again, 0) for record in batch] == rest[6:]
    assert list(changed) == rest  # iterated directly: the same rest of the epoch
    at_epoch_1 = changed.state_dict()
    second = list(changed)  # the next epoch of the continued mixture
    assert len(second) == 40
    nxt = mixed((1, 1, 1, 4), on_change="continue")
    nxt.load_state_dict(at_epoch_1)
    assert list(nxt) == second


# -- refusals


def test_a_changed_reordered_or_removed_source_and_another_seed_are_refused_naming_them() -> None:
    state = mixed().state_dict(consumed_batches=2)
    resized = MixedStream(
        [list(range(5000, 5000 + MAP_SIZE)), source(10_000, [7, 5, 1, 9]), source(20_000, COUNTS_B)],
        [2, 1, 1], batch_size=3, num_samples=40, seed=7, on_change="continue",
    )  # fmt: skip
    with pytest.raises(IncompatibleStateError, match="source 1 changed") as error:
        resized.load_state_dict(state)
    assert error.value.field == "sources[1]"
    found = sources()
    reordered = MixedStream([found[0], found[2], found[1]], [2, 1, 1], batch_size=3, num_samples=40, seed=7,
                            on_change="continue")  # fmt: skip
    with pytest.raises(IncompatibleStateError) as error:
        reordered.load_state_dict(state)
    assert error.value.field == "sources[1]"
    removed = MixedStream(found[:2], [2, 1], batch_size=3, num_samples=40, seed=7, on_change="continue")
    with pytest.raises(IncompatibleStateError, match="3 sources") as error:
        removed.load_state_dict(state)
    assert error.value.field == "sources"
    for name, stream in (("seed", mixed(seed=8)), ("num_samples", mixed(num_samples=41)), ("tail", mixed(tail="drop"))):
        with pytest.raises(IncompatibleStateError) as error:
            stream.load_state_dict(state)
        assert error.value.field == name
    for field, value in (("version", 2), ("position", -1), ("slot", "x"), ("extra", 1)):
        with pytest.raises(IncompatibleStateError) as error:
            mixed().load_state_dict({**state, field: value})
        assert error.value.field == field
    with pytest.raises(IncompatibleStateError) as error:
        mixed().load_state_dict({**state, "position": 41})
    assert error.value.field == "position"


def test_a_source_with_ranks_or_not_a_dataset_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"streams\[1\] was built with num_replicas=2, rank=0"):
        MixedStream([range(3), source(0, [3], num_replicas=2, rank=0)], [1, 1], batch_size=2)
    with pytest.raises(TypeError, match=r"streams\[0\] must be a ShardedStream or a map-style dataset"):
        MixedStream([iter(range(3))], [1], batch_size=2)
    with pytest.raises(ValueError, match="one entry per source"):
        MixedStream([range(3), range(4)], [1], batch_size=2)


# -- state size and resume cost


def test_the_state_is_small_and_a_resume_does_not_touch_the_sources_data() -> None:
    many = [source(1000 * i, [5, 5]) for i in range(100)]
    stream = MixedStream(many, [1] * 100, batch_size=4)
    state = stream.state_dict(consumed_batches=3)
    assert len(pickle.dumps(state)) < 1200  # 4 characters and one count per source
    reads = sum(len(found.reader.reads) for found in many)
    started = time.perf_counter()
    for _ in range(20):
        stream.load_state_dict(state)
    per_load = (time.perf_counter() - started) / 20
    assert sum(len(found.reader.reads) for found in many) == reads  # nothing read before the first batch
    one = source(0, [5, 5], batch_size=4)
    one_state = one.state_dict()
    started = time.perf_counter()
    for _ in range(20):
        one.load_state_dict(one_state)
    assert per_load < max(20 * (time.perf_counter() - started) / 20, 0.005)  # O(sources) strings, no reads


# -- a real DataLoader through ResumableLoader, and the twin property


def test_resumable_loader_with_2_workers_resumed_at_0_gives_the_uninterrupted_batches() -> None:
    full = [batch.tolist() for batch in ResumableLoader(mixed().loader(num_workers=2))]
    loader = ResumableLoader(mixed().loader(num_workers=2))
    for step, batch in enumerate(loader, 1):
        assert batch.tolist() == full[step - 1]
        if step == 4:
            state = loader.state_dict()
            break
    resumed = ResumableLoader(mixed().loader(num_workers=0))
    resumed.load_state_dict(state)
    assert len(resumed) == len(full) - 4
    assert [batch.tolist() for batch in resumed] == full[4:]


class _MixedSide(_Side):
    def take(self) -> Any:
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.ended = True
            return "end"
        self.consumed += 1
        return batch.tolist()


class MixedTwins(StreamTwins):
    """The stream twin machine (tests/stream/test_stream_twin.py) over a MixedStream of a map-style source and two
    streams, with a schedule change somewhere in the first epochs."""

    @initialize(
        weights=st.lists(st.integers(0, 3), min_size=3, max_size=3).filter(any),
        num_samples=st.integers(1, 30),
        batch_size=st.integers(1, 3),
        world_and_rank=st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 2)]),
        tail=st.sampled_from(["pad", "drop"]),
        change=st.integers(1, 60),
    )
    def build(  # type: ignore[override]
        self, weights: list[int], num_samples: int, batch_size: int, world_and_rank: tuple[int, int], tail: str,
        change: int,
    ) -> None:  # fmt: skip
        world, rank = world_and_rank
        if tail == "drop" and num_samples < world:
            tail = "pad"
        schedule = {divmod(change, num_samples): [1, 1, 1]}

        def stream() -> MixedStream:
            return mixed(weights, num_samples=num_samples, batch_size=batch_size, tail=tail, num_replicas=world,
                         rank=rank, schedule=schedule)  # fmt: skip

        self.make = stream
        self.live = _MixedSide(stream(), self.workers)
        self.twin = None

    @rule()
    def save_and_restore(self) -> None:
        state = self.live.save()
        if self.twin is not None:
            assert self.twin.save() == state
        twin = _MixedSide(self.make(), self.workers)
        twin.stream.load_state_dict(state)
        if not self.live.between_passes:
            twin.begin()
        self.twin = twin


TestMixedTwins = MixedTwins.TestCase
TestMixedTwins.settings = settings(max_examples=scaled_examples(60), stateful_step_count=15, deadline=None)


# -- a real SIGKILL


def run(root: Path, workers: int, kill_after: int | None = None) -> int:
    command = [sys.executable, "-m", "tests.stream.mixed_kill_run", str(root), "--workers", str(workers)]
    if kill_after is not None:
        command += ["--kill-after", str(kill_after)]
    return subprocess.run(command, check=False, cwd=Path(__file__).parents[2], timeout=300).returncode


@pytest.mark.slow
def test_a_mixed_stream_run_killed_mid_epoch_with_2_workers_resumes_at_0_exactly(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    assert run(whole, workers=2) == 0
    assert run(cut, workers=2, kill_after=17) == -9  # epoch 1, batch 4 of 14
    assert run(cut, workers=0) == 0
    assert (cut / "record.jsonl").read_text() == (whole / "record.jsonl").read_text()


def test_epoch_records_are_the_epoch_s_draws_in_order_for_an_order_built_over_the_stream() -> None:
    stream = mixed(num_samples=97)
    whole = list(mixed(num_samples=97))
    assert list(stream.epoch_records(0, 0, 97)) == whole
    assert list(stream.epoch_records(0, 30, 61)) == whole[30:61]
    with pytest.raises(ValueError, match="0 <= start <= stop <= 97"):
        list(stream.epoch_records(0, 5, 98))
