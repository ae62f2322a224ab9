"""Real DDP (2 processes, gloo, CPU): the stream gives every rank equal steps, a run stopped
mid-epoch resumes exactly on 2 ranks (with another worker count), and elastically on 3."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import run_ranks

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("stream_ddp_run.py")
COUNTS = [11, 7, 0, 13, 9, 4, 12]  # 56 records: 28 a rank on 2 ranks, batches of 5: 6 steps an epoch


def launch(shard_dir: Path, out: Path, name: str, world_size: int, workers: int, stop_after: int = 0,
           state: str = "") -> list[list[dict]]:  # fmt: skip
    args = [sys.executable, str(SCRIPT), str(shard_dir), str(out), name, str(workers), str(stop_after), state]
    run_ranks(args, world_size, SCRIPT.parents[2], timeout=120)  # a rank left waiting in all_reduce fails here
    return [json.loads((out / f"{name}_rank{rank}.json").read_text()) for rank in range(world_size)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[dict]]]:
    shard_dir, out = tmp_path_factory.mktemp("shards"), tmp_path_factory.mktemp("runs")
    first = 0
    for index, count in enumerate(COUNTS):
        pq.write_table(pa.table({"id": np.arange(first, first + count)}), shard_dir / f"part-{index}.parquet")
        first += count
    state = str(out / "stopped_state.json")
    return {
        "full": launch(shard_dir, out, "full", 2, workers=0),
        "stopped": launch(shard_dir, out, "stopped", 2, workers=2, stop_after=8),  # epoch 1, after 2 of 6 steps
        "resumed": launch(shard_dir, out, "resumed", 2, workers=0, state=state),
        "elastic": launch(shard_dir, out, "elastic", 3, workers=0, state=state),
    }


def test_every_rank_takes_equal_steps_and_the_epoch_holds_every_record_once(runs) -> None:
    full = runs["full"]
    assert [len(rank) for rank in full] == [12, 12]
    for epoch in range(2):
        ids = [i for rank in full for step in rank if step["epoch"] == epoch for i in step["ids"]]
        assert sorted(ids) == list(range(sum(COUNTS)))


def test_a_stopped_ddp_run_resumes_exactly_with_another_worker_count(runs) -> None:
    for rank in range(2):
        assert runs["stopped"][rank] + runs["resumed"][rank] == runs["full"][rank]


def test_a_ddp_run_resumes_on_three_ranks_with_the_rest_of_the_epoch_dealt_evenly(runs) -> None:
    elastic = runs["elastic"]
    assert len({len(rank) for rank in elastic}) == 1
    resumed_epoch = [step for rank in elastic for step in rank if step["epoch"] == 1]
    stopped = [step for rank in runs["stopped"] for step in rank if step["epoch"] == 1]
    positions = Counter(
        position
        for step in stopped + resumed_epoch
        for position, padding in zip(step["positions"], step["padding"])
        if not padding
    )
    assert sorted(positions) == list(range(sum(COUNTS))) and set(positions.values()) == {1}
    full_ids = {p: i for rank in runs["full"] for step in rank if step["epoch"] == 1
                for p, i in zip(step["positions"], step["ids"])}  # fmt: skip
    assert all(full_ids.get(p, i) == i for step in resumed_epoch for p, i in zip(step["positions"], step["ids"]))
