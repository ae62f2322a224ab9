"""A ``ShardedStream`` through ``ResumableLoader(stream.loader())`` is certified: each step's global sample keys
(shards concatenated in the order given), merged over the ranks, and a resume supersedes the lost steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import ResumableLoader
from stateful_sampler.certificate import compare, read_run
from stateful_sampler.certificate.plugin import hooked
from stateful_sampler.certificate.writer import CertificateWriter
from stateful_sampler.stream import ShardedStream
from tests.stream_helpers import Rows

COUNTS = [5, 7, 6, 4, 8]
OFFSETS = np.concatenate(([0], np.cumsum(COUNTS)[:-1])).tolist()
EPOCHS = 2


def global_index(record: int) -> int:
    return int(OFFSETS[record // 100]) + record % 100


def rank_process(prefix: Path, rank: int, world_size: int, state: dict[str, Any] | None = None,
                 save_at: int = 0, stop_at: int = 0) -> tuple[list[list[int]], dict[str, Any] | None]:  # fmt: skip
    """One rank's process: its batches as global indices, and the state saved after ``save_at`` steps."""
    stream = ShardedStream([str(i) for i in range(len(COUNTS))], Rows(COUNTS), batch_size=3, window=2, seed=4,
                           num_replicas=world_size, rank=rank)  # fmt: skip
    loader = ResumableLoader(stream.loader())
    remove = hooked(CertificateWriter(prefix))
    trained: list[list[int]] = []
    saved = None
    try:
        if state is not None:
            loader.load_state_dict(state)
        while loader.epoch < EPOCHS and not (stop_at and len(trained) >= stop_at):
            for batch in loader:
                trained.append([global_index(record) for record in batch.tolist()])
                if len(trained) == save_at:
                    saved = loader.state_dict()
                if stop_at and len(trained) >= stop_at:
                    break  # the process dies here: its steps after the save are lost with it
    finally:
        remove()
    return trained, saved


def interleaved(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Global steps: rank r's i-th key sits at global position before + i*W + r."""
    return [[batch[i] for i in range(len(batches[0])) for batch in batches] for batches in zip(*per_rank)]


def test_each_step_holds_the_global_keys_the_ranks_trained_on(tmp_path: Path) -> None:
    prefix = tmp_path / "stream.cert"
    per_rank = [rank_process(prefix, rank, 2)[0] for rank in range(2)]
    run = read_run(prefix)
    assert [step.records() for step in run.steps] == interleaved(per_rank)
    assert len(run.steps) == 2 * 5  # 30 records on 2 ranks in batches of 3, 2 epochs
    assert run.identity["seed"] == 4 and "order" in run.identity


@settings(max_examples=8, deadline=None)
@given(save_at=st.integers(1, 9), lost=st.integers(0, 3))
def test_a_resumed_stream_certifies_the_uninterrupted_data(tmp_path_factory: Any, save_at: int, lost: int) -> None:
    folder = tmp_path_factory.mktemp("stream")
    plain, resumed = folder / "plain.cert", folder / "resumed.cert"
    expected = [rank_process(plain, rank, 2)[0] for rank in range(2)]
    for rank in range(2):
        before, state = rank_process(resumed, rank, 2, save_at=save_at, stop_at=save_at + lost)
        after, _ = rank_process(resumed, rank, 2, state=state)
        assert before[:save_at] + after == expected[rank]
    run = read_run(resumed)
    assert [step.records() for step in run.steps] == interleaved(expected)
    comparison = compare(read_run(plain), run)
    assert (comparison.code, comparison.rule) == (0, "step by step"), comparison.report()
