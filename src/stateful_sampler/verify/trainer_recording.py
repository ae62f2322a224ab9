"""Recording a Lightning fit for verify, for either package: what the hooks of a ``Trainer`` report.

Used by verify's LightningCLI callback and by ``SamplerCheckpoint`` itself (so a Lightning script
that ``stateful-sampler verify -- COMMAND`` runs is recorded without an edit). The trainer is only
read, never imported: ``lightning.pytorch`` and ``pytorch_lightning`` trainers both fit.
"""

from __future__ import annotations

from typing import Any

from stateful_sampler.verify.recorder import Recorder, claim_recorder


class TrainerRecording:
    """Each batch as it reaches ``training_step``, each checkpoint, and the final weights on rank 0."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    @classmethod
    def claim(cls) -> TrainerRecording | None:
        recorder = claim_recorder()
        return None if recorder is None else cls(recorder)

    def batch(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        self.recorder.batch(
            batch,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            epoch=trainer.current_epoch,
            batch_idx=batch_idx,
            step=trainer.global_step,
        )

    def checkpoint(self, trainer: Any) -> None:
        self.recorder.checkpoint(rank=trainer.global_rank, step=trainer.global_step)

    def train_end(self, trainer: Any, module: Any) -> None:
        if trainer.is_global_zero:
            self.recorder.weights(module.state_dict())

    def close(self) -> None:
        self.recorder.close()
