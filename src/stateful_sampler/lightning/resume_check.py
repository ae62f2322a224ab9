"""Run a config three times (uninterrupted; killed with SIGKILL mid-epoch; resumed from
``last.ckpt``) and compare them: the check behind ``stateful-sampler verify`` and
``stateful_sampler.testing.assert_resume_equal``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from stateful_sampler.checks import check_int
from stateful_sampler.lightning.compare import ResumeReport, compare_runs
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
    settings = RunSettings(Path(config).resolve(), config_seed(config, progress), devices, timeout)
    if kill_at is not None:
        kill_at = check_int("kill_at", kill_at, minimum=1)
    if work_dir is not None:
        return _check(settings, Path(work_dir), kill_at, progress)
    with tempfile.TemporaryDirectory(prefix="stateful-sampler-verify-") as temporary:
        return _check(settings, Path(temporary), kill_at, progress)


def config_seed(config: str | Path, progress: Callable[[str], None]) -> int:
    """The config's ``seed_everything`` when it is an int: both runs must start from the same weights."""
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"config: no LightningCLI YAML config at {str(path)!r}")
    loaded: Any = yaml.safe_load(path.read_text()) or {}
    seed = loaded.get("seed_everything") if isinstance(loaded, dict) else None
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    progress(f"seed_everything is {seed!r} in the config; every run uses seed_everything={DEFAULT_SEED}")
    return DEFAULT_SEED


def _check(settings: RunSettings, work_dir: Path, kill_at: int | None, progress: Callable[[str], None]) -> ResumeReport:
    reference_dir, crash_dir = work_dir / "reference", work_dir / "crash"
    if reference_dir.exists() or crash_dir.exists():
        raise ValueError(f"work_dir: {str(work_dir)!r} already holds a verification; pass a new or empty directory")
    reference_dir.mkdir(parents=True)
    crash_dir.mkdir()
    progress("uninterrupted run ...")
    reference = run_training(settings, reference_dir, "reference")
    kill_at = default_kill_step(reference) if kill_at is None else kill_at
    progress(f"run killed with SIGKILL after step {kill_at} ...")
    killed = run_and_kill(settings, crash_dir, "killed", kill_at)
    progress(f"run resumed from the last checkpoint (step {max(killed.checkpoint_steps, default='none')}) ...")
    resumed = run_training(settings, crash_dir, "resumed", resume=True)
    return compare_runs(reference, killed, resumed, kill_at)


def default_kill_step(reference: RunRecord) -> int:
    """Mid-run, but after the first checkpoint, so the resumed run replays some steps."""
    steps = 1 + max((record.step for record in reference.batches), default=-1)
    saved = [step for step in reference.checkpoint_steps if 0 < step < steps]
    if not saved:
        raise TrainingRunError(
            f"the uninterrupted run wrote no checkpoint before its last step ({steps} steps): "
            f"lower the ModelCheckpoint's every_n_train_steps"
        )
    return min(max(steps // 2, min(saved) + 1), steps - 1)
