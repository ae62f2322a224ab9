"""``killed_run.py`` for token-budget batches (test_batch_sampler_resume.py): a fit over
``DataLoader(ds, batch_sampler=TokenBudgetBatches(...))`` that checkpoints every 4 steps and SIGKILLs its
process group, workers included, after step ``KILL_AT``. ``argv`` = checkpoint directory, number of workers."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.lightning.killed_run import KillAt
from tests.lightning.lightning_harness import fit
from tests.lightning.stop_modes import every_4_steps
from tests.lightning.test_batch_sampler_resume import BUDGET_SETUP, BudgetModel

if __name__ == "__main__":
    directory, workers = Path(sys.argv[1]), int(sys.argv[2])
    fit(BUDGET_SETUP.with_(num_workers=workers), [KillAt(), every_4_steps(directory)], model_class=BudgetModel,
        enable_checkpointing=True)  # fmt: skip
