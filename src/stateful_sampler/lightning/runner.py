"""Start a recorded training run of a LightningCLI config in a subprocess, and kill it for real.

Every run gets its own process group, so a SIGKILL reaches every DDP rank and every DataLoader
worker at once, and a run that overstays its timeout is killed rather than left behind.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stateful_sampler.lightning.recorder import NOTIFY_ENV, PAUSE_AT_ENV, RECORD_ENV, RunRecord, read_run

_LOG_TAIL_LINES = 40


class TrainingRunError(RuntimeError):
    """A training subprocess failed, overstayed its timeout, or never reached the kill point."""


@dataclass(frozen=True)
class RunSettings:
    config: Path  # a LightningCLI config for fit; the runner sets ckpt_path itself
    seed: int  # passed as seed_everything, so every run starts from the same weights
    devices: int | None  # overrides trainer.devices when set
    timeout: float  # seconds per run


def run_training(settings: RunSettings, run_dir: Path, name: str, *, resume: bool = False) -> RunRecord:
    """Train to the end (from ``last.ckpt`` when ``resume``) and return what the run recorded."""
    process = _start(settings, run_dir, name, resume=resume, extra_env={})
    try:
        code = process.wait(timeout=settings.timeout)
    except subprocess.TimeoutExpired:
        raise TrainingRunError(
            f"the {name} run did not finish within {settings.timeout:g} s" + _log_tail(run_dir, name)
        ) from None
    finally:  # also on Ctrl-C: the run has its own session, so the terminal's SIGINT never reached it
        if process.poll() is None:
            _kill_group(process)
    if code != 0:
        raise TrainingRunError(f"the {name} run exited with code {code}" + _log_tail(run_dir, name))
    return read_run(run_dir / name)


def run_and_kill(settings: RunSettings, run_dir: Path, name: str, kill_at: int) -> RunRecord:
    """Train until every rank reaches the first batch after ``kill_at`` optimizer steps, then SIGKILL
    the whole process group there, mid-epoch, without any chance to save or clean up."""
    fifo = run_dir / f"{name}.notify"
    os.mkfifo(fifo)
    # Opened read-write, so the FIFO never reports end-of-file while no rank has it open.
    notify = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    pause = {PAUSE_AT_ENV: str(kill_at), NOTIFY_ENV: str(fifo)}
    process = _start(settings, run_dir, name, resume=False, extra_env=pause)
    try:
        _wait_for_every_rank(process, notify, settings.timeout, run_dir, name, kill_at)
        _kill_group(process)  # the crash: SIGKILL to every rank and DataLoader worker at once
    finally:
        os.close(notify)
        if process.poll() is None:
            _kill_group(process)
    return read_run(run_dir / name)


def _start(
    settings: RunSettings, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str]
) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "stateful_sampler.lightning.recorded_fit", "fit",
        "--config", str(settings.config),
        f"--seed_everything={settings.seed}",
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.deterministic=true",
    ]  # fmt: skip
    if settings.devices is not None:
        command.append(f"--trainer.devices={settings.devices}")
    command.append("--ckpt_path=last" if resume else "--ckpt_path=null")  # a fresh run starts fresh
    env = {**os.environ, RECORD_ENV: str(run_dir / name), **extra_env}
    with (run_dir / f"{name}.log").open("w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_for_every_rank(
    process: subprocess.Popen, notify: int, timeout: float, run_dir: Path, name: str, kill_at: int
) -> None:
    deadline = time.monotonic() + timeout
    paused: set[int] = set()
    world_size: int | None = None
    received = b""
    while world_size is None or len(paused) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrainingRunError(
                f"the {name} run did not reach step {kill_at} within {timeout:g} s" + _log_tail(run_dir, name)
            )
        ready, _, _ = select.select([notify], [], [], min(remaining, 1.0))
        if ready:
            received += os.read(notify, 4096)
            *lines, partial = received.split(b"\n")
            received = partial
            for line in lines:
                rank, world_size = (int(word) for word in line.split())
                paused.add(rank)
        elif process.poll() is not None:
            raise TrainingRunError(
                f"the {name} run ended (exit code {process.returncode}) before reaching step {kill_at}: "
                f"choose a kill step inside the run" + _log_tail(run_dir, name)
            )


def _kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _log_tail(run_dir: Path, name: str) -> str:
    log = run_dir / f"{name}.log"
    lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:] if log.exists() else []
    return f"; last lines of {log}:\n" + "\n".join(lines)
