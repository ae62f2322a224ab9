"""What a recorded training run leaves behind, and the writer that records it, for any framework.

Per rank, one JSON line per batch that reached the training loop (its fingerprint, indices when
the batch carries them, and a fingerprint of the process's RNG states at that moment, which tells a
model whose dropout was not restored from a data divergence) and one per checkpoint saved; on rank 0, the final weights; and,
when LightningCLI refuses the config, the reason in one line. A run told to pause at a step
tells its parent through a FIFO and waits there to be killed, so the kill lands at an exact,
reproducible point after the checkpoints before it were written.

verify switches recording on from outside, through ``RECORD_ENV``: the user's code is not edited.
The LightningCLI runner injects a callback; any other script is recorded by verify's plug-in
(``verify.plugin``, loaded by the core where its batches pass through a ``ResumableLoader`` or
``SamplerCheckpoint``) and calls ``record_weights`` at the end.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from stateful_sampler.verify.fingerprint import batch_fingerprint, batch_indices, batch_rows, rng_fingerprints

RECORD_ENV = "STATEFUL_SAMPLER_RECORD"  # path prefix of the run's record files
PAUSE_AT_ENV = "STATEFUL_SAMPLER_PAUSE_AT"  # step at whose next batch the run waits to be killed
# "EPOCH:BATCH": the place in training at which the run waits to be killed; a resumed process counts
# its steps from 0 under some hooks and from the checkpoint under others, its places are the same.
PAUSE_AT_PLACE_ENV = "STATEFUL_SAMPLER_PAUSE_AT_PLACE"
NOTIFY_ENV = "STATEFUL_SAMPLER_NOTIFY"  # FIFO on which a paused rank says so
# Set: each start of the workers by a torchrun agent records apart, in PREFIX.restart<N> (N its
# TORCHELASTIC_RESTART_COUNT), so the group an agent re-forms after a re-rendezvous is a run of its own.
RECORD_RESTARTS_ENV = "STATEFUL_SAMPLER_RECORD_RESTARTS"
PAUSE_LIMIT_SECONDS = 600  # a paused run nobody kills exits with an error instead of hanging forever


@dataclass(frozen=True)
class BatchRecord:
    rank: int
    epoch: int
    batch_idx: int  # the batch's place in its epoch, counted from the epoch's start
    step: int  # steps done before this batch (Lightning: trainer.global_step; a loader: batches consumed)
    fingerprint: str
    indices: list[int] | None
    rng: dict[str, str] | None = None  # fingerprint of each RNG of the process as the batch reached the loop
    rows: list[str] | None = None  # fingerprint of each record, when the batch has no indices (--resize)

    @property
    def key(self) -> tuple[int, int, int]:
        """Where the batch sits in training: equal keys in two runs must hold equal batches."""
        return (self.epoch, self.batch_idx, self.rank)


@dataclass(frozen=True)
class RunRecord:
    batches: list[BatchRecord]  # in training order, rank by rank
    checkpoint_steps: list[int]  # steps at which rank 0 saved a checkpoint (empty: none seen)
    weights: dict[str, torch.Tensor] | None  # final weights; None when the run never finished


def weights_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + ".weights.pt")


def rank_path(prefix: Path, rank: int) -> Path:
    return prefix.with_name(f"{prefix.name}.rank{rank}.jsonl")


def restart_prefix(prefix: Path, restart: int) -> Path:
    """Where the workers' ``restart``-th start records under ``RECORD_RESTARTS_ENV``."""
    return prefix.with_name(f"{prefix.name}.restart{restart}")


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


_claimed = False


def claim_recorder() -> Recorder | None:
    """This process's recorder, to the first hook that asks when verify set ``RECORD_ENV``; else None.

    Several hooks can see the same batches (verify's LightningCLI callback, ``SamplerCheckpoint``,
    ``ResumableLoader``): only the first to claim records, so no batch is recorded twice."""
    global _claimed
    if _claimed or not os.environ.get(RECORD_ENV):
        return None
    _claimed = True
    return Recorder.from_environment()


class Recorder:
    """Writes one run's records: each rank appends to its own file, rank 0 writes the weights."""

    def __init__(
        self,
        prefix: Path,
        pause_at: int | None = None,
        notify: Path | None = None,
        pause_at_place: tuple[int, int] | None = None,
    ) -> None:
        self.prefix = prefix
        self.pause_at = pause_at
        self.pause_at_place = pause_at_place
        self.notify = notify
        self._files: dict[int, IO[str]] = {}

    @classmethod
    def from_environment(cls) -> Recorder:
        pause_at = os.environ.get(PAUSE_AT_ENV)
        notify = os.environ.get(NOTIFY_ENV)
        place = os.environ.get(PAUSE_AT_PLACE_ENV)
        epoch, _, batch_idx = place.partition(":") if place else ("", "", "")
        prefix = Path(os.environ[RECORD_ENV])
        if os.environ.get(RECORD_RESTARTS_ENV):
            prefix = restart_prefix(prefix, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        return cls(
            prefix,
            int(pause_at) if pause_at else None,
            Path(notify) if notify else None,
            (int(epoch), int(batch_idx)) if place else None,
        )

    def batch(self, batch: Any, *, rank: int, world_size: int, epoch: int, batch_idx: int, step: int) -> None:
        """Record a batch as the loop receives it; first wait to be killed if the run pauses at ``step``."""
        if (self.pause_at is not None and step >= self.pause_at) or (
            self.pause_at_place is not None and (epoch, batch_idx) >= self.pause_at_place
        ):
            self.wait_to_be_killed(rank, world_size)
        indices = batch_indices(batch)
        rows = batch_rows(batch) if indices is None else None
        record = BatchRecord(rank, epoch, batch_idx, step, batch_fingerprint(batch), indices, rng_fingerprints(), rows)
        self._write(rank, {"kind": "batch", **asdict(record)})

    def checkpoint(self, *, rank: int, step: int) -> None:
        self._write(rank, {"kind": "checkpoint", "rank": rank, "step": step})

    def weights(self, state: Mapping[str, torch.Tensor]) -> None:
        torch.save({name: tensor.detach().cpu() for name, tensor in state.items()}, weights_path(self.prefix))

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()

    def _write(self, rank: int, entry: dict[str, Any]) -> None:
        if rank not in self._files:
            self._files[rank] = rank_path(self.prefix, rank).open("a", buffering=1)
        self._files[rank].write(json.dumps(entry) + "\n")

    def wait_to_be_killed(self, rank: int, world_size: int) -> None:
        if self.notify is None:
            raise ValueError(
                f"{PAUSE_AT_ENV} or {PAUSE_AT_PLACE_ENV} is set but {NOTIFY_ENV} is not: a paused run must tell its parent"
            )
        try:  # non-blocking: with no parent reading, a blocking open would wait forever
            fifo = os.open(self.notify, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:
                raise
            print(f"paused at step {self.pause_at or self.pause_at_place}, but no process reads {self.notify}: its parent is gone",
                  file=sys.stderr)  # fmt: skip
            os._exit(3)
        os.write(fifo, f"{rank} {world_size}\n".encode())  # one short write: atomic
        os.close(fifo)
        threading.Event().wait(PAUSE_LIMIT_SECONDS)
        print(
            f"paused at step {self.pause_at or self.pause_at_place} and not killed within {PAUSE_LIMIT_SECONDS} s",
            file=sys.stderr,
        )
        os._exit(3)
