"""A user's Lightning script that never imports stateful_sampler: ddp_spawn on 2 CPU processes (issue 25, item 8)."""

import sys

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

if __name__ == "__main__":
    trainer = Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_steps=3, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=sys.argv[1])  # fmt: skip
    print("callbacks:", ",".join(type(callback).__name__ for callback in trainer.callbacks))
    trainer.fit(BoringModel())
    print("finished:", trainer.state.finished)
