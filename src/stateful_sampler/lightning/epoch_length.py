"""Keep Lightning's per-epoch batch count in step with a ``carry`` sampler.

Lightning takes ``len(loader)`` once, when it builds the train loader, and uses it as the epoch's
batch count ever after. Under ``tail="carry"`` an epoch's length moves by a batch as the
remainder rolls over, so the stale count would cut an epoch short (skipping its last batch) or
wait for a batch that never comes (missing ``is_last_batch``). The count lives in three places:
the ``CombinedLoader``'s per-loader limits, the fit loop's ``max_batches`` (alias
``trainer.num_training_batches``) and the data fetcher's ``length``; all three move together.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning.pytorch import Trainer
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage

from stateful_sampler.lightning.loaders import combined_train_loader, iterated_train_loader


@dataclass(frozen=True)
class EpochBatches:
    """Lightning's batch count of one epoch: per train loader, and in all."""

    limits: list[int | float]
    total: int | float


def lightning_epoch_batches(trainer: Trainer) -> EpochBatches:
    """The batch count Lightning holds for the epoch it is in."""
    combined = combined_train_loader(trainer)
    limits = combined.limits if combined is not None else None
    return EpochBatches(list(limits or []), trainer.num_training_batches)


def count_current_epoch(trainer: Trainer) -> bool:
    """Make Lightning count the batches of the samplers' current epoch (``limit_train_batches``
    applied); returns whether the batches fetched so far reach its end."""
    combined, iterator = iterated_train_loader(trainer)
    limit = trainer.limit_train_batches
    iterator.limits = [_parse_num_batches(RunningStage.TRAINING, len(loader), limit) for loader in combined.flattened]
    return hold_epoch_batches(trainer, EpochBatches(iterator.limits, len(iterator)))


def hold_epoch_batches(trainer: Trainer, batches: EpochBatches) -> bool:
    """Make Lightning count ``batches`` for the epoch under way; returns whether the batches fetched
    so far reach its end."""
    combined, iterator = iterated_train_loader(trainer)
    combined.limits = list(batches.limits)
    iterator.limits = combined.limits
    trainer.fit_loop.max_batches = batches.total
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None or fetcher.length is None:
        return False
    fetcher.length = batches.total
    fetcher.done = fetcher.fetched >= batches.total
    return fetcher.done
