"""PackedStream: rows of a ShardedStream's records, exact at any stop, elastic at another world size and batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import PackedStream, ShardedStream, ShardReadError

COUNTS = [7, 5, 0, 9, 4, 6]  # 31 records
ROOT = Path(__file__).resolve().parents[2]


class TokenShards:
    """Shard i holds records of global index g with 1 + 7g mod 11 tokens ``g*1000 + t``: every token of the
    stream is distinct, so a multiset of tokens says which were delivered how often."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = list(counts)
        self.offsets = np.concatenate(([0], np.cumsum(self.counts))).tolist()

    def count(self, shard: str) -> int:
        return self.counts[int(shard)]

    def identity(self, shard: str) -> str:
        return f"v1-{shard}-{self.counts[int(shard)]}"

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        first = self.offsets[int(shard)]
        return [{"input_ids": tokens(first + row)} for row in range(start, stop)]


def tokens(record: int) -> list[int]:
    return [record * 1000 + t for t in range(1 + record * 7 % 11)]


def make_stream(counts: Sequence[int] = COUNTS, **kwargs: Any) -> ShardedStream:
    return ShardedStream([str(i) for i in range(len(counts))], TokenShards(counts), batch_size=3, window=2, seed=5,
                         **kwargs)  # fmt: skip


def packed(world: int = 1, rank: int = 0, batch: int = 2, **kwargs: Any) -> PackedStream:
    kwargs.setdefault("window", 8)
    return PackedStream(make_stream(), 16, batch_size=batch, num_replicas=world, rank=rank, **kwargs)


def row_tokens(rows: PackedStream, plan: Any) -> list[int]:
    return [tokens(record)[start] + offset for record, start, stop in plan for offset in range(stop - start)]


def real_tokens(rows: PackedStream, plans: Sequence[Any]) -> Counter[int]:
    """Tokens of the plans that are not padding."""
    return Counter(token for plan in plans if not plan.is_padding for token in row_tokens(rows, plan))


ALL_TOKENS = Counter(token for record in range(sum(COUNTS)) for token in tokens(record))


def test_rows_are_the_stream_s_epoch_order_cut_every_seq_len() -> None:
    stream = make_stream()
    stream.set_epoch(1)
    order = [token for record in stream for token in record["input_ids"]]
    rows = packed()
    rows.set_epoch(1)
    plans = list(rows)
    assert [token for plan in plans for token in row_tokens(rows, plan)] == order
    assert [len(row_tokens(rows, plan)) for plan in plans] == [16] * 11 + [len(order) - 176]


def test_whole_records_fit_rows_and_each_record_is_in_one_row() -> None:
    rows = packed(split_records=False)
    plans = list(rows)
    assert all(start == 0 and stop == len(tokens(record)) for plan in plans for record, start, stop in plan)
    assert all(sum(stop for _, _, stop in plan) <= 16 for plan in plans)
    assert sorted(record for plan in plans for record, _, _ in plan) == list(range(sum(COUNTS)))


def test_loader_gives_packed_dataset_batches() -> None:
    rows = packed()
    batch = next(iter(rows.loader()))
    assert batch["input_ids"].shape == (2, 16)
    first = list(rows.plan(0, 0))
    assert batch["input_ids"][0].tolist() == row_tokens(rows, first)
    assert batch["cu_seqlens"].tolist()[:2] == [0, first[0][2] - first[0][1]]
    assert batch["labels"][0, 0].item() == -100 and batch["position_ids"][0, 0].item() == 0


@settings(max_examples=30, deadline=None)
@given(
    split=st.booleans(),
    stops=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    world=st.integers(1, 3),
    epoch=st.integers(0, 2),
)
def test_twin_restored_from_state_dict_goes_on_as_the_live_one(
    split: bool, stops: list[int], world: int, epoch: int
) -> None:
    assert_twin_goes_on_as_the_live_one(lambda: packed(world, world - 1, split_records=split), stops, epoch)


def assert_twin_goes_on_as_the_live_one(build: Callable[[], PackedStream], stops: list[int], epoch: int) -> None:
    """The twin property: after each of ``stops`` more rows of ``build()``'s epoch ``epoch``, a twin restored from
    the live one's state has its state, epoch and lengths, and yields the rest of the uninterrupted rows."""
    live = build()
    live.set_epoch(epoch)
    iterator = iter(live)
    taken, ended = 0, False
    for stop in stops:
        for _ in range(stop):
            if next(iterator, None) is None:
                ended = True  # the pass is over: the live sampler moved on to the next epoch's start
            else:
                taken += 1
        twin = build()
        twin.load_state_dict(live.state_dict())
        assert twin.state_dict() == live.state_dict()
        assert (twin.epoch, len(twin), twin.remaining_length()) == (live.epoch, len(live), live.remaining_length())
        mirror = build()
        mirror.set_epoch(epoch + 1 if ended else epoch)
        assert [list(plan) for plan in twin] == [list(plan) for plan in list(mirror)[0 if ended else taken :]]


def assert_exact_resume_at_every_step(build: Callable[..., PackedStream], split: bool) -> None:
    """``build(world, rank, batch, split_records=)``'s rows, saved after every step of the epoch and resumed, are
    the uninterrupted run's (one rank, 2 rows a batch). Shared with the packed mixed stream's tests."""
    uninterrupted = [list(plan) for plan in build(batch=2, split_records=split)]
    for step in range(len(uninterrupted) // 2 + 1):
        live = build(batch=2, split_records=split)
        seen = [list(plan) for plan in islice(live, 2 * step)]
        resumed = build(batch=2, split_records=split)
        resumed.load_state_dict(live.state_dict(consumed_batches=step))
        assert seen + [list(plan) for plan in resumed] == uninterrupted


def rank_plans(
    build: Callable[..., PackedStream], world: int, batch: int, batches: int | None, state: dict[str, Any] | None,
    split: bool,
) -> list[list[Any]]:  # fmt: skip
    """Each rank's plans of ``batches`` batches (None: to the end of the epoch) of ``build``'s rows, ranks simulated
    in one process, resumed from ``state`` if given."""
    plans = []
    for rank in range(world):
        rows = build(world, rank, batch, split_records=split)
        if state is not None:
            rows.load_state_dict(state)
        plans.append(list(rows if batches is None else islice(rows, batches * batch)))
    return plans


@pytest.mark.parametrize("split", [True, False])
def test_exact_resume_at_every_step(split: bool) -> None:
    assert_exact_resume_at_every_step(packed, split)


def any_resize() -> st.SearchStrategy[tuple[bool, int, int, int, int]]:
    """(split, world, batch, resumed world, resumed batch): any topology before and after, 1-5 ranks, 1-3 rows."""
    return st.tuples(st.booleans(), st.integers(1, 5), st.integers(1, 3), st.integers(1, 5), st.integers(1, 3))


RESIZES = [(4, 1, 3, 1), (3, 1, 4, 1), (2, 2, 2, 1)]  # (world, batch) before and after: W 4->3, 3->4, half batch


def resized_plans(
    build: Callable[..., PackedStream], split: bool, world: int, batch: int, resumed_world: int, resumed_batch: int,
    stop: int = 2, stop_in: st.DataObject | None = None,
) -> tuple[list[list[Any]], list[list[Any]], PackedStream]:  # fmt: skip
    """Every rank's plans of ``stop`` steps at (``world``, ``batch``), then every rank's to the epoch's end resumed
    at (``resumed_world``, ``resumed_batch``) from rank 0's state, and the saving rank; the resumed ranks' steps equal.
    ``stop_in``: draw ``stop`` there, from 0 to the epoch's steps."""
    if stop_in is not None:
        steps = -(-build(world, 0, batch, split_records=split).remaining_length() // batch)
        stop = stop_in.draw(st.integers(0, steps), label="stop")
    before = rank_plans(build, world, batch, stop, None, split)
    saver = build(world, 0, batch, split_records=split)
    list(islice(saver, stop * batch))
    state = saver.state_dict(consumed_batches=stop)
    after = rank_plans(build, resumed_world, resumed_batch, None, state, split)
    assert len({len(plans) for plans in after}) == 1  # equal steps on every rank
    return before, after, saver


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("world", "batch", "resumed_world", "resumed_batch"), RESIZES)
def test_elastic_resume_delivers_every_unconsumed_token_once(
    split: bool, world: int, batch: int, resumed_world: int, resumed_batch: int
) -> None:
    before, after, saver = resized_plans(packed, split, world, batch, resumed_world, resumed_batch)
    delivered = sum((real_tokens(saver, plans) for plans in before + after), Counter())
    assert delivered == ALL_TOKENS  # every token exactly once: nothing lost, nothing twice
    padding = [plan for plans in after for plan in plans if plan.is_padding]
    assert all(plan.key.is_padding for plan in padding)


def test_resumable_loader_with_two_workers_resumes_at_zero() -> None:
    def batches(loader: Any) -> list[list[int]]:
        return [batch["input_ids"].reshape(-1).tolist() for batch in loader]

    uninterrupted = batches(ResumableLoader(packed(batch=2).loader(num_workers=0)))
    loader = ResumableLoader(packed(batch=2).loader(num_workers=2))
    first = [batch["input_ids"].reshape(-1).tolist() for batch in islice(loader, 3)]
    state = loader.state_dict()
    resumed = ResumableLoader(packed(batch=2).loader(num_workers=0))
    resumed.load_state_dict(state)
    assert first + batches(resumed) == uninterrupted
    assert len(uninterrupted) == 6


def test_a_stream_with_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="stream: a PackedStream deals its rows to the ranks"):
        PackedStream(make_stream(num_replicas=2, rank=0), 16)


def test_a_stream_with_a_transform_is_refused() -> None:
    with pytest.raises(ValueError, match="stream: its transform"):
        PackedStream(make_stream(transform=torch.tensor), 16)


def test_a_state_of_another_stream_is_refused_naming_the_shard() -> None:
    state = packed().state_dict()
    other = PackedStream(make_stream([7, 5, 0, 9, 4, 5]), 16, batch_size=2, num_replicas=1, rank=0, window=8)
    with pytest.raises(IncompatibleStateError, match=r"shards\[5\]"):
        other.load_state_dict(state)


def test_a_state_without_the_stream_field_is_refused() -> None:
    state = packed().state_dict()
    del state["stream"]
    with pytest.raises(IncompatibleStateError, match="'stream'"):
        packed().load_state_dict(state)


def test_a_state_of_another_seq_len_is_refused_naming_it() -> None:
    state = packed().state_dict()
    with pytest.raises(IncompatibleStateError, match="seq_len"):
        PackedStream(make_stream(), 8, batch_size=2, num_replicas=1, rank=0, window=8).load_state_dict(state)


def test_a_record_longer_than_seq_len_is_refused_or_truncated_when_whole() -> None:
    with pytest.raises(ValueError, match="truncate=True"):
        PackedStream(make_stream(), 8, split_records=False, num_replicas=1, rank=0)
    rows = PackedStream(make_stream(), 8, split_records=False, truncate=True, num_replicas=1, rank=0)
    assert max(stop for plan in rows for _, _, stop in plan) == 8


def test_loader_refuses_a_contradicting_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size=3 contradicts"):
        packed(batch=2).loader(batch_size=3)


def _run_packed(shards: Path, root: Path, workers: int, kill_after: int | None = None, whole: bool = False) -> int:
    command = [sys.executable, "-m", "tests.stream.packed_stream_kill_run", str(shards), str(root)]
    command += ["--workers", str(workers)] + ([] if kill_after is None else ["--kill-after", str(kill_after)])
    command += ["--whole"] if whole else []
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, env=environment, timeout=300, capture_output=True, check=False).returncode


def _recorded(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / "record.jsonl").read_text().splitlines()]


# Split rows: 132 tokens an epoch are 9 rows of 16, 5 batches of 2, killed in epoch 1 at batch 2 of 5. Whole records
# (best fit in windows of 8) fill 11 rows in epoch 0 and 9 in epoch 1 (6 and 5 batches), killed at batch 2 of 5 too.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("whole", "epochs", "kill_after"), [(False, [5, 5], 7), (True, [6, 5], 8)], ids=["split", "whole"]
)
def test_a_packed_parquet_stream_killed_with_two_workers_resumes_exactly_at_zero(
    tmp_path: Path, whole: bool, epochs: list[int], kill_after: int
) -> None:
    pytest.importorskip("pyarrow")
    from tests.stream.packed_stream_kill_run import train

    shards, uninterrupted, cut = tmp_path / "shards", tmp_path / "whole", tmp_path / "cut"
    uninterrupted.mkdir(), cut.mkdir()
    train(shards, uninterrupted, workers=0, whole=whole)  # uninterrupted, in this process
    expected = _recorded(uninterrupted)
    assert [sum(1 for batch in expected if batch["epoch"] == epoch) for epoch in (0, 1)] == epochs
    assert _run_packed(shards, cut, workers=2, kill_after=kill_after, whole=whole) == -9
    assert len(_recorded(cut)) == kill_after
    assert _run_packed(shards, cut, workers=0, whole=whole) == 0
    assert _recorded(cut) == expected


def test_parquet_lengths_are_read_from_the_token_column_alone(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from stateful_sampler.stream import ParquetReader
    from tests.stream.packed_stream_kill_run import write_shards

    names = write_shards(tmp_path)
    reader = ParquetReader()
    assert reader.lengths(names[1], "input_ids").tolist() == [len(tokens(g)) for g in range(6, 10)]
    with pytest.raises(ShardReadError, match="could not read column 'ids'"):
        reader.lengths(names[1], "ids")
    rows = PackedStream(ShardedStream(names, reader, batch_size=3, window=2, seed=3), 16, num_replicas=1, rank=0)
    batch = next(iter(rows.loader(batch_size=9)))
    assert sorted(batch["input_ids"].reshape(-1).tolist()[:132]) == sorted(t for g in range(22) for t in tokens(g))


class CountingShards(TokenShards):
    def __init__(self, counts: Sequence[int]) -> None:
        super().__init__(counts)
        self.read_shards: list[str] = []

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        self.read_shards.append(shard)
        return super().read(shard, start, stop)


def test_a_lengths_cache_plans_the_rows_of_a_restart_without_reading_a_shard(tmp_path: Path) -> None:
    def build(reader: CountingShards) -> PackedStream:
        stream = ShardedStream([str(i) for i in range(len(COUNTS))], reader, batch_size=3, window=2, seed=5)
        return PackedStream(stream, 16, num_replicas=1, rank=0, window=8, lengths_cache=tmp_path)

    first, second = CountingShards(COUNTS), CountingShards(COUNTS)
    plans = [list(plan) for plan in build(first)]
    assert sorted(first.read_shards) == [str(i) for i in range(len(COUNTS))]
    restarted = build(second)
    assert second.read_shards == []
    assert [list(plan) for plan in restarted] == plans == [list(plan) for plan in packed()]
    assert len(list(tmp_path.glob("*.npy"))) == len(COUNTS) and not list(tmp_path.glob("*.tmp*"))


def test_padding_rows_even_out_the_ranks_and_teach_nothing() -> None:
    rows_in_epoch = packed().rows_in_epoch()
    assert rows_in_epoch == 12
    last_rank = packed(world=5, rank=4, batch=3)  # 12 rows on 5 ranks: 3 steps each, 3 marked repeats
    batches = list(last_rank.loader())
    assert [batch["is_padding"].tolist() for batch in batches] == [[False, False, True]]
    assert (batches[0]["labels"][2] == -100).all() and not (batches[0]["labels"][0] == -100).all()
    assert {len(list(packed(world=5, rank=rank, batch=3))) for rank in range(5)} == {3}


@settings(max_examples=25, deadline=None)
@given(resize=any_resize(), data=st.data())
def test_any_resize_delivers_every_unconsumed_token_once_with_equal_steps(
    resize: tuple[bool, int, int, int, int], data: st.DataObject
) -> None:
    before, after, saver = resized_plans(packed, *resize, stop_in=data)
    assert sum((real_tokens(saver, plans) for plans in before + after), Counter()) == ALL_TOKENS


def test_a_missing_token_field_and_an_empty_record_are_refused() -> None:
    with pytest.raises(KeyError, match="tokens='ids': a record of shard '0' has no such field"):
        PackedStream(make_stream(), 16, tokens="ids")

    class WithAnEmptyRecord(TokenShards):
        def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
            records = super().read(shard, start, stop)
            return [{"input_ids": []} if shard == "1" and start + at == 2 else r for at, r in enumerate(records)]

    stream = ShardedStream([str(i) for i in range(len(COUNTS))], WithAnEmptyRecord(COUNTS), batch_size=3)
    with pytest.raises(ValueError, match="record 2 of shard '1' has 0 tokens in 'input_ids'"):
        PackedStream(stream, 16)
