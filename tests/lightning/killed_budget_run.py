"""``killed_run.py`` for token-budget batches (test_batch_sampler_resume.py): fits over
``DataLoader(ds, batch_sampler=TokenBudgetBatches(...))`` that checkpoint every 4 steps and SIGKILL their
process group, workers included, after step ``KILL_AT``. ``argv`` = directory, then the worker counts. Lightning
is imported once: each fit runs in a child forked into a session of its own (its SIGKILL takes only the child and
its workers), checkpointing to ``directory/workers<N>``; each child's end is printed as ``workers<N>: <exit code>``."""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.lightning.killed_run import KillAt
from tests.lightning.lightning_harness import fit
from tests.lightning.stop_modes import every_4_steps
from tests.lightning.test_batch_sampler_resume import BUDGET_SETUP, BudgetModel


def killed_fit(directory: Path, workers: int) -> int:
    """The exit code of the forked child that ran the fit (-SIGKILL when its kill came)."""
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            fit(BUDGET_SETUP.with_(num_workers=workers), [KillAt(), every_4_steps(directory)], model_class=BudgetModel,
                enable_checkpointing=True)  # fmt: skip
        except BaseException:  # noqa: BLE001 - the parent reports the exit code; the traceback goes to stderr
            traceback.print_exc()
            os._exit(1)
        os._exit(0)  # never back into the parent's loop
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    for workers in map(int, sys.argv[2:]):
        print(f"workers{workers}: {killed_fit(Path(sys.argv[1]) / f'workers{workers}', workers)}", flush=True)
