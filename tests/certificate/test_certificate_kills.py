"""End to end, with no change to the training script: real gloo DDP processes, real ``kill -9``, the
certificate switched on by ``STATEFUL_SAMPLER_CERTIFICATE`` and compared with ``stateful-sampler certificate``."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stateful_sampler.cli import main
from tests.helpers import free_port

SCRIPT = Path(__file__).with_name("certificate_run.py")
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def phase(certificate: Path, checkpoint: Path, world_size: int, pause_at: int = 0, restore: bool = True) -> None:
    """One launch of the run on ``world_size`` ranks; with ``pause_at``, every rank is SIGKILLed (workers too)
    once it has trained that many steps and says so."""
    shared = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port(),
              "OMP_NUM_THREADS": "1", "STATEFUL_SAMPLER_CERTIFICATE": str(certificate)}  # fmt: skip
    command = [sys.executable, str(SCRIPT), str(checkpoint), str(pause_at), "1" if restore else "0"]
    ranks = [
        subprocess.Popen(command, env={**shared, "RANK": str(rank)}, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for rank in range(world_size)
    ]  # fmt: skip
    markers = [checkpoint.with_name(f"{checkpoint.name}.paused.rank{rank}") for rank in range(world_size)]
    try:
        if pause_at:
            deadline = time.monotonic() + TIMEOUT
            while not all(marker.exists() for marker in markers):
                assert all(rank.poll() is None for rank in ranks), [rank.communicate()[0][-3000:] for rank in ranks]
                assert time.monotonic() < deadline, "the run never reached its pause"
                time.sleep(0.05)  # polling for the markers; the kill itself lands at the pause, a known step
            for rank in ranks:
                os.killpg(rank.pid, signal.SIGKILL)
            for rank in ranks:
                rank.wait(timeout=TIMEOUT)
                assert rank.returncode == -signal.SIGKILL
            for marker in markers:
                marker.unlink()
        else:
            outputs = [rank.communicate(timeout=TIMEOUT)[0] for rank in ranks]
            for rank, output in zip(ranks, outputs):
                assert rank.returncode == 0, output[-4000:]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                os.killpg(rank.pid, signal.SIGKILL)


def certificate_compare(first: Path, second: Path) -> tuple[int, str]:
    """``stateful-sampler certificate compare FIRST SECOND`` in this process (a subprocess would import torch
    once more; test_certificate_lightning.py runs the command itself): its exit code and its output."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = main(["certificate", "compare", str(first), str(second)])
    return code, output.getvalue()


@pytest.mark.slow
def test_three_kills_and_a_resize_certify_the_uninterrupted_data(tmp_path: Path) -> None:
    plain = tmp_path / "plain.cert"
    phase(plain, tmp_path / "plain.pt", 2)
    killed, checkpoint = tmp_path / "killed.cert", tmp_path / "killed.pt"
    phase(killed, checkpoint, 2, pause_at=5)  # checkpoint after step 3; steps 3 and 4 are trained again
    # The broken run's first launch would be this one again (the same run, deterministic): start it from a copy.
    broken, broken_checkpoint = tmp_path / "broken.cert", tmp_path / "broken.pt"
    for path in (checkpoint, *tmp_path.glob("killed.cert.rank*")):
        shutil.copy(path, tmp_path / path.name.replace("killed", "broken"))
    assert sorted(path.name for path in tmp_path.glob("broken.*")) == [
        "broken.cert.rank0",
        "broken.cert.rank1",
        "broken.pt",
    ]
    phase(killed, checkpoint, 2, pause_at=5)  # resumed at step 3, checkpoint after step 6 (epoch 0, position 36)
    phase(killed, checkpoint, 1, pause_at=7)  # resized to 1 rank mid-epoch; checkpoint after step 12
    phase(killed, checkpoint, 1)
    code, out = certificate_compare(plain, killed)
    assert code == 0, out
    assert "EQUAL (the same multiset per epoch): step by step the runs differ from step 6" in out
    assert "epoch 0: 2 x 3 vs 2 x 3 -> 1 x 3, epoch 1: 2 x 3 vs 1 x 3" in out
    assert "3 resumes, world size 2 -> 1" in out

    phase(broken, broken_checkpoint, 2, restore=False)  # the model comes back, the data position does not
    code, out = certificate_compare(plain, broken)
    assert code == 1, out
    lines = out.splitlines()
    assert "DIFFERENT: first at step 3 (epoch 0)" in lines
    assert any(
        line.startswith("  plain.cert: step 3, epoch 0, positions [18, 24), world size 2: records [") for line in lines
    )
    assert any(
        line.startswith("  broken.cert: step 3, epoch 0, positions [0, 6), world size 2: records [") for line in lines
    )
