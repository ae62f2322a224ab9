"""Issue 25, item 7: one file written by rank 0 resumes every rank's RNG, under real gloo DDP and a real SIGKILL.

2 processes train a model whose dropout differs per rank (each rank seeds its own stream), through
``ResumableLoader``; every 3 steps every rank takes ``loader.state_dict(every_rank=True)`` and rank 0 writes
the one file. Every rank is killed with SIGKILL after step 8, mid-epoch (the file holds step 6), and a new
run of 2 resumes from that file: steps 1-6 of the killed run plus the resumed run's equal the uninterrupted
run's on every rank, bitwise (loss and outputs as float.hex, record ids, final weights). The same file at world
size 1 resumes the position only: the rest of the epoch, each record once, and a warning that the RNG states
of 2 ranks are not restored. A control takes the 0.2.0 pattern (``state_dict()`` on rank 0 alone): rank 0
restores its RNG, rank 1 warns that the file holds no RNG states for it (0.2.0 gave it rank 0's, silently).
Each kill waits for a file the ranks write after the step and then pause at (no sleep decides the race).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler import StatefulSampler
from tests.helpers import free_port

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("loader_rng_ddp_run.py")
ROOT = SCRIPT.parents[2]


def launch(out: Path, name: str, world_size: int, *flags: str, killed: bool = False) -> list[str]:
    """Run ``world_size`` ranks of the script; each must exit 0, or by SIGKILL when ``killed``."""
    env = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port(),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    command = [sys.executable, str(SCRIPT), str(out), name, *flags]
    ranks = [
        subprocess.Popen(command, env={**env, "RANK": str(rank)}, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for rank in range(world_size)
    ]  # fmt: skip
    try:
        if killed:  # each rank writes NAME_rank<r>.paused after the step, then waits for the kill
            marks = [out / f"{name}_rank{rank}.paused" for rank in range(world_size)]
            deadline = time.monotonic() + 180
            while not all(mark.exists() for mark in marks) and time.monotonic() < deadline:
                assert all(rank.poll() is None for rank in ranks), [rank.communicate()[0][-2000:] for rank in ranks]
                time.sleep(0.05)
            for rank in ranks:
                os.killpg(rank.pid, signal.SIGKILL)
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                os.killpg(rank.pid, signal.SIGKILL)
    expected = -signal.SIGKILL if killed else 0
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == expected, (name, output[-4000:])
    return outputs


def steps(out: Path, name: str, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"{name}_rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    launch(out, "run", 2)
    return out


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run SIGKILLed after step 8; its files hold step 6 (epoch 1, one batch in): last.pt every rank's
    state, last-rank0.pt the 0.2.0 pattern's (rank 0's alone), taken at the same step of the same run."""
    out = tmp_path_factory.mktemp("killed")
    launch(out, "before", 2, "--save-every", "3", "--die-at", "8", killed=True)
    return out


def test_the_one_file_resumes_every_rank_bitwise_after_sigkill(uninterrupted: Path, killed: Path) -> None:
    outputs = launch(killed, "after", 2, "--resume", "last.pt")
    assert not any("WARNING" in output for output in outputs), outputs
    for rank in range(2):
        reference = steps(uninterrupted, "run", rank)
        before, after = steps(killed, "before", rank), steps(killed, "after", rank)
        assert [step["step"] for step in before] == list(range(1, 9)) and after[0]["step"] == 7
        assert before[:6] + after == reference  # record ids, loss and outputs bitwise, step by step
        assert (killed / f"after_rank{rank}.weights").read_text() == (
            uninterrupted / f"run_rank{rank}.weights"
        ).read_text()
    masks = [[step["output"] for step in steps(uninterrupted, "run", rank)] for rank in range(2)]
    assert masks[0] != masks[1]  # the ranks' dropout differs: rank 0's RNG would not do for rank 1


def test_at_another_world_size_the_file_resumes_the_position_only(uninterrupted: Path, killed: Path) -> None:
    outputs = launch(killed, "world1", 1, "--resume", "last.pt")
    assert "RNG states saved at world size 2 are not restored at world size 1" in outputs[0]
    resumed = steps(killed, "world1", 0)
    epoch_1 = StatefulSampler(40, seed=3, num_replicas=1, rank=0)
    epoch_1.set_epoch(1)
    consumed = {i for rank in range(2) for step in steps(uninterrupted, "run", rank)[5:6] for i in step["ids"]}
    assert [step["epoch"] for step in resumed] == [1] * 8  # 32 records left of epoch 1, 4 a step
    assert sorted(i for step in resumed for i in step["ids"]) == sorted(set(range(40)) - consumed)
    assert len(consumed) == 8 and set(epoch_1.indices().tolist()) == set(range(40))


def test_the_0_2_0_pattern_resumes_rank_0_bitwise_and_rank_1_warns_instead_of_taking_rank_0_s_rng(
    uninterrupted: Path, killed: Path
) -> None:
    outputs = launch(killed, "control", 2, "--resume", "last-rank0.pt")
    assert "WARNING" not in outputs[0]
    assert "the state holds no RNG states for rank 1 (ranks saved: 0)" in outputs[1]
    for rank in range(2):
        data = [step["ids"] for step in steps(killed, "before", rank)[:6] + steps(killed, "control", rank)]
        assert data == [step["ids"] for step in steps(uninterrupted, "run", rank)]  # the data resumes exactly
    reference = [steps(uninterrupted, "run", rank)[6] for rank in range(2)]
    first = [steps(killed, "control", rank)[0] for rank in range(2)]
    assert first[0] == reference[0]  # step 7: the saved weights, and rank 0's own RNG restored
    assert first[1]["output"] != reference[1]["output"]  # rank 1 draws from its own RNG, as it warned
