"""``stateful-sampler verify --kills 3`` on the Lightning example (examples/lightning_train.py, not edited
for verify): SamplerCheckpoint records the batches, checkpoints and final weights; three SIGKILLs
inside one epoch, each resume from the last checkpoint, and the result equals the uninterrupted run."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from stateful_sampler.verify.cli import EXIT_EQUAL, main

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "lightning_train.py")
# One epoch of the 1797 digits in batches of 32: 57 steps, a checkpoint every 20 (steps 20 and 40).
STEPS, FIRST_CHECKPOINT = 57, 20


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
def test_verify_kills_the_lightning_example_three_times_and_every_resume_is_equal(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    command = [sys.executable, EXAMPLE, "--root", "{run_dir}", "--max-epochs", "1", "--num-workers", "2"]
    assert main(["--kills", "3", "--work-dir", str(tmp_path / "work"), "--", *command]) == EXIT_EQUAL
    captured = capsys.readouterr()
    kills = sorted(random.Random(0).sample(range(FIRST_CHECKPOINT, STEPS), 3))  # --kill-seed 0's draw
    assert kills == [22, 44, 46]
    assert "3 kills, at steps 22, 44, 46 (--kill-seed 0)\n" in captured.err
    # 22 resumes from 20; the run resumed there writes the checkpoint at 40, which the kills at 44 and 46 resume from
    assert captured.out.startswith(
        "killed 3 times, after steps 22, 44, 46; resumed each time from the last checkpoint, at steps 20, 40, 40\n"
        f"batches compared: {STEPS} ({STEPS} steps x 1 rank(s)), identical to the uninterrupted run's: {STEPS}\n"
    )
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in captured.out
    for name in ("killed1", "killed2", "killed3", "resumed"):
        assert (tmp_path / "work" / "crash" / f"{name}.log").is_file()
