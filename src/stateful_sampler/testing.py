"""Pytest helpers: put resume equality of your own training setup into your test suite.

Lightning is imported only when a helper runs on a LightningCLI config, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def assert_resume_equal(
    run: str | Path | Sequence[str],
    *,
    kill_at: int | None = None,
    devices: int | None = None,
    timeout: float = 600.0,
    work_dir: str | Path | None = None,
) -> Any:
    """Run a training uninterrupted, then killed with SIGKILL after ``kill_at`` steps and resumed;
    raise ``AssertionError`` naming the first divergence (step, rank, fingerprints, indices) or
    differing weight. Returns the report.

    ``run`` is a LightningCLI config (a path), resumed with ``ckpt_path="last"``; it needs a
    ``ModelCheckpoint(every_n_train_steps=..., save_last=True)``. Or it is a command (a list of
    str, e.g. ``[sys.executable, "train.py", "--root", "{run_dir}"]``), run again to resume, that
    meets ``stateful-sampler verify``'s contract for commands (README). What prevents the check from
    running raises instead: ``TypeError`` for a ``run`` or ``work_dir`` of the wrong type,
    ``FileNotFoundError`` for a missing config, ``ValueError`` naming what is wrong with the config
    (LightningCLI's reason, in one line), ``kill_at``, ``devices``, ``timeout`` or ``work_dir``, and
    ``TrainingRunError`` for a run that crashed or overstayed ``timeout``.

    Example:
        >>> assert_resume_equal([sys.executable, "train.py", "--root", "{run_dir}"], kill_at=25)  # doctest: +SKIP
    """
    from stateful_sampler.verify.cli import format_report
    from stateful_sampler.verify.resume_check import check_resume

    report = check_resume(run, kill_at=kill_at, devices=devices, timeout=timeout, work_dir=work_dir)
    if not report.equal:
        raise AssertionError(format_report(report))
    return report
