"""Run a config three times (uninterrupted; killed with SIGKILL mid-epoch; resumed from
``last.ckpt``) and compare them: the check behind ``stateful-sampler verify`` and
``stateful_sampler.testing.assert_resume_equal``."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from stateful_sampler.checks import check_int
from stateful_sampler.lightning.compare import ResumeReport, compare_runs
from stateful_sampler.lightning.config import read_config
from stateful_sampler.lightning.recorder import RunRecord
from stateful_sampler.lightning.runner import RunSettings, TrainingRunError, run_and_kill, run_training

DEFAULT_SEED = 0  # used when the config leaves seed_everything random or off
DEFAULT_TIMEOUT = 600.0


def check_resume(
    config: str | Path,
    *,
    kill_at: int | None = None,
    devices: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    work_dir: str | Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> ResumeReport:
    """Compare an uninterrupted run of ``config`` with one killed after ``kill_at`` optimizer steps
    (default: mid-run, after the first checkpoint) and resumed with ``ckpt_path="last"``.

    ``work_dir`` keeps the runs' records, checkpoints and logs; by default a temporary directory.
    """
    config = _check_path("config", config)
    timeout = check_timeout(timeout)
    if kill_at is not None:
        kill_at = check_int("kill_at", kill_at, minimum=1)
    settings = RunSettings(config.resolve(), config_seed(config, progress), devices, timeout)
    if work_dir is not None:
        return _check(settings, _check_path("work_dir", work_dir), kill_at, progress)
    with tempfile.TemporaryDirectory(prefix="stateful-sampler-verify-") as temporary:
        return _check(settings, Path(temporary), kill_at, progress)


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


def config_seed(config: str | Path, progress: Callable[[str], None]) -> int:
    """The config's ``seed_everything`` when it is an int: both runs must start from the same weights."""
    seed = read_config(config).get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    progress(f"seed_everything is {seed!r} in the config; every run uses seed_everything={DEFAULT_SEED}")
    return DEFAULT_SEED


def _check(settings: RunSettings, work_dir: Path, kill_at: int | None, progress: Callable[[str], None]) -> ResumeReport:
    reference_dir, crash_dir = _run_dirs(work_dir)
    progress("uninterrupted run ...")
    reference = run_training(settings, reference_dir, "reference")
    kill_at = default_kill_step(reference) if kill_at is None else check_kill_step(reference, kill_at)
    progress(f"run killed with SIGKILL after step {kill_at} ...")
    killed = run_and_kill(settings, crash_dir, "killed", kill_at)
    progress(f"run resumed from the last checkpoint (step {max(killed.checkpoint_steps, default='none')}) ...")
    resumed = run_training(settings, crash_dir, "resumed", resume=True)
    return compare_runs(reference, killed, resumed, kill_at)


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


def default_kill_step(reference: RunRecord) -> int:
    """Mid-run, but after the first checkpoint, so the resumed run replays some steps."""
    steps, first_saved = _kill_range(reference)
    return min(max(steps // 2, first_saved + 1), steps - 1)


def check_kill_step(reference: RunRecord, kill_at: int) -> int:
    """A kill step the run reaches, at or after its first checkpoint: else nothing would be resumed."""
    steps, first_saved = _kill_range(reference)
    if not first_saved <= kill_at < steps:
        raise ValueError(
            f"kill_at must be at least {first_saved} (the first checkpoint's step) and at most {steps - 1} "
            f"(the last step of the run), got {kill_at}"
        )
    return kill_at


def _kill_range(reference: RunRecord) -> tuple[int, int]:
    """The run's step count and its first checkpoint's step before the last step."""
    steps = 1 + max((record.step for record in reference.batches), default=-1)
    saved = [step for step in reference.checkpoint_steps if 0 < step < steps]
    if not saved:
        raise TrainingRunError(
            f"the uninterrupted run wrote no checkpoint before its last step ({steps} steps): "
            f"lower the ModelCheckpoint's every_n_train_steps"
        )
    return steps, min(saved)
