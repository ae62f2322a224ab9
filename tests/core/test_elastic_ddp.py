"""Elastic resume under real DDP: a state saved by 4 ranks resumes on 3 gloo processes (the case
that once gave per-rank step counts [4, 5, 5] and hung every rank in all_reduce)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stateful_sampler import StatefulSampler
from tests.helpers import run_ranks

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("elastic_ddp_run.py")


def test_a_state_saved_on_4_ranks_resumes_on_3_processes_with_equal_steps_and_every_record_once(
    tmp_path: Path,
) -> None:
    before = [StatefulSampler(100, seed=11, batch_size=5, num_replicas=4, rank=r) for r in range(4)]
    consumed = [list(sampler)[:10] for sampler in before]  # 2 batches of 5 on each rank
    state = tmp_path / "state.json"
    state.write_text(json.dumps(before[0].state_dict(consumed_batches=2)))
    run_ranks([sys.executable, str(SCRIPT), str(tmp_path), "elastic", str(state)], 3, SCRIPT.parents[2], timeout=180)
    runs = [json.loads((tmp_path / f"elastic_rank{r}.json").read_text()) for r in range(3)]
    assert [len(run) for run in runs] == [4, 4, 4]  # 60 records left: 20 a rank, 4 batches of 5
    real = [i for run in runs for step in run for i, pad in zip(step["ids"], step["padding"]) if not pad]
    padding = sum(pad for run in runs for step in run for pad in step["padding"])
    assert padding == 0
    assert sorted(real + [i for rank in consumed for i in rank]) == list(range(100))
