"""Run a training three times (uninterrupted; killed with SIGKILL mid-epoch; resumed from its last
checkpoint) and compare the runs: the check behind ``stateful-sampler verify`` and
``stateful_sampler.testing.assert_resume_equal``, for a LightningCLI config or any command; and, with
``check_agents``, a job of several torchrun agents of which one is killed with its workers."""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from stateful_sampler.checks import check_int
from stateful_sampler.verify.command import DEVICES, RDZV, CommandLaunch
from stateful_sampler.verify.compare import ResumeReport, compare_runs, start_problem_of
from stateful_sampler.verify.errors import TrainingRunError
from stateful_sampler.verify.recorder import BatchRecord, RunRecord, read_run, restart_prefix
from stateful_sampler.verify.resize import ResizeReport, batch_size_of, compare_resized
from stateful_sampler.verify.runner import Launch, RunEndedEarly, run_agents, run_and_kill, run_training

DEFAULT_TIMEOUT = 600.0
T = TypeVar("T")


def check_resume(
    run: str | Path | Sequence[str],
    *,
    kill_at: int | None = None,
    devices: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    work_dir: str | Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
    kills: int = 1,
    kill_seed: int = 0,
) -> ResumeReport:
    """Compare an uninterrupted run with one killed after ``kill_at`` steps (default: mid-run, after
    the first checkpoint) and resumed; with ``kills`` above 1, killed at that many random steps of one
    epoch (drawn from ``kill_seed``), each time resumed from the last checkpoint it wrote.

    ``run`` is a LightningCLI config (a path; resumed with ``ckpt_path="last"``) or a command (a list
    of arguments, run again to resume; see ``verify.command``). ``work_dir`` keeps the runs' records,
    checkpoints and logs; by default a temporary directory.
    """
    timeout = check_timeout(timeout)
    if kill_at is not None:
        kill_at = check_int("kill_at", kill_at, minimum=1)
    if devices is not None:
        devices = check_int("devices", devices, minimum=1)
    kills = check_int("kills (--kills)", kills, minimum=1)
    kill_seed = check_int("kill_seed (--kill-seed)", kill_seed, minimum=0)
    if kills > 1 and kill_at is not None:
        raise ValueError(f"kill_at (--kill-at) is for one kill; with kills (--kills) {kills} the steps are drawn")
    launch = _launch(run, devices, timeout, progress)
    plan = KillPlan(kill_at, kills, kill_seed)
    return _in_work_dir(work_dir, progress, lambda directory: _check(launch, directory, plan, progress))


def check_resize(
    command: Sequence[str],
    sizes: tuple[int, int],
    *,
    kill_at: int | None = None,
    kills: int = 1,
    kill_seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    work_dir: str | Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> ResizeReport:
    """Compare an uninterrupted run of ``command`` at world size A (``{devices}`` becomes A) with one
    killed at A and resumed at B, the ``sizes`` (A, B); with ``kills`` above 1, every later kill and
    resume is at B too. The elastic rules decide (``verify.resize``): per epoch the same records,
    each once, every rank the same steps; exact batches where the layout is kept.

    Example:
        >>> torchrun = ["torchrun", "--standalone", "--nproc-per-node", "{devices}"]
        >>> check_resize([*torchrun, "train.py", "--root", "{run_dir}"], (4, 2)).rule  # doctest: +SKIP
        'global order'
    """
    timeout = check_timeout(timeout)
    if not isinstance(sizes, tuple) or len(sizes) != 2:
        raise TypeError(f"sizes (--resize) must be a pair of world sizes (A, B), got {sizes!r}")
    sizes = (
        check_int("resize (--resize) A", sizes[0], minimum=1),
        check_int("resize (--resize) B", sizes[1], minimum=1),
    )
    if kill_at is not None:
        kill_at = check_int("kill_at", kill_at, minimum=1)
    kills = check_int("kills (--kills)", kills, minimum=1)
    kill_seed = check_int("kill_seed (--kill-seed)", kill_seed, minimum=0)
    if kills > 1 and kill_at is not None:
        raise ValueError(f"kill_at (--kill-at) is for one kill; with kills (--kills) {kills} the steps are drawn")
    _check_placeholder(
        command, DEVICES, "resize (--resize)", "resumes a command at another world size",
        ("it takes its process count", "the command takes its process count"),
        f"to put the world sizes {sizes[0]} and {sizes[1]} in", f"torchrun --nproc-per-node {DEVICES} ...",
    )  # fmt: skip
    at_a = CommandLaunch.checked(command, sizes[0], timeout)
    at_b = replace(at_a, devices=sizes[1])
    plan = KillPlan(kill_at, kills, kill_seed)
    return _in_work_dir(work_dir, progress, lambda directory: _check_resize(at_a, at_b, directory, plan, progress))


def _check_placeholder(command: Any, placeholder: str, flag: str, does: str, takes: tuple[str, str], why: str,
                       example: str) -> None:  # fmt: skip
    """Refuse a command that is not a list of arguments, or that lacks the ``placeholder`` ``flag`` fills in
    (``takes``: where the placeholder goes, said of a command given and of one to write)."""
    if not isinstance(command, (list, tuple)):
        raise TypeError(
            f"{flag} {does}: give -- COMMAND with {placeholder} where {takes[0]}, not {type(command).__name__} "
            f"{command!r}"
        )
    if not any(isinstance(argument, str) and placeholder in argument for argument in command):
        raise ValueError(f"{flag}: the command has no {placeholder} {why}; write it where {takes[1]}, e.g. {example}")


def check_agents(
    command: Sequence[str],
    agents: int,
    *,
    kill_agent: int | None = None,
    kill_at: int | None = None,
    kill_seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    work_dir: str | Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> ResizeReport:
    """Run ``command`` as the ``agents`` torchrun agents of one elastic job (``{rdzv}`` becomes the
    rendezvous endpoint verify hosts), uninterrupted; then again, SIGKILLing agent ``kill_agent``
    (1 to ``agents``, default the last) with its workers after ``kill_at`` steps (default: drawn from
    ``kill_seed``), while the agents left re-form the group at a smaller world size and finish. The
    elastic rules decide (``verify.resize``): per epoch the same records, each once, every rank the
    same steps; the first round's batches exact.

    Example:
        >>> torchrun = ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1"]
        >>> rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv}"]
        >>> check_agents([*torchrun, *rendezvous, "train.py", "--root", "{run_dir}"], 2).rule  # doctest: +SKIP
        'global order'
    """
    timeout = check_timeout(timeout)
    agents = check_int("agents (--agents)", agents, minimum=2)
    kill_agent = agents if kill_agent is None else check_int("kill_agent (--kill-agent)", kill_agent, minimum=1,
                                                              maximum=agents)  # fmt: skip
    if kill_at is not None:
        kill_at = check_int("kill_at", kill_at, minimum=1)
    kill_seed = check_int("kill_seed (--kill-seed)", kill_seed, minimum=0)
    _check_placeholder(
        command, RDZV, "agents (--agents)", "starts a command as torchrun agents",
        ("torchrun takes its rendezvous endpoint", "torchrun takes it"), "to put the rendezvous endpoint verify hosts in",
        f"torchrun --nnodes 1:{agents} --rdzv-backend c10d --rdzv-endpoint {RDZV} ...",
    )  # fmt: skip
    launch = CommandLaunch.checked(command, None, timeout)
    plan = KillPlan(kill_at, 1, kill_seed)
    return _in_work_dir(
        work_dir, progress, lambda directory: _check_agents(launch, agents, kill_agent, directory, plan, progress)
    )


def _in_work_dir(work_dir: str | Path | None, progress: Callable[[str], None], check: Callable[[Path], T]) -> T:
    """Run ``check`` in ``work_dir``, by default a temporary directory, removed unless a log must outlive verify."""
    if work_dir is not None:
        return check(_check_path("work_dir", work_dir))
    temporary = Path(tempfile.mkdtemp(prefix="stateful-sampler-verify-"))
    try:
        report = check(temporary)
    except Exception:
        if any(temporary.rglob("*.log")):  # the error names a log: it must outlive verify
            progress(f"work directory kept, with the runs' logs: {temporary}")
        else:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    except BaseException:  # Ctrl-C, SIGTERM: stop and clean up
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    shutil.rmtree(temporary, ignore_errors=True)
    return report


def _launch(run: Any, devices: int | None, timeout: float, progress: Callable[[str], None]) -> Launch:
    """The runner for ``run``: each framework's is imported only when it is used."""
    if isinstance(run, (list, tuple)):
        return CommandLaunch.checked(run, devices, timeout)
    from stateful_sampler.verify.lightning_cli.launch import LightningCLILaunch

    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(
            f"run must be a LightningCLI config path (str or os.PathLike) or a command (a list of str), "
            f"got {type(run).__name__} {run!r}"
        )
    return LightningCLILaunch.checked(Path(run), devices, timeout, progress)


def check_timeout(timeout: Any) -> float:
    """Seconds per run: a finite number above 0 (a timeout of 0 or less would fail every run)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds above 0, got {timeout!r}")
    return float(timeout)


def _check_path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}")
    return Path(value)


@dataclass(frozen=True)
class KillPlan:
    """Where the killed run dies: at ``kill_at`` (or the default step), or at ``kills`` drawn steps."""

    kill_at: int | None
    kills: int
    seed: int


def _check(launch: Launch, work_dir: Path, plan: KillPlan, progress: Callable[[str], None]) -> ResumeReport:
    reference_dir, crash_dir = _run_dirs(work_dir)
    progress(f"work directory: {work_dir}")
    progress("uninterrupted run ...")
    reference = run_training(launch, reference_dir, "reference", progress=progress)
    _check_contract(launch, reference, "uninterrupted", reference_dir / "reference.log")
    steps, first_saved = _kill_range(reference, launch.needs_checkpoint_records)
    if plan.kills > 1:
        kill_steps = draw_kill_steps(reference, steps, first_saved, plan.kills, plan.seed)
        progress(f"{plan.kills} kills, at steps {', '.join(map(str, kill_steps))} (--kill-seed {plan.seed})")
        return _check_kills(launch, crash_dir, reference, kill_steps, progress)
    kill_at = plan.kill_at
    kill_at = default_kill_step(steps, first_saved) if kill_at is None else check_kill_step(steps, first_saved, kill_at)
    progress(f"run killed with SIGKILL after step {kill_at} ...")
    try:
        killed = run_and_kill(launch, crash_dir, "killed", kill_at, progress=progress)
    except RunEndedEarly as error:
        if error.code != 0:
            raise
        _check_fresh_start(launch, reference, read_run(crash_dir / "killed"), str(error))
        raise
    _check_fresh_start(launch, reference, killed, "")
    progress(f"run resumed from the last checkpoint (step {max(killed.checkpoint_steps, default='none')}) ...")
    resumed = run_training(launch, crash_dir, "resumed", resume=True, progress=progress)
    killed, resumed = launch.settle(reference, killed, resumed)
    return compare_runs(reference, killed, resumed, kill_at, not_resumed=launch.not_resumed)


def _check_kills(
    launch: Launch, crash_dir: Path, reference: RunRecord, kill_steps: list[int], progress: Callable[[str], None]
) -> ResumeReport:
    """Kill at each step in turn, each run after the first resumed from the checkpoint the one before
    it left; then resume to the end. The steps a killed run trained on after the checkpoint its
    successor resumed from are superseded (the final weights never learnt from them); what is left,
    and the final run, must be the uninterrupted run's, batch by batch, and start where they should."""
    places = {record.step: (record.epoch, record.batch_idx) for record in reference.batches if record.rank == 0}
    progress(f"run killed with SIGKILL after step {kill_steps[0]} ...")
    runs = [run_and_kill(launch, crash_dir, "killed1", kill_steps[0], progress=progress)]
    _check_fresh_start(launch, reference, runs[0], "")
    for number, step in enumerate(kill_steps[1:], 2):
        progress(f"run resumed, killed with SIGKILL after step {step} ...")
        name = f"killed{number}"
        runs.append(run_and_kill(launch, crash_dir, name, step, place=places[step], resume=True, progress=progress))
    progress("run resumed to the end ...")
    runs.append(run_training(launch, crash_dir, "resumed", resume=True, progress=progress))
    for index in range(1, len(runs)):
        runs[index - 1], runs[index] = launch.settle(reference, runs[index - 1], runs[index])
    starts = [run.batches[0].step if run.batches else None for run in runs]
    problems = []
    for index, step in enumerate(kill_steps[:-1]):
        problem = start_problem_of(runs[index + 1], _resume_point(reference, runs[index], step), step,
                                   launch.not_resumed)  # fmt: skip
        if problem is not None:
            resumed_at = _resume_point(reference, runs[index], step)
            problems.append(f"step {resumed_at}, where the run killed after step {step} resumes: {problem}")
    kept = [
        record
        for run, start in zip(runs[:-1], starts[1:])
        for record in run.batches
        if start is None or record.step < start
    ]
    killed = RunRecord(kept, [_resume_point(reference, runs[-2], kill_steps[-1])], None)
    report = compare_runs(reference, killed, runs[-1], kill_steps[-1], not_resumed=launch.not_resumed)
    froms = tuple(start for start in starts[1:] if start is not None)
    report = replace(report, kill_steps=tuple(kill_steps), resumed_froms=froms)
    return replace(report, first_divergence=problems[0]) if problems else report


def _check_resize(
    at_a: CommandLaunch, at_b: CommandLaunch, work_dir: Path, plan: KillPlan, progress: Callable[[str], None]
) -> ResizeReport:
    """Kill at world size A, resume at B (each later kill and resume at B too), to the end."""
    reference_dir, crash_dir = _run_dirs(work_dir)
    sizes = (at_a.devices or 1, at_b.devices or 1)
    progress(f"work directory: {work_dir}")
    progress(f"uninterrupted run at world size {sizes[0]} ...")
    reference = run_training(at_a, reference_dir, "reference", progress=progress)
    if not reference.batches:
        raise TrainingRunError(f"the uninterrupted run recorded no batch: {at_a.no_batches}")
    batch_size_of(reference)  # records are named by their keys: refused now if the batches carry none
    steps, first_saved = _kill_range(reference, at_a.needs_checkpoint_records)
    if plan.kills > 1:
        kill_steps = draw_kill_steps(reference, steps, first_saved, plan.kills, plan.seed)
        progress(f"{plan.kills} kills, at steps {', '.join(map(str, kill_steps))} (--kill-seed {plan.seed})")
    elif plan.kill_at is None:
        kill_steps = [default_kill_step(steps, first_saved)]
    else:
        kill_steps = [check_kill_step(steps, first_saved, plan.kill_at)]
    names = ["killed"] if plan.kills == 1 else [f"killed{number}" for number in range(1, plan.kills + 1)]
    progress(f"run killed with SIGKILL after step {kill_steps[0]} at world size {sizes[0]} ...")
    runs = [run_and_kill(at_a, crash_dir, names[0], kill_steps[0], progress=progress)]
    _check_fresh_start(at_a, reference, runs[0], "")
    places = {record.step: (record.epoch, record.batch_idx) for record in reference.batches if record.rank == 0}
    for name, step in zip(names[1:], kill_steps[1:]):
        epoch, batch_idx = places[step]  # the same records consumed, in steps of world size B
        place = (epoch, batch_idx * sizes[0] // sizes[1])
        progress(f"run resumed at world size {sizes[1]}, killed with SIGKILL at epoch {epoch}, batch {place[1]} ...")
        runs.append(run_and_kill(at_b, crash_dir, name, step, place=place, resume=True, progress=progress))
    progress(f"run resumed at world size {sizes[1]} to the end ...")
    runs.append(run_training(at_b, crash_dir, "resumed", resume=True, progress=progress))
    return compare_resized(reference, runs, sizes, kill_steps, not_resumed=at_a.not_resumed)


def _check_agents(
    launch: CommandLaunch,
    agents: int,
    kill_agent: int,
    work_dir: Path,
    plan: KillPlan,
    progress: Callable[[str], None],
) -> ResizeReport:
    """Both runs with every agent; the second loses one agent with its workers, the others finish."""
    reference_dir, crash_dir = _run_dirs(work_dir)
    progress(f"work directory: {work_dir}")
    progress(f"uninterrupted run, {agents} agents ...")
    reference = _agents_uninterrupted(launch, agents, reference_dir, progress)
    steps, first_saved = _kill_range(reference, launch.needs_checkpoint_records)
    if plan.kill_at is None:
        kill_at = draw_kill_steps(reference, steps, first_saved, 1, plan.seed)[0]
        drawn = f" (drawn with --kill-seed {plan.seed})"
    else:
        kill_at, drawn = check_kill_step(steps, first_saved, plan.kill_at), ""
    world = _world(reference)
    progress(f"run of {agents} agents at world size {world}, agent {kill_agent} killed with SIGKILL with its workers "
             f"after step {kill_at}{drawn} ...")  # fmt: skip
    killed, resumed = _agents_killed(launch, agents, (kill_agent, kill_at), crash_dir, world, progress)
    _check_fresh_start(launch, reference, killed, "")
    report = compare_resized(reference, [killed, resumed], (world, _world(resumed)), [kill_at],
                             not_resumed=launch.not_resumed)  # fmt: skip
    return replace(report, killed_agent=(kill_agent, agents), kill_seed=plan.seed if plan.kill_at is None else None)


def _agents_uninterrupted(
    launch: CommandLaunch, agents: int, reference_dir: Path, progress: Callable[[str], None]
) -> RunRecord:
    """Every agent to the end, their workers started once: the uninterrupted run at the full world size."""
    with hosted_rendezvous() as endpoint:
        run_agents(replace(launch, rendezvous=endpoint), reference_dir, "reference", agents, progress=progress)
    reference = read_round(reference_dir / "reference", 0, "uninterrupted run")
    if not reference.batches:
        raise TrainingRunError(f"the uninterrupted run recorded no batch: {launch.no_batches}")
    if any(reference_dir.glob("reference.restart1.*")):
        raise TrainingRunError(
            "the uninterrupted run's agents restarted their workers (one failed): nothing to compare with; "
            f"see {reference_dir}/reference.agent*.log"
        )
    batch_size_of(reference)  # records are named by their keys: refused now if the batches carry none
    return reference


def _agents_killed(
    launch: CommandLaunch,
    agents: int,
    kill: tuple[int, int],
    crash_dir: Path,
    world: int,
    progress: Callable[[str], None],
) -> tuple[RunRecord, RunRecord]:
    """The run that loses agent I after STEP steps (``kill``): its first round, at the uninterrupted
    run's world size, and the group the agents left re-formed, started once."""
    with hosted_rendezvous() as endpoint:
        run_agents(replace(launch, rendezvous=endpoint), crash_dir, "killed", agents, kill=kill, progress=progress)
    killed = read_round(crash_dir / "killed", 0, "killed run's first round")
    if _world(killed) != world:
        raise TrainingRunError(
            f"the killed run's first round formed at world size {_world(killed)}, the uninterrupted run's at {world}: "
            f"the rendezvous completed before every agent joined; raise its last_call_timeout (--rdzv-conf)"
        )
    resumed = read_round(crash_dir / "killed", 1, "re-formed group")
    if any(crash_dir.glob("killed.restart2.*")):
        raise TrainingRunError(
            f"the agents left after agent {kill[0]} was killed started their workers more than once: verify "
            f"compares one re-formed group; see {crash_dir}/killed.agent*.log"
        )
    if not resumed.batches:
        raise TrainingRunError(
            f"the agents left after agent {kill[0]} was killed trained on no batch in a re-formed group: give "
            f"torchrun --max-restarts 1 or more; see {crash_dir}/killed.agent*.log"
        )
    return killed, resumed


@contextmanager
def hosted_rendezvous() -> Iterator[str]:
    """The endpoint of a TCP store hosted in this process for one run's agents, on a loopback port the
    system picks (port 0: asked once, never raced). torchrun's c10d rendezvous finds the port taken and
    joins as a client, so no agent hosts the store and any agent may be killed."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield f"127.0.0.1:{store.port}"
    finally:
        del store


def read_round(prefix: Path, restart: int, name: str) -> RunRecord:
    """One start of the agents' workers, each rank's steps counted 0, 1, ...: a start counted again
    (steps from 0 twice) means the agents re-formed the group within the round."""
    run = read_run(restart_prefix(prefix, restart))
    for rank in sorted({record.rank for record in run.batches}):
        steps = [record.step for record in run.batches if record.rank == rank]
        again = next((number for number, step in enumerate(steps) if step != number), None)
        if again is not None:
            raise TrainingRunError(
                f"the {name}'s rank {rank} started more than once (after {again} steps its steps count from "
                f"{steps[again]} again): the rendezvous completed before every agent joined and again with them; "
                f"start the agents within its last_call_timeout (--rdzv-conf)"
            )
    return run


def _world(run: RunRecord) -> int:
    return len({record.rank for record in run.batches})


def _resume_point(reference: RunRecord, killed: RunRecord, kill_at: int) -> int:
    """The last checkpoint at or before ``kill_at``: the uninterrupted run's (the same steps in every
    run), else the killed run's own (a command whose checkpoints verify does not see: its successor's start)."""
    saved = [step for step in reference.checkpoint_steps if step <= kill_at]
    return max(saved) if saved else max(killed.checkpoint_steps, default=kill_at)


def draw_kill_steps(reference: RunRecord, steps: int, first_saved: int, kills: int, seed: int) -> list[int]:
    """``kills`` distinct steps of one epoch (the one with the most steps at or after the first
    checkpoint), drawn reproducibly from ``seed``, in order."""
    by_epoch: dict[int, list[int]] = {}
    for record in reference.batches:
        if record.rank == 0 and first_saved <= record.step < steps:
            by_epoch.setdefault(record.epoch, []).append(record.step)
    available = max(by_epoch.values(), key=len, default=[])
    if kills > len(available):
        raise ValueError(
            f"kills (--kills) must be between 1 and {len(available)}: the steps of one epoch at or after the "
            f"first checkpoint (step {first_saved}) that the run reaches, got {kills}"
        )
    return sorted(random.Random(seed).sample(sorted(available), kills))


def _check_contract(launch: Launch, run: RunRecord, name: str, log: Path) -> None:
    """A run that records no batch, or no weights, breaks verify's contract: say how to meet it."""
    if not run.batches:
        raise TrainingRunError(f"the {name} run recorded no batch: {launch.no_batches} (its output: {log})")
    if run.weights is None:
        raise TrainingRunError(f"the {name} run recorded no final weights: {launch.no_weights} (its output: {log})")
    fresh = [record for record in _first_batches(run).values() if record.batch_idx != 0]
    if fresh:
        raise TrainingRunError(
            f"the {name} run, a fresh start in a new directory, began at epoch {fresh[0].epoch}, batch "
            f"{fresh[0].batch_idx} on rank {fresh[0].rank}, not at an epoch's first batch: {launch.shared_checkpoints}"
        )


def _check_fresh_start(launch: Launch, reference: RunRecord, killed: RunRecord, ended: str) -> None:
    """The killed run starts fresh, as the reference did: else it resumed from a checkpoint it was not given."""
    want, got = _first_batches(reference), _first_batches(killed)
    if not got and ended:
        raise TrainingRunError(
            f"the killed run, a fresh start, trained on no batch: {launch.shared_checkpoints}; {ended}"
        )
    for rank, record in sorted(got.items()):
        if rank in want and record.key != want[rank].key:
            raise TrainingRunError(
                f"the killed run, a fresh start, began at epoch {record.epoch}, batch {record.batch_idx} on rank "
                f"{rank}, where the uninterrupted run began at epoch {want[rank].epoch}, batch "
                f"{want[rank].batch_idx}: {launch.shared_checkpoints}"
            )


def _first_batches(run: RunRecord) -> dict[int, BatchRecord]:
    first: dict[int, BatchRecord] = {}
    for record in run.batches:
        first.setdefault(record.rank, record)
    return first


def _run_dirs(work_dir: Path) -> tuple[Path, Path]:
    """The reference and crash directories, made in ``work_dir``; refused when it is not a directory
    or already holds a verification."""
    reference_dir, crash_dir = work_dir / "reference", work_dir / "crash"
    if work_dir.exists() and not work_dir.is_dir():
        raise ValueError(f"work_dir: {str(work_dir)!r} is a file, not a directory; pass a new or empty directory")
    if reference_dir.exists() or crash_dir.exists():
        raise ValueError(f"work_dir: {str(work_dir)!r} already holds a verification; pass a new or empty directory")
    try:
        reference_dir.mkdir(parents=True)
        crash_dir.mkdir()
    except OSError as error:
        raise ValueError(f"work_dir: cannot make a directory in {str(work_dir)!r}: {error.strerror}") from None
    return reference_dir, crash_dir


def default_kill_step(steps: int, first_saved: int) -> int:
    """Mid-run, but after the first checkpoint, so the resumed run replays some steps."""
    return min(max(steps // 2, first_saved + 1), steps - 1)


def check_kill_step(steps: int, first_saved: int, kill_at: int) -> int:
    """A kill step the run reaches, at or after its first checkpoint: else nothing would be resumed."""
    if not first_saved <= kill_at < steps:
        raise ValueError(
            f"kill_at must be at least {first_saved} (the first checkpoint's step) and at most {steps - 1} "
            f"(the last step of the run), got {kill_at}"
        )
    return kill_at


def _kill_range(reference: RunRecord, needs_checkpoint_records: bool) -> tuple[int, int]:
    """The run's step count and its first checkpoint's step before the last step (1 when the run's
    checkpoints are not recorded: a command's own checkpointing is invisible to verify)."""
    steps = 1 + max((record.step for record in reference.batches), default=-1)
    saved = [step for step in reference.checkpoint_steps if 0 < step < steps]
    if not needs_checkpoint_records:
        return steps, min(saved, default=1)
    if not saved:
        raise TrainingRunError(
            f"the uninterrupted run wrote no checkpoint before its last step ({steps} steps): "
            f"lower the ModelCheckpoint's every_n_train_steps"
        )
    return steps, min(saved)
