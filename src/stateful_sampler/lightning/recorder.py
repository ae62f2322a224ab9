"""What a recorded training run leaves behind, and the callback that records it.

Per rank, one JSON line per batch that reached ``training_step`` (its fingerprint, and indices
when the batch carries them) and one per checkpoint saved; on rank 0, the final weights; and,
when LightningCLI refuses the config, the reason in one line. A run told to pause at a step
tells its parent through a FIFO and waits there to be killed, so the kill lands at an exact,
reproducible point after the checkpoints before it were written.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from stateful_sampler.lightning.fingerprint import batch_fingerprint, batch_indices

RECORD_ENV = "STATEFUL_SAMPLER_RECORD"  # path prefix of the run's record files
PAUSE_AT_ENV = "STATEFUL_SAMPLER_PAUSE_AT"  # global step at whose next batch the run waits to be killed
NOTIFY_ENV = "STATEFUL_SAMPLER_NOTIFY"  # FIFO on which a paused rank says so
PAUSE_LIMIT_SECONDS = 600  # a paused run nobody kills exits with an error instead of hanging forever


@dataclass(frozen=True)
class BatchRecord:
    rank: int
    epoch: int
    batch_idx: int
    step: int  # optimizer steps done before this batch (trainer.global_step)
    fingerprint: str
    indices: list[int] | None

    @property
    def key(self) -> tuple[int, int, int]:
        """Where the batch sits in training: equal keys in two runs must hold equal batches."""
        return (self.epoch, self.batch_idx, self.rank)


@dataclass(frozen=True)
class RunRecord:
    batches: list[BatchRecord]  # in training order, rank by rank
    checkpoint_steps: list[int]  # global steps at which rank 0 saved a checkpoint
    weights: dict[str, torch.Tensor] | None  # final weights; None when the run never finished


def weights_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + ".weights.pt")


def rank_path(prefix: Path, rank: int) -> Path:
    return prefix.with_name(f"{prefix.name}.rank{rank}.jsonl")


def config_problem_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + ".config-problem.txt")


def read_run(prefix: Path) -> RunRecord:
    batches: list[BatchRecord] = []
    checkpoint_steps: list[int] = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}.rank*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            kind = entry.pop("kind")
            if kind == "batch":
                batches.append(BatchRecord(**entry))
            elif entry["rank"] == 0:
                checkpoint_steps.append(entry["step"])
    weights = torch.load(weights_path(prefix)) if weights_path(prefix).exists() else None
    return RunRecord(batches, checkpoint_steps, weights)


class BatchRecorder(Callback):
    """Records each batch as it reaches ``training_step``; injected by the verify runner."""

    def __init__(self, prefix: Path, pause_at: int | None = None, notify: Path | None = None) -> None:
        self.prefix = prefix
        self.pause_at = pause_at
        self.notify = notify
        self._file: Any = None

    @classmethod
    def from_environment(cls) -> BatchRecorder:
        pause_at = os.environ.get(PAUSE_AT_ENV)
        notify = os.environ.get(NOTIFY_ENV)
        return cls(
            Path(os.environ[RECORD_ENV]),
            int(pause_at) if pause_at else None,
            Path(notify) if notify else None,
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._file = rank_path(self.prefix, trainer.global_rank).open("a", buffering=1)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.pause_at is not None and trainer.global_step >= self.pause_at:
            self._wait_to_be_killed(trainer)
        record = BatchRecord(
            trainer.global_rank,
            trainer.current_epoch,
            batch_idx,
            trainer.global_step,
            batch_fingerprint(batch),
            batch_indices(batch),
        )
        self._write({"kind": "batch", **asdict(record)})

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._write({"kind": "checkpoint", "rank": trainer.global_rank, "step": trainer.global_step})

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            weights = {name: tensor.detach().cpu() for name, tensor in pl_module.state_dict().items()}
            torch.save(weights, weights_path(self.prefix))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(entry) + "\n")

    def _wait_to_be_killed(self, trainer: Trainer) -> None:
        if self.notify is None:
            raise ValueError(f"{PAUSE_AT_ENV} is set but {NOTIFY_ENV} is not: a paused run must tell its parent")
        try:  # non-blocking: with no parent reading, a blocking open would wait forever
            fifo = os.open(self.notify, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:
                raise
            print(f"paused at step {self.pause_at}, but no process reads {self.notify}: its parent is gone",
                  file=sys.stderr)  # fmt: skip
            os._exit(3)
        os.write(fifo, f"{trainer.global_rank} {trainer.world_size}\n".encode())  # one short write: atomic
        os.close(fifo)
        threading.Event().wait(PAUSE_LIMIT_SECONDS)
        print(f"paused at step {self.pause_at} and not killed within {PAUSE_LIMIT_SECONDS} s", file=sys.stderr)
        os._exit(3)
