"""Start a recorded training run in a subprocess, and kill it for real; any framework's command.

Every run gets its own session, and the kill freezes the run's whole process tree, then SIGKILLs
it (``process_tree.py``): every rank and DataLoader worker at once, also ranks that a launcher such
as torchrun puts in sessions of their own (a command runs under ``guard.py``, a subreaper, so they
stay in its tree). No run outlives the runner: one that overstays its timeout, or whose runner
stops on an exception (Ctrl-C, verify's SIGTERM), is killed; if the runner itself is killed, the
run's first process sees its lifeline (``lifeline.py``) end and kills the run. ``run_agents`` starts
a job's torchrun agents side by side, each such a run, and kills one of them with its workers.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stateful_sampler.plugins import PLUGINS_ENV
from stateful_sampler.verify.errors import ConfigError, TrainingRunError
from stateful_sampler.verify.lifeline import LIFELINE_ENV
from stateful_sampler.verify.process_tree import kill_tree
from stateful_sampler.verify.recorder import (
    NOTIFY_ENV,
    PAUSE_AT_ENV,
    PAUSE_AT_PLACE_ENV,
    RECORD_ENV,
    RECORD_RESTARTS_ENV,
    RunRecord,
    config_problem_path,
    rank_path,
    read_run,
    restart_prefix,
)

_LOG_TAIL_LINES = 40
_TRACEBACK_LINES = 30  # of the error a run raised, its last lines (the frames nearest the raise)
_POLL_SECONDS = 0.2  # how often a running run is looked at: its end, its pause, its records
PROGRESS_SECONDS = 10.0  # how often the step a run reached is reported
PLUGIN = "stateful_sampler.verify.plugin"  # verify.plugin.MODULE, named without importing the core's hooks here
RUN_DIR_ENV = "STATEFUL_SAMPLER_RUN_DIR"  # the run's own directory, for its checkpoints


class Launch(Protocol):
    """What a framework's runner says: the command of each run, how its records compare, and, in its
    own terms, how a run that breaks verify's contract is fixed."""

    @property
    def timeout(self) -> float:
        """Seconds per run."""

    @property
    def needs_checkpoint_records(self) -> bool:
        """The run records every checkpoint it saves; else verify may not see them."""

    @property
    def no_batches(self) -> str:
        """The fix when a run recorded no batch."""

    @property
    def no_weights(self) -> str:
        """The fix when a run that finished recorded no final weights."""

    @property
    def not_resumed(self) -> str:
        """The fix when the resumed run did not start at the last checkpoint."""

    @property
    def shared_checkpoints(self) -> str:
        """The fix when a fresh run resumed from a checkpoint another run left."""

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        """The training command; ``resume`` for the run after the kill."""

    def describe(self) -> str:
        """What is being verified, for messages (the config's path, the command)."""

    def settle(self, reference: RunRecord, killed: RunRecord, resumed: RunRecord) -> tuple[RunRecord, RunRecord]:
        """The killed and resumed runs as they are to be compared with the reference."""


class RunEndedEarly(TrainingRunError):
    """The killed run ended on its own before every rank reached the kill step."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


Progress = Callable[[str], None]


def run_training(
    settings: Launch, run_dir: Path, name: str, *, resume: bool = False, progress: Progress = lambda message: None
) -> RunRecord:
    """Train to the end (resuming from the run directory's checkpoint when ``resume``) and return what
    the run recorded; ``ConfigError`` with LightningCLI's reason in one line when it refused the config.
    ``progress`` hears the step the run reached, every ``PROGRESS_SECONDS``."""
    watch = StepWatch(run_dir / name, name, progress)
    with _running(settings, run_dir, name, resume=resume, extra_env={}) as process:
        deadline = time.monotonic() + settings.timeout
        while (code := process.poll()) is None:
            if time.monotonic() > deadline:
                raise TrainingRunError(
                    f"the {name} run did not finish within {settings.timeout:g} s (--timeout)"
                    + _log_tail(run_dir, name)
                )
            watch.poll()
            time.sleep(_POLL_SECONDS)
    problem = config_problem_path(run_dir / name)
    if code != 0 and problem.exists():
        raise ConfigError(f"config {settings.describe()!r}: {problem.read_text()}")
    if code != 0:
        raise TrainingRunError(f"the {name} run exited with code {code}" + _failure(run_dir, name))
    watch.finished()
    return read_run(run_dir / name)


def run_and_kill(
    settings: Launch,
    run_dir: Path,
    name: str,
    kill_at: int,
    *,
    place: tuple[int, int] | None = None,
    resume: bool = False,
    progress: Progress = lambda message: None,
) -> RunRecord:
    """Train until every rank reaches the first batch after ``kill_at`` steps (or, given ``place``, the
    batch at that (epoch, batch) place, which a resumed run reaches whatever step it counts from), then
    SIGKILL the run's whole process tree there, mid-epoch, without any chance to save or clean up;
    ``resume`` resumes from the run directory's checkpoint first."""
    where = {PAUSE_AT_ENV: str(kill_at)} if place is None else {PAUSE_AT_PLACE_ENV: f"{place[0]}:{place[1]}"}
    watch = StepWatch(run_dir / name, name, progress)
    with ExitStack() as stack:
        notify, pause = _pause_channel(stack, run_dir / f"{name}.notify", where)
        with _running(settings, run_dir, name, resume=resume, extra_env=pause) as process:
            runs = {f"{name} run": (process, name)}
            _wait_for_every_rank(runs, notify, settings.timeout, run_dir, name, kill_at, watch)
            _kill(process)  # the crash: SIGKILL to every rank and DataLoader worker at once
    progress(f"  {name} run: every rank paused after step {kill_at}, killed with SIGKILL")
    return read_run(run_dir / name)


def run_agents(
    settings: Launch,
    run_dir: Path,
    name: str,
    agents: int,
    *,
    kill: tuple[int, int] | None = None,
    progress: Progress = lambda message: None,
) -> None:
    """Start ``agents`` copies of the command at once: the torchrun agents of one job, which meet at the
    rendezvous verify hosts, each in a session of its own, its output in NAME.agent<I>.log (I from 1).
    Each start of their workers records apart, in NAME.restart<N> (``RECORD_RESTARTS_ENV``). With
    ``kill`` = (I, STEP), agent I's workers pause at their first batch after STEP steps; once every other
    rank has reached that batch too (it then waits in the step's collective for the paused ranks),
    agent I's whole process tree is SIGKILLed. The agents left must re-form the group and finish,
    each with exit code 0, within the timeout."""
    logs = {number: f"{name}.agent{number}" for number in range(1, agents + 1)}
    with ExitStack() as stack:
        notify, pause = (
            (-1, {})
            if kill is None
            else _pause_channel(  # -1: no channel, no rank pauses
                stack, run_dir / f"{name}.notify", {PAUSE_AT_ENV: str(kill[1])}
            )
        )
        running = {
            number: stack.enter_context(
                _running(settings, run_dir, log, resume=False, record=name,
                         extra_env={RECORD_RESTARTS_ENV: "1", **(pause if kill and number == kill[0] else {})})
            )
            for number, log in logs.items()
        }  # fmt: skip
        watch = StepWatch(restart_prefix(run_dir / name, 0), name, progress)
        why = ""
        if kill is not None:
            _kill_agent_at(settings.timeout, run_dir, name, running, logs, kill, notify, watch)
            progress(f"  {name} run: agent {kill[0]}'s workers paused after step {kill[1]}, the others' waiting in "
                     f"it: agent {kill[0]} and its workers killed with SIGKILL")  # fmt: skip
            watch = StepWatch(restart_prefix(run_dir / name, 1), "resumed", progress)
            why = (
                f" after agent {kill[0]} was killed: an agent re-forms the group without it only with restarts left "
                "(torchrun --max-restarts 1 or more) and an --nnodes MIN:MAX whose MIN the agents left reach"
            )
        _wait_for_agents(settings.timeout, run_dir, name, {number: (running[number], logs[number]) for number in running},
                         watch, why)  # fmt: skip
    watch.finished()


def _pause_channel(stack: ExitStack, fifo: Path, where: dict[str, str]) -> tuple[int, dict[str, str]]:
    """The FIFO on which the ranks told where to pause (``where``: the recorder's variable) say they
    did, open while ``stack`` is, and the environment that tells them."""
    os.mkfifo(fifo)
    # Opened read-write, so the FIFO never reports end-of-file while no rank has it open.
    notify = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    stack.callback(os.close, notify)
    return notify, {**where, NOTIFY_ENV: str(fifo)}


def _kill_agent_at(
    timeout: float,
    run_dir: Path,
    name: str,
    running: dict[int, subprocess.Popen],
    logs: dict[int, str],
    kill: tuple[int, int],
    notify: int,
    watch: StepWatch,
) -> None:
    """Once agent I's workers have paused after STEP steps (``kill``) and every other rank has taken its
    batch of that step, SIGKILL agent I's process tree; it leaves ``running``."""
    doomed, step = kill
    first = restart_prefix(run_dir / name, 0)
    agents = {f"{name} run's agent {number}": (process, logs[number]) for number, process in running.items()}
    _wait_for_every_rank(agents, notify, timeout, run_dir, name, step, watch,
                         reached=lambda rank: _reached(rank_path(first, rank), step))  # fmt: skip
    _kill(running.pop(doomed))


def _reached(path: Path, step: int) -> bool:
    """The rank's record holds its batch after ``step`` steps (a whole line: the rank wrote it)."""
    if not path.exists():
        return False
    lines = path.read_bytes().split(b"\n")[:-1]
    return any(entry["kind"] == "batch" and entry["step"] >= step for entry in map(json.loads, lines))


def _wait_for_agents(
    timeout: float,
    run_dir: Path,
    name: str,
    agents: dict[int, tuple[subprocess.Popen, str]],
    watch: StepWatch,
    why: str,
) -> None:
    """Until every agent has exited 0; ``why`` follows the exit code of one that did not, or the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        for number, (process, log) in agents.items():
            if process.poll() not in (None, 0):
                raise TrainingRunError(
                    f"the {name} run's agent {number} exited with code {process.returncode}{why}"
                    + _failure(run_dir, log)
                )
        if all(process.returncode == 0 for process, _ in agents.values()):
            return
        if time.monotonic() > deadline:
            raise TrainingRunError(
                f"the {name} run's agents did not finish within {timeout:g} s (--timeout){why}"
                + "".join(_log_tail(run_dir, log) for _, log in agents.values())
            )
        watch.poll()
        time.sleep(_POLL_SECONDS)


class StepWatch:
    """Reads a running run's rank-0 record as it grows, and reports the step it reached."""

    def __init__(self, prefix: Path, name: str, progress: Progress) -> None:
        self.path = rank_path(prefix, 0)
        self.name = name
        self.progress = progress
        self.steps = 0  # steps done by the last batch seen
        self._offset = 0
        self._partial = b""
        self._reported = time.monotonic()

    def poll(self) -> None:
        self._read()
        if self.steps and time.monotonic() - self._reported >= PROGRESS_SECONDS:
            self._reported = time.monotonic()
            self.progress(f"  {self.name} run: step {self.steps}")

    def finished(self) -> None:
        self._read()
        self.progress(f"  {self.name} run: finished, {self.steps} steps on rank 0")

    def _read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self._offset)
            new = file.read()
        self._offset += len(new)
        *lines, self._partial = (self._partial + new).split(b"\n")
        for line in lines:
            entry = json.loads(line)
            if entry["kind"] == "batch":
                self.steps = max(self.steps, entry["step"] + 1)


@contextmanager
def _running(
    settings: Launch, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str], record: str | None = None
) -> Iterator[subprocess.Popen]:
    """The run, started in its own session with a lifeline, its output in NAME.log, recording into
    RECORD (default NAME); killed on the way out if still running (also on Ctrl-C: the terminal's
    SIGINT never reaches another session)."""
    lifeline, keep = os.pipe()  # the run reads; only this process holds the write end
    try:
        try:
            process = _start(
                settings, run_dir, name, resume=resume, extra_env=extra_env, lifeline=lifeline, record=record or name
            )
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
    settings: Launch, run_dir: Path, name: str, *, resume: bool, extra_env: dict[str, str], lifeline: int, record: str
) -> subprocess.Popen:
    command = settings.command(run_dir, resume)
    plugins = [part for part in os.environ.get(PLUGINS_ENV, "").split(",") if part and part != PLUGIN]
    env = {
        **os.environ,
        PLUGINS_ENV: ",".join([*plugins, PLUGIN]),  # the core loads verify's recording into the run
        RECORD_ENV: str(run_dir / record),
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
    processes: dict[str, tuple[subprocess.Popen, str]],
    notify: int,
    timeout: float,
    run_dir: Path,
    name: str,
    kill_at: int,
    watch: StepWatch,
    reached: Callable[[int], bool] = lambda rank: False,
) -> None:
    """Until every rank has paused after ``kill_at`` steps (and said so on ``notify``), or, for a rank
    that does not pause, ``reached`` that batch; ``processes``: who may end early, with their log's name."""
    deadline = time.monotonic() + timeout
    paused: set[int] = set()
    world_size: int | None = None
    received = b""
    while world_size is None or not all(rank in paused or reached(rank) for rank in range(world_size)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrainingRunError(
                f"the {name} run did not reach step {kill_at} within {timeout:g} s (--timeout)"
                + "".join(_log_tail(run_dir, log) for _, log in processes.values())
            )
        ready, _, _ = select.select([notify], [], [], min(remaining, _POLL_SECONDS))
        watch.poll()
        if ready:
            received += os.read(notify, 4096)
            *lines, partial = received.split(b"\n")
            received = partial
            for line in lines:
                rank, world_size = (int(word) for word in line.split())
                paused.add(rank)
        elif ended := [(who, each) for who, each in processes.items() if each[0].poll() is not None]:
            who, (process, log) = ended[0]
            raise RunEndedEarly(
                f"the {who} ended (exit code {process.returncode}) before reaching step {kill_at}"
                + _failure(run_dir, log),
                process.returncode,
            )


def _kill(process: subprocess.Popen) -> None:
    kill_tree(process.pid)
    process.wait()


def _log_tail(run_dir: Path, name: str) -> str:
    log = run_dir / f"{name}.log"
    lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:] if log.exists() else []
    return f"; last lines of {log}:\n" + "\n".join(lines)


def _failure(run_dir: Path, name: str) -> str:
    """Why a run failed: the error one of its processes raised, with its traceback, when the log holds
    one (under torchrun or ``accelerate launch`` the log ends with the launcher's own traceback, which
    only says that a rank failed); else the log's last lines."""
    log = run_dir / f"{name}.log"
    error = raised_error(log.read_text(errors="replace")) if log.exists() else None
    if error is None:
        return _log_tail(run_dir, name)
    return f": {error.exception}\nits traceback, from {log}:\n" + "\n".join(error.traceback[-_TRACEBACK_LINES:])


@dataclass(frozen=True)
class RaisedError:
    exception: str  # the exception as Python printed it: "DoubleShardingError: ..."
    traceback: list[str]  # its traceback's lines, through the exception's line

    @property
    def name(self) -> str:
        return self.exception.split(":", 1)[0].rsplit(".", 1)[-1]


# What a launcher raises when a process it started failed: the process's own error is the one to show.
LAUNCHER_ERRORS = frozenset({"ChildFailedError", "CalledProcessError"})  # torchrun's; accelerate launch's
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank(\d+)\]:\s?")  # torch.distributed's prefix on a rank's traceback
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def raised_error(output: str) -> RaisedError | None:
    r"""The first error a process raised in ``output`` (the run's log, every process's stdout and stderr
    in one), that is not a launcher's report of another process's failure; ``None`` if there is none.
    Ranks' lines that torch.distributed prefixes with ``[rankN]:`` are read rank by rank, so tracebacks
    of ranks that failed at once do not mix; of a chain of exceptions, the last one raised is taken.

    Example:
        >>> raised_error("Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: bad\n").exception
        'ValueError: bad'
    """
    streams: dict[str | None, list[tuple[int, str]]] = {}
    for number, line in enumerate(output.splitlines()):
        prefix = _RANK_PREFIX.match(line)
        streams.setdefault(prefix.group(1) if prefix else None, []).append(
            (number, line[prefix.end() :] if prefix else line)
        )
    found = [error for lines in streams.values() for error in _tracebacks(lines)]
    real = [(start, error) for start, error in found if error.name not in LAUNCHER_ERRORS]
    return min(real, key=lambda found: found[0])[1] if real else None


def _tracebacks(lines: list[tuple[int, str]]) -> list[tuple[int, RaisedError]]:
    """Each chain of tracebacks in one process's lines: where it starts, and its last exception."""
    chains: list[tuple[int, RaisedError]] = []
    index = 0
    while index < len(lines):
        number, text = lines[index]
        if not text.startswith(_TRACEBACK):
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end][1].startswith(" "):
            end += 1
        if end == len(lines) or not lines[end][1].strip():
            index = end  # cut off before its exception: nothing to name
            continue
        error = RaisedError(lines[end][1], [text for _, text in lines[index : end + 1]])
        before = " ".join(text for _, text in lines[max(index - 3, 0) : index])
        if chains and any(phrase in before for phrase in _CHAINED):
            chains[-1] = (chains[-1][0], error)  # the same failure, raised again: its last form
        else:
            chains.append((number, error))
        index = end + 1
    return chains
