"""Refuse a Lightning resume of ``StatefulSampler`` train loaders when ``SamplerCheckpoint`` is missing.

Lightning's checkpoint does not hold a sampler's position, and its counts mislead the sampler on
resume: mid-epoch it restarts the loader (a replay), and a fit stopped by ``max_steps`` counts its
epoch as processed, so the resumed fit calls ``set_epoch`` with the next epoch's number. A loader
with its own state (torchdata's ``StatefulDataLoader``) carries the position, but not Lightning's
count: its sampler is moved to the next epoch's order all the same (Lightning's own
``test_fit_loop_save_and_restore_dataloaders``, with our sampler, trains epoch 1's records where
the uninterrupted fit trains the rest of epoch 0). Only ``SamplerCheckpoint`` repairs those counts.

A user who forgot the callback is never in our code, so this guard comes in through Lightning's
``callbacks_factory`` entry points (pyproject.toml): every ``Trainer`` gets it, and it does
nothing unless a fit resumes train loaders that hold a ``StatefulSampler`` without the callback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stateful_sampler.lightning.loaders import SamplerSetupError, train_samplers

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer


class ResumeGuardHooks:
    """The guard's one hook; under each package's ``Callback`` in ``lightning_guard`` and ``pytorch_lightning_guard``."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from stateful_sampler.lightning.callback import SamplerCheckpointHooks

        if trainer.ckpt_path is None or any(isinstance(c, SamplerCheckpointHooks) for c in trainer.callbacks):  # type: ignore[attr-defined]  # set by Lightning's callback connector, undeclared
            return
        if train_samplers(trainer):
            raise SamplerSetupError(
                f"Trainer.fit(ckpt_path={str(trainer.ckpt_path)!r}) resumes a train dataloader with a StatefulSampler, "
                f"but SamplerCheckpoint is not among the Trainer's callbacks: Lightning's checkpoint does not hold "
                f"where the sampler stopped, and its epoch count moves the sampler to the wrong place (a replay "
                f"mid-epoch, the next epoch's order after a max_steps stop), with a DataLoader or torchdata's "
                f"StatefulDataLoader. Add stateful_sampler.lightning.SamplerCheckpoint() to Trainer(callbacks=[...]) "
                f"(an end-of-epoch checkpoint saved without it resumes exactly with it)"
            )


def lightning_guard() -> list[Any]:
    """Entry point of ``lightning.pytorch.callbacks_factory``."""
    from lightning.pytorch import Callback

    return [type("StatefulSamplerResumeGuard", (ResumeGuardHooks, Callback), {})()]


def pytorch_lightning_guard() -> list[Any]:
    """Entry point of ``pytorch_lightning.callbacks_factory``."""
    from pytorch_lightning import Callback

    return [type("StatefulSamplerResumeGuard", (ResumeGuardHooks, Callback), {})()]
