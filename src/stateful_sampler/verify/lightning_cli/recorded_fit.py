"""The training process the verify runner starts: the user's config under ``fit``, recorded.

``python -m stateful_sampler.verify.lightning_cli.recorded_fit fit --config CONFIG.yaml ...`` is
``LightningCLI`` plus a ``BatchRecorder`` (configured from the environment by the runner), with
every ``ModelCheckpoint`` redirected into the run's own directory, so a verification never
writes into the user's checkpoint folders and two runs never resume from each other's files.
A config LightningCLI refuses leaves its reason in one line for verify to show, not a usage text;
so does a fit whose ``StatefulSampler`` has no ``SamplerCheckpoint``, at the start of the first run:
its resume would be refused, after a whole uninterrupted training.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from stateful_sampler.lightning.callback import SamplerCheckpointHooks
from stateful_sampler.lightning.loaders import train_samplers
from stateful_sampler.verify.errors import ConfigError
from stateful_sampler.verify.lifeline import watch_lifeline
from stateful_sampler.verify.lightning_cli.config import parse_problem
from stateful_sampler.verify.recorder import RECORD_ENV, config_problem_path
from stateful_sampler.verify.trainer_recording import TrainerRecording


class BatchRecorder(Callback):
    """Records each batch as it reaches ``training_step``, each checkpoint and the final weights."""

    def __init__(self, recording: TrainerRecording) -> None:
        self.recording = recording

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        callbacks = trainer.callbacks  # type: ignore[attr-defined]  # set by Trainer.__init__
        if train_samplers(trainer) and not any(isinstance(callback, SamplerCheckpointHooks) for callback in callbacks):
            raise ConfigError(
                "trainer.callbacks: the train dataloader draws from a StatefulSampler, but SamplerCheckpoint is not "
                "among the Trainer's callbacks: without it Lightning cannot resume the sampler exactly, and the "
                "resumed run would be refused. Add {class_path: stateful_sampler.lightning.SamplerCheckpoint} to "
                "trainer.callbacks"
            )

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.recording.batch(trainer, batch, batch_idx)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.recording.checkpoint(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recording.train_end(trainer, pl_module)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.recording.close()


class RecordedFitCLI(LightningCLI):
    def before_fit(self) -> None:
        callbacks = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Trainer.__init__
        checkpoints = [callback for callback in callbacks if isinstance(callback, ModelCheckpoint)]
        # private: ModelCheckpoint keeps every_n_train_steps only as _every_n_train_steps
        if not any(callback._every_n_train_steps and callback.save_last for callback in checkpoints):
            raise ConfigError(
                "trainer.callbacks: verify needs a step-based ModelCheckpoint that keeps last.ckpt, e.g. "
                "{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
                "{every_n_train_steps: 20, save_last: true}}, so the killed run leaves a checkpoint to resume "
                f"from; found {[repr(callback) for callback in checkpoints] or 'none'}"
            )
        for number, callback in enumerate(checkpoints):
            callback.dirpath = str(Path(self.trainer.default_root_dir) / f"checkpoints-{number}")


def main() -> None:
    watch_lifeline()
    recording = TrainerRecording.claim()  # first: SamplerCheckpoint in the config must not record too
    if recording is None:
        raise ValueError(f"recorded_fit records for verify, which sets {RECORD_ENV}; it is not set")
    try:
        RecordedFitCLI(
            trainer_defaults={"callbacks": [BatchRecorder(recording)]},
            save_config_callback=None,
            parser_kwargs={"exit_on_error": False},
        )
    except (ArgumentError, ConfigError) as error:
        problem = parse_problem(error) if isinstance(error, ArgumentError) else str(error)
        config_problem_path(Path(os.environ[RECORD_ENV])).write_text(problem)
        sys.exit(f"config problem: {problem}")


if __name__ == "__main__":
    main()
