"""Pytest helpers: put resume equality of your own Lightning setup into your test suite.

Lightning is imported only when a helper runs, so importing this module stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_resume_equal(
    config: str | Path,
    *,
    kill_at: int | None = None,
    devices: int | None = None,
    timeout: float = 600.0,
    work_dir: str | Path | None = None,
) -> Any:
    """Run a LightningCLI config uninterrupted, then killed with SIGKILL after ``kill_at`` optimizer
    steps and resumed with ``ckpt_path="last"``; raise ``AssertionError`` naming the first
    divergence (step, rank, fingerprints, indices) or differing weight. Returns the report.

    The config needs a ``ModelCheckpoint(every_n_train_steps=..., save_last=True)``. What prevents
    the check from running raises instead: ``TypeError`` for a ``config`` or ``work_dir`` that is not
    a path, ``FileNotFoundError`` for a missing config, ``ValueError`` naming what is wrong with the
    config (LightningCLI's reason, in one line), ``kill_at``, ``timeout`` or ``work_dir``, and
    ``TrainingRunError`` for a run that crashed or overstayed ``timeout``.
    """
    from stateful_sampler.lightning.resume_check import check_resume
    from stateful_sampler.lightning.verify import format_report

    report = check_resume(config, kill_at=kill_at, devices=devices, timeout=timeout, work_dir=work_dir)
    if not report.equal:
        raise AssertionError(format_report(report))
    return report
