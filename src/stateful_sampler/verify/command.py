"""How verify runs any training command: the same command twice, the second time to resume.

The command's contract (README, "verify any script"): its batches pass through a
``ResumableLoader`` (or Lightning with ``SamplerCheckpoint``), it checkpoints into the directory
verify gives it and resumes from there when run again, and it calls ``record_weights(model)``
after training. ``{run_dir}`` in the command becomes each run's own directory (also in
``STATEFUL_SAMPLER_RUN_DIR``), ``{devices}`` the ``--devices`` value, ``{rdzv}`` (``--agents``) the
rendezvous endpoint verify hosts for the run's torchrun agents. It runs under ``guard.py``,
so the kill reaches every process a launcher (torchrun, ``accelerate launch``) starts.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from stateful_sampler.verify.recorder import RunRecord

RUN_DIR = "{run_dir}"
DEVICES = "{devices}"
RDZV = "{rdzv}"


@dataclass(frozen=True)
class CommandLaunch:
    arguments: tuple[str, ...]
    devices: int | None
    timeout: float
    needs_checkpoint_records: bool = False  # the command checkpoints on its own; verify does not see it
    rendezvous: str | None = None  # HOST:PORT for {rdzv}: the store verify hosts for one run's agents
    # What breaks verify's contract for a command, and the fix, in a plain script's terms.
    no_batches: ClassVar[str] = (
        "verify records the batches a ResumableLoader hands to the training loop (or Lightning's, with "
        "SamplerCheckpoint in the Trainer's callbacks) and the command's batches passed through neither: "
        "iterate loader = ResumableLoader(DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), "
        "batch_size=B)), in a process that inherits verify's environment"
    )
    no_weights: ClassVar[str] = (
        "call stateful_sampler.verify.record_weights(model) once after training (on every rank or on "
        "rank 0; Lightning with SamplerCheckpoint records them by itself)"
    )
    not_resumed: ClassVar[str] = (
        "the loader's state was not restored. When the command runs again, it must load its last checkpoint "
        "from {run_dir} and pass the loader state saved there to loader.load_state_dict(...) of its "
        "ResumableLoader (not the sampler's drawn position), as it passes the model's and the optimizer's "
        "states to theirs"
    )
    shared_checkpoints: ClassVar[str] = (
        "it resumed from a checkpoint another run left. Each run must keep its checkpoints in the "
        "directory verify gives it: write {run_dir} in the command where it takes its checkpoint "
        "directory (verify also sets STATEFUL_SAMPLER_RUN_DIR), not a fixed path"
    )

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
        if self.rendezvous is not None:
            arguments = [argument.replace(RDZV, self.rendezvous) for argument in arguments]
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
