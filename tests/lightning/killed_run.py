"""A training process that kills itself, and its DataLoader workers, with SIGKILL mid-epoch.

Started by ``test_stop_modes.py`` in a new session: ``argv`` = checkpoint directory, number of
workers, 1 for a ``StatefulDataLoader``. It checkpoints every 4 steps (``last.ckpt``) and sends
SIGKILL to its whole process group after step ``KILL_AT``, before anything else runs.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.lightning.lightning_harness import Callback, Setup, Trainer, fit
from tests.lightning.stop_modes import KILL_AT, STOP_SETUP, every_4_steps


class KillAt(Callback):
    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == KILL_AT:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def main(directory: Path, num_workers: int, stateful_loader: bool) -> None:
    setup: Setup = STOP_SETUP.with_(num_workers=num_workers, stateful_loader=stateful_loader)
    fit(setup, [KillAt(), every_4_steps(directory)], enable_checkpointing=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
