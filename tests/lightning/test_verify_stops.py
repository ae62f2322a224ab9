"""Killing ``verify`` ends every process it started (issue 9, item 7): a real ``verify`` process,
killed for real, and the processes of its training run looked up in /proc."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from stateful_sampler.verify.lifeline import LIFELINE_ENV
from tests.lightning.verify_harness import digits_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="finds the run's processes in /proc"),
]

T = TypeVar("T")
GRACE_SECONDS = 60.0  # a bound on the polls, not a wait: they return as soon as the condition holds


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, parent, group = text[text.rindex(")") + 2 :].split()[:3]  # the name may hold spaces
    return state, int(parent), int(group)


def _living(match: Callable[[int, int, int], bool]) -> list[int]:
    """Processes, zombies excepted, whose (pid, parent, group) match."""
    found = []
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[0] != "Z" and match(int(entry.name), stat[1], stat[2]):
            found.append(int(entry.name))
    return found


def group_members(group: int) -> list[int]:
    return _living(lambda pid, parent, pgid: pgid == group)


def training_runs(verify: int) -> list[int]:
    """verify's children that already run the training module, each leading its own group."""
    children = _living(lambda pid, parent, pgid: parent == verify and pgid == pid)
    return [pid for pid in children if b"recorded_fit" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def poll(condition: Callable[[], T], what: str) -> T:
    deadline = time.monotonic() + GRACE_SECONDS
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {GRACE_SECONDS:g} s: {what}")
        time.sleep(0.05)
    return result


def read_until(process: subprocess.Popen, prefix: str) -> str:
    """verify's progress (on stderr) up to and including the first line that starts with ``prefix``."""
    output = b""
    deadline = time.monotonic() + 300
    while not any(line.startswith(prefix.encode()) for line in output.splitlines()):
        ready, _, _ = select.select([process.stderr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(process.stderr.fileno(), 4096) if ready else b""
        if not chunk:
            raise AssertionError(f"verify printed no line starting with {prefix!r}; it printed:\n{output.decode()}")
        output += chunk
    return output.decode()


@pytest.mark.parametrize(
    ("stop", "exit_code"),
    [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 128 + signal.SIGTERM)],
    ids=["SIGKILL", "SIGTERM"],
)
def test_killing_verify_ends_every_process_of_its_run_and_sigterm_removes_its_work_dir(
    tmp_path: Path, one_thread: None, stop: signal.Signals, exit_code: int
) -> None:
    # Killed while the run that is to be killed at its pause starts: before the fix that run,
    # in its own session, outlived verify and then blocked forever opening the FIFO to tell it.
    config = digits_config(tmp_path, max_epochs=1, batch_size=256, every_n_train_steps=3)
    # A short TMPDIR: the run's DataLoader workers put their sockets there, and a socket path has at most
    # 107 bytes (a deep pytest directory made them fail, and the run wait forever for its first batch).
    temporary = Path(tempfile.mkdtemp(prefix="verify-"))
    command = [sys.executable, "-m", "stateful_sampler.cli", "verify", "--config", str(config)]
    verify = subprocess.Popen(command, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temporary)})
    run = None
    try:
        read_until(verify, "run killed with SIGKILL after step")
        [run] = poll(lambda: training_runs(verify.pid), "verify starts the run it kills")
        os.kill(verify.pid, stop)
        assert verify.wait(timeout=GRACE_SECONDS) == exit_code
        poll(lambda: not group_members(run), f"every process of the run's group {run} ends")
        if stop == signal.SIGTERM:
            assert list(temporary.iterdir()) == []  # the temporary work dir is removed
    finally:
        if verify.poll() is None:
            verify.kill()
            verify.wait()
        if run is not None and group_members(run):
            os.killpg(run, signal.SIGKILL)  # leave nothing behind when the test fails
        shutil.rmtree(temporary, ignore_errors=True)


def test_a_run_whose_verify_is_gone_kills_its_whole_process_group() -> None:
    # The run's first process watches the lifeline; its own child stands for DDP ranks and workers.
    program = (
        "import signal, subprocess, sys\n"
        "from stateful_sampler.verify import lifeline\n"
        "rank = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
        "lifeline.watch_lifeline()\n"
        "print(rank.pid, flush=True)\n"
        "signal.pause()\n"
    )
    lifeline, keep = os.pipe()
    env = {**os.environ, LIFELINE_ENV: str(lifeline)}
    command = [sys.executable, "-c", program]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, pass_fds=(lifeline,), start_new_session=True)
    os.close(lifeline)
    try:
        rank = int(run.stdout.readline())
        assert sorted(group_members(run.pid)) == sorted([run.pid, rank])
        os.close(keep)  # what verify's death does, however it dies
        assert run.wait(timeout=GRACE_SECONDS) == -signal.SIGKILL
        poll(lambda: not group_members(run.pid), "the run's child ends with it")
    finally:
        if group_members(run.pid):
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_a_paused_run_exits_when_no_verify_reads_its_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "killed.notify"
    os.mkfifo(fifo)
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from stateful_sampler.verify.recorder import Recorder\n"
        "recorder = Recorder(Path(sys.argv[1]), pause_at=3, notify=Path(sys.argv[2]))\n"
        "recorder.wait_to_be_killed(rank=0, world_size=1)\n"
    )
    command = [sys.executable, "-c", program, str(tmp_path / "killed"), str(fifo)]
    paused = subprocess.run(command, capture_output=True, text=True, timeout=GRACE_SECONDS, check=False)
    assert paused.returncode == 3
    assert paused.stderr.splitlines()[-1] == f"paused at step 3, but no process reads {fifo}: its parent is gone"
