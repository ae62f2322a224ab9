"""The Lightning package a ``Trainer`` comes from, and the few of its internals the callback uses.

``lightning.pytorch`` and the classic ``pytorch_lightning`` ship the same code under two names (with
``lightning.fabric`` and ``lightning_fabric``), but their classes are not interchangeable: each
``Trainer`` takes only its own package's callbacks and wraps samplers in its own
``DistributedSamplerWrapper``. So ``SamplerCheckpoint`` is one implementation, and what it needs
of a package is looked up from the trainer at hand; neither package is imported before it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

# The top-level module of each package's Trainer, and its fabric package.
_FABRIC = {"lightning": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}
_PYTORCH = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


@dataclass(frozen=True)
class Framework:
    possible_user_warning: type[Warning]
    distributed_sampler_wrapper: type
    stateful: type  # the runtime-checkable protocol of loaders whose state Lightning saves
    parse_num_batches: Callable[..., int | float]
    training_stage: Any
    # Lightning < 2.5 restarts a mid-epoch checkpoint from its *completed* batches, and calls
    # on_train_epoch_start again for the resumed epoch (2.5 reworked restarts, #20379).
    restarts_from_completed: bool


@cache
def load_framework(package: str) -> Framework:
    """``package`` is ``"lightning"`` or ``"pytorch_lightning"``."""
    pytorch, fabric = _PYTORCH[package], _FABRIC[package]

    def module(name: str) -> Any:
        return importlib.import_module(name)

    return Framework(
        possible_user_warning=module(f"{pytorch}.utilities.warnings").PossibleUserWarning,
        distributed_sampler_wrapper=module(f"{fabric}.utilities.distributed").DistributedSamplerWrapper,
        # private: Lightning's protocol of loaders with a state_dict (torchdata's), by which it picks their states
        stateful=module(f"{fabric}.utilities.types")._Stateful,
        # private: Lightning's parsing of limit_train_batches, to count epochs as Lightning does
        parse_num_batches=module(f"{pytorch}.trainer.connectors.data_connector")._parse_num_batches,
        training_stage=module(f"{pytorch}.trainer.states").RunningStage.TRAINING,
        restarts_from_completed=_release(module(pytorch).__version__) < (2, 5),
    )


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def framework_of(trainer: Any) -> Framework:
    """The framework of ``trainer``'s own package."""
    package = type(trainer).__module__.split(".")[0]
    if package not in _PYTORCH:
        raise TypeError(f"trainer must be a lightning.pytorch or pytorch_lightning Trainer, got {type(trainer)!r}")
    return load_framework(package)
