"""Start a recorded training run in a subprocess, and kill it for real; any framework's command.

Every run gets its own session, and the kill freezes the run's whole process tree, then SIGKILLs
it (``process_tree.py``): every rank and DataLoader worker at once, also ranks that a launcher such
as torchrun puts in sessions of their own (a command runs under ``guard.py``, a subreaper, so they
stay in its tree). No run outlives the runner: one that overstays its timeout, or whose runner
stops on an exception (Ctrl-C, verify's SIGTERM), is killed; if the runner itself is killed, the
run's first process sees its lifeline (``lifeline.py``) end and kills the run.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

from stateful_sampler.verify.errors import ConfigError, TrainingRunError
from stateful_sampler.verify.lifeline import LIFELINE_ENV
from stateful_sampler.verify.process_tree import kill_tree
from stateful_sampler.verify.recorder import (
    NOTIFY_ENV,
    PAUSE_AT_ENV,
    RECORD_ENV,
    RunRecord,
    config_problem_path,
    read_run,
)

_LOG_TAIL_LINES = 40
RUN_DIR_ENV = "STATEFUL_SAMPLER_RUN_DIR"  # the run's own directory, for its checkpoints


class Launch(Protocol):
    """What a framework's runner says: the command of each run, and how its records compare."""

    timeout: float  # seconds per run
    needs_checkpoint_records: bool  # the run records every checkpoint it saves; else verify may not see them

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        """The training command; ``resume`` for the run after the kill."""

    def describe(self) -> str:
        """What is being verified, for messages (the config's path, the command)."""

    def settle(self, reference: RunRecord, killed: RunRecord, resumed: RunRecord) -> tuple[RunRecord, RunRecord]:
        """The killed and resumed runs as they are to be compared with the reference."""


def run_training(settings: Launch, run_dir: Path, name: str, *, resume: bool = False) -> RunRecord:
    """Train to the end (resuming from the run directory's checkpoint when ``resume``) and return what
    the run recorded; ``ConfigError`` with LightningCLI's reason in one line when it refused the config."""
    with _running(settings, run_dir, name, resume=resume, extra_env={}) as process:
        try:
            code = process.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            raise TrainingRunError(
                f"the {name} run did not finish within {settings.timeout:g} s" + _log_tail(run_dir, name)
            ) from None
    problem = config_problem_path(run_dir / name)
    if code != 0 and problem.exists():
        raise ConfigError(f"config {settings.describe()!r}: {problem.read_text()}")
    if code != 0:
        raise TrainingRunError(f"the {name} run exited with code {code}" + _log_tail(run_dir, name))
    return read_run(run_dir / name)


def run_and_kill(settings: Launch, run_dir: Path, name: str, kill_at: int) -> RunRecord:
    """Train until every rank reaches the first batch after ``kill_at`` steps, then SIGKILL the run's
    whole process tree there, mid-epoch, without any chance to save or clean up."""
    fifo = run_dir / f"{name}.notify"
    os.mkfifo(fifo)
    # Opened read-write, so the FIFO never reports end-of-file while no rank has it open.
    notify = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    pause = {PAUSE_AT_ENV: str(kill_at), NOTIFY_ENV: str(fifo)}
    try:
        with _running(settings, run_dir, name, resume=False, extra_env=pause) as process:
            _wait_for_every_rank(process, notify, settings.timeout, run_dir, name, kill_at)
            _kill(process)  # the crash: SIGKILL to every rank and DataLoader worker at once
    finally:
        os.close(notify)
    return read_run(run_dir / name)


@contextmanager
def _running(
    settings: Launch, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str]
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
                _kill(process)
    finally:
        os.close(keep)


def _start(
    settings: Launch, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str], lifeline: int
) -> subprocess.Popen:
    command = settings.command(run_dir, resume)
    env = {
        **os.environ,
        RECORD_ENV: str(run_dir / name),
        RUN_DIR_ENV: str(run_dir),
        LIFELINE_ENV: str(lifeline),
        **extra_env,
    }
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


def _kill(process: subprocess.Popen) -> None:
    kill_tree(process.pid)
    process.wait()


def _log_tail(run_dir: Path, name: str) -> str:
    log = run_dir / f"{name}.log"
    lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:] if log.exists() else []
    return f"; last lines of {log}:\n" + "\n".join(lines)
