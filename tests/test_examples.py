"""Every example runs, with small settings, as a user would run it: as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600


def run_example(name: str, *args: str) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # a 2.4K-parameter model: one thread is faster
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=environment,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_plain_loop_resumes_exactly_with_two_workers() -> None:
    out = run_example("plain_loop.py", "--epochs", "2", "--stop-after", "40")
    assert "steps: 40 before the stop, 74 after the resume, 114 uninterrupted\n" in out
    assert "identical batches, in the same order: True\n" in out
    assert "final weights bitwise identical: True\n" in out
    assert "verdict: IDENTICAL\n" in out


def test_lightning_script_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    first = run_example("lightning_train.py", "--root", str(tmp_path), "--max-epochs", "1")
    assert "trained to step 57, epoch 1;" in first  # ceil(1797 / 32) steps
    second = run_example("lightning_train.py", "--root", str(tmp_path), "--max-epochs", "2")
    assert f"Restoring states from the checkpoint path at {tmp_path / 'checkpoints' / 'last.ckpt'}" in second
    assert "trained to step 114, epoch 2;" in second


def test_ddp_script_keeps_the_sampler_on_both_ranks(tmp_path: Path) -> None:
    out = run_example("lightning_ddp.py", "--root", str(tmp_path), "--max-epochs", "1")
    for rank in (0, 1):  # 1797 records padded to 1798 on 2 ranks
        assert f"rank {rank}: epoch 0, StatefulSampler kept, 899 of 1798 positions" in out
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_demo_kills_resumes_and_reports_identical_runs() -> None:
    out = run_example("demo.py")
    # configs/digits.yaml: 3 epochs of 57 steps, killed after step 85, resumed from the checkpoint at 80.
    assert "killed with SIGKILL after step 85, in epoch 1 after 28 of its 57 batches" in out
    assert "and resumed from last.ckpt (step 80).\n" in out
    assert "training steps  171                     85 before the kill + 91 after the resume (5 replayed)\n" in out
    assert "steps compared:                  171\n" in out
    assert "identical batches:               171 of 171\n" in out
    assert "identical final weights:         yes, bitwise\n" in out
    assert "verdict:                         IDENTICAL: the resumed run is the uninterrupted run\n" in out
    assert "DIFFERENT" not in out


def test_parquet_stream_is_killed_resumed_and_reports_identical_runs() -> None:
    out = run_example("parquet_stream.py")
    assert "killed with SIGKILL after step 75 (epoch 1, batch 18 of 57); resuming from the checkpoint at step 60" in out
    assert "identical batches:       114 of 114 (record ids, in order)\n" in out
    assert "identical final weights: yes, bitwise\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    assert "\n       64          1797     0.06 TV" in out  # the table ends at a window of every shard
