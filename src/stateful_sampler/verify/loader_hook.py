"""Recording a script that ``stateful-sampler verify -- COMMAND`` runs, without editing it.

verify sets ``STATEFUL_SAMPLER_RECORD`` and names its plug-in (``verify.plugin``) in the run's
environment; the plug-in installs a ``LazyLoaderRecording`` on the core's hooks, which records every
batch any ``ResumableLoader`` hands to the loop once it has claimed the process's recorder.
A batch's place is the sampler's: its epoch and the batches of that epoch before it (taken when the
pass starts, so a resumed pass counts from the restored position), not a count the script keeps.
Each time a ``ResumableLoader`` gives its state, a checkpoint is recorded at the batches consumed so
far. The script's one edit is ``record_weights(model)`` after training, a no-op unless verify runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from stateful_sampler.ranks import in_process_group, process_rank
from stateful_sampler.resumable import ResumableOrder
from stateful_sampler.verify.recorder import RECORD_ENV, Recorder, claim_recorder

_UNCLAIMED = object()


class LazyLoaderRecording:
    """One process's recording of its ``ResumableLoader`` batches: where each sampler's pass started,
    and the batches consumed so far. The recorder is claimed at the first pass, so a
    ``SamplerCheckpoint`` set up before it (Lightning) records the fit instead, with Lightning's steps."""

    def __init__(self) -> None:
        self._recorder: Any = _UNCLAIMED
        self.steps = 0  # batches this process consumed: the step count of a fresh run
        self.pass_starts: dict[int, tuple[int, int]] = {}  # id(sampler) -> (epoch, batches before the pass)

    @property
    def recorder(self) -> Recorder | None:
        if self._recorder is _UNCLAIMED:
            self._recorder = claim_recorder()
        return self._recorder

    def pass_started(self, sampler: ResumableOrder) -> None:
        if self.recorder is None:
            return
        before = len(sampler) - sampler.remaining_length()  # read before the pass moves the cursor
        self.pass_starts[id(sampler)] = (sampler.epoch, before // (sampler.batch_size or 1))

    def batch(self, loader: Any, batch: Any, consumed: int) -> None:
        sampler = loader.sampler
        if self.recorder is None or id(sampler) not in self.pass_starts:
            return
        epoch, before = self.pass_starts[id(sampler)]
        self.recorder.batch(
            batch,
            rank=sampler.rank,
            world_size=sampler.num_replicas,
            epoch=epoch,
            batch_idx=before + consumed - 1,
            step=self.steps,
        )
        self.steps += 1

    def state_taken(self, loader: Any, consumed: int) -> None:
        """A checkpoint is being taken, after the batches this process consumed so far."""
        if self.recorder is not None:
            self.recorder.checkpoint(rank=loader.sampler.rank, step=self.steps)


def record_weights(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
    """Save the final weights for verify to compare bitwise (rank 0 only); a no-op outside verify.

    Call it once, after training, in a script that ``stateful-sampler verify -- COMMAND`` runs.

    Example:
        >>> from stateful_sampler.verify import record_weights
        >>> record_weights(torch.nn.Linear(2, 1))   # outside verify: does nothing
    """
    if not os.environ.get(RECORD_ENV):
        return
    if isinstance(model, torch.nn.Module):
        model = model.state_dict()
    if not isinstance(model, Mapping):
        raise TypeError(f"record_weights needs a torch.nn.Module or a state dict, got {type(model).__name__}")
    rank = process_rank() if in_process_group() else int(os.environ.get("RANK", "0"))
    if rank == 0:
        Recorder.from_environment().weights(model)
