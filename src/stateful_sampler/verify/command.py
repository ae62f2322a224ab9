"""How verify runs any training command: the same command twice, the second time to resume.

The command's contract (README, "verify any script"): its batches pass through a
``ResumableLoader`` (or Lightning with ``SamplerCheckpoint``), it checkpoints into the directory
verify gives it and resumes from there when run again, and it calls ``record_weights(model)``
after training. ``{run_dir}`` in the command becomes each run's own directory (also in
``STATEFUL_SAMPLER_RUN_DIR``), ``{devices}`` the ``--devices`` value. It runs under ``guard.py``,
so the kill reaches every process a launcher (torchrun, ``accelerate launch``) starts.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stateful_sampler.verify.recorder import RunRecord

RUN_DIR = "{run_dir}"
DEVICES = "{devices}"


@dataclass(frozen=True)
class CommandLaunch:
    arguments: tuple[str, ...]
    devices: int | None
    timeout: float
    needs_checkpoint_records: bool = False  # the command checkpoints on its own; verify does not see it

    @classmethod
    def checked(cls, command: Any, devices: int | None, timeout: float) -> CommandLaunch:
        if not command or not all(isinstance(argument, str) for argument in command):
            raise TypeError(f"command must be a non-empty list of str, got {command!r}")
        if devices is not None and not any(DEVICES in argument for argument in command):
            raise ValueError(
                f"devices: the command has no {DEVICES} to put {devices} in; write it where the command takes "
                f"its process count, e.g. torchrun --nproc-per-node {DEVICES} ..."
            )
        return cls(tuple(command), devices, timeout)

    def describe(self) -> str:
        return shlex.join(self.arguments)

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        """The same command for every run (resuming is the command's own business), in its directory."""
        arguments = [argument.replace(RUN_DIR, str(run_dir)) for argument in self.arguments]
        if self.devices is not None:
            arguments = [argument.replace(DEVICES, str(self.devices)) for argument in arguments]
        return [sys.executable, "-m", "stateful_sampler.verify.guard", *arguments]

    def settle(self, reference: RunRecord, killed: RunRecord, resumed: RunRecord) -> tuple[RunRecord, RunRecord]:
        """The resumed process counts its steps from 0: each of its batches takes the step of the
        reference batch at the same place. The checkpoint it resumed from is where its first batch
        is, when the killed run's checkpoints were not recorded."""
        steps = {record.key: record.step for record in reference.batches}
        resumed = replace(
            resumed, batches=[replace(record, step=steps.get(record.key, record.step)) for record in resumed.batches]
        )
        if not killed.checkpoint_steps and resumed.batches and resumed.batches[0].step > 0:
            killed = replace(killed, checkpoint_steps=[resumed.batches[0].step])
        return killed, resumed
