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
Since it is in every program that has the package installed, it is:

- picklable (``ddp_spawn`` pickles the ``Trainer``): a module-level class under each package's own
  ``Callback`` (``lightning_pytorch.py``, ``pytorch_lightning.py``), imported by its factory only,
  so neither package is imported where it is not the one in use;
- silent: Lightning logs each entry point that adds callbacks, at INFO, for every ``Trainer``; a
  filter on its registry's logger drops that one line, about ours, and nothing else;
- cheap: a hook that returns at once unless the fit resumes; the factory imports this package once;
- optional: ``STATEFUL_SAMPLER_NO_LIGHTNING_GUARD=1`` in the environment adds no guard.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from stateful_sampler.lightning.loaders import SamplerSetupError, train_samplers

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer

OPT_OUT_ENV = "STATEFUL_SAMPLER_NO_LIGHTNING_GUARD"
ENTRY_POINT = "stateful_sampler"  # the entry points' name in pyproject.toml
# Where each package's guard class is: the one module of ours that imports that package.
_GUARD_MODULES = {
    "lightning": "stateful_sampler.lightning.lightning_pytorch",
    "pytorch_lightning": "stateful_sampler.pytorch_lightning",
}
# The logger Lightning's _load_external_callbacks logs through, in each package's fabric.
_REGISTRY_LOGGERS = {
    "lightning": "lightning.fabric.utilities.registry",
    "pytorch_lightning": "lightning_fabric.utilities.registry",
}


class ResumeGuardHooks:
    """The guard's one hook; ``StatefulSamplerResumeGuard`` is this under each package's ``Callback``."""

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


def guard_wanted() -> bool:
    """Whether the environment leaves the guard on: ``STATEFUL_SAMPLER_NO_LIGHTNING_GUARD`` unset, empty or
    ``0`` keeps it, ``1`` opts out; any other value is refused, naming the variable."""
    value = os.environ.get(OPT_OUT_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{OPT_OUT_ENV} must be 1 (no resume guard in Lightning Trainers) or 0, got {value!r}")
    return value != "1"


class _OwnEntryPointLine(logging.Filter):
    """Drops Lightning's "Adding 1 callbacks from entry point 'stateful_sampler'" line, only that one."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Adding ") and f"from entry point '{ENTRY_POINT}'" in message)


_OWN_LINE = _OwnEntryPointLine()


def _guards(package: str) -> list[Any]:
    if not guard_wanted():
        return []
    logging.getLogger(_REGISTRY_LOGGERS[package]).addFilter(_OWN_LINE)  # the same filter once: addFilter dedups
    return [importlib.import_module(_GUARD_MODULES[package]).StatefulSamplerResumeGuard()]


def lightning_guard() -> list[Any]:
    """Entry point of ``lightning.pytorch.callbacks_factory``."""
    return _guards("lightning")


def pytorch_lightning_guard() -> list[Any]:
    """Entry point of ``pytorch_lightning.callbacks_factory``."""
    return _guards("pytorch_lightning")
