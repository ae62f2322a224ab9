"""A user's Lightning script that never imports stateful_sampler: ddp_spawn on 2 CPU processes (issue 25, item 8),
first with what the installed package adds to its Trainer, then opted out of it the way a user does
(STATEFUL_SAMPLER_NO_LIGHTNING_GUARD=1 in the environment before the Trainer is made)."""

import os
import sys

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel


def fit(name: str) -> None:
    trainer = Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_steps=3, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=sys.argv[1])  # fmt: skip
    print(f"{name} callbacks:", ",".join(type(callback).__name__ for callback in trainer.callbacks))
    trainer.fit(BoringModel())
    print(f"{name} finished:", trainer.state.finished, flush=True)


if __name__ == "__main__":
    fit("guarded")
    os.environ["STATEFUL_SAMPLER_NO_LIGHTNING_GUARD"] = "1"
    fit("opted-out")
