"""Start a recorded training run of a LightningCLI config in a subprocess, and kill it for real.

Every run gets its own process group, so a SIGKILL reaches every DDP rank and every DataLoader
worker at once. No run outlives the runner: one that overstays its timeout, or whose runner stops
on an exception (Ctrl-C, verify's SIGTERM), is killed; if the runner itself is killed, the run's
lifeline (``lifeline.py``) kills it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from stateful_sampler.lightning.config import ConfigError
from stateful_sampler.lightning.lifeline import LIFELINE_ENV
from stateful_sampler.lightning.recorder import (
    NOTIFY_ENV,
    PAUSE_AT_ENV,
    RECORD_ENV,
    RunRecord,
    config_problem_path,
    read_run,
)

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
    """Train to the end (from ``last.ckpt`` when ``resume``) and return what the run recorded;
    ``ConfigError`` with LightningCLI's reason in one line when it refused the config."""
    with _running(settings, run_dir, name, resume=resume, extra_env={}) as process:
        try:
            code = process.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            raise TrainingRunError(
                f"the {name} run did not finish within {settings.timeout:g} s" + _log_tail(run_dir, name)
            ) from None
    problem = config_problem_path(run_dir / name)
    if code != 0 and problem.exists():
        raise ConfigError(f"config {str(settings.config)!r}: {problem.read_text()}")
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
    try:
        with _running(settings, run_dir, name, resume=False, extra_env=pause) as process:
            _wait_for_every_rank(process, notify, settings.timeout, run_dir, name, kill_at)
            _kill_group(process)  # the crash: SIGKILL to every rank and DataLoader worker at once
    finally:
        os.close(notify)
    return read_run(run_dir / name)


@contextmanager
def _running(
    settings: RunSettings, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str]
) -> Iterator[subprocess.Popen]:
    """The run, started in its own session with a lifeline; killed on the way out if still running
    (also on Ctrl-C: the terminal's SIGINT never reaches another session)."""
    lifeline, keep = os.pipe()  # the run reads; only this process holds the write end
    try:
        try:
            process = _start(settings, run_dir, name, resume=resume, extra_env=extra_env, lifeline=lifeline)
        finally:
            os.close(lifeline)
        try:
            yield process
        finally:
            if process.poll() is None:
                _kill_group(process)
    finally:
        os.close(keep)


def _start(
    settings: RunSettings, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str], lifeline: int
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
    env = {**os.environ, RECORD_ENV: str(run_dir / name), LIFELINE_ENV: str(lifeline), **extra_env}
    with (run_dir / f"{name}.log").open("w") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            pass_fds=(lifeline,),
        )


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
