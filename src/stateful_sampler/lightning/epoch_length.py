"""Keep Lightning's per-epoch batch count in step with what the train samplers will yield.

Lightning takes ``len(loader)`` once, when it builds the train loader, and uses it as the epoch's
batch count ever after. That count is wrong in two cases: under ``tail="carry"`` an epoch's
length moves by a batch as the remainder rolls over, and an epoch resumed mid-way with another
batch size or world size lays the rest of the epoch out afresh, so it has
``batches_processed + ceil(remaining / B)`` batches, not ``len(loader)``. A stale count cuts the
epoch short (records never seen) or waits for a batch that never comes.

``limit_train_batches`` caps the batches of an epoch counted from the epoch's start, as Lightning
counts them: a resumed epoch that already ran the cap has no batch left, and the rest of its
order is abandoned (the next epoch starts at its own beginning).

The count lives in three places: the ``CombinedLoader``'s per-loader limits, the fit loop's
``max_batches`` (alias ``trainer.num_training_batches``) and the data fetcher's ``length``; all
three move together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stateful_sampler.lightning.framework import framework_of
from stateful_sampler.lightning.loaders import (
    combined_train_loader,
    iterated_train_loader,
    loader_batching,
    stateful_samplers_of,
)
from stateful_sampler.wrappers import loaders_in

if TYPE_CHECKING:
    from lightning.pytorch import Trainer


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


def count_epoch(trainer: Trainer, batches_before: int, fetched: int) -> bool:
    """Make Lightning count ``batches_before`` plus the batches the samplers' passes yield, capped by
    ``limit_train_batches``; ``fetched`` is the batches Lightning counts as fetched in the epoch.
    Returns whether those reach the epoch's end."""
    combined, _ = iterated_train_loader(trainer)
    limits = [_loader_batches(trainer, loader, batches_before) for loader in loaders_in(combined)]
    return hold_epoch_batches(trainer, limits, fetched)


def hold_epoch_batches(trainer: Trainer, limits: list[int | float], fetched: int) -> bool:
    """Make Lightning count ``limits`` batches per loader for the epoch under way; returns whether
    the ``fetched`` batches reach its end."""
    combined, iterator = iterated_train_loader(trainer)
    combined.limits = list(limits)
    iterator.limits = combined.limits
    # not len(iterator): it caps each limit at len(loader), which a resumed epoch may exceed
    # private: the CombinedLoader's mode, only stored privately
    total = min(limits) if combined._mode == "min_size" else max(limits)
    trainer.fit_loop.max_batches = total
    # private: Lightning's data fetcher holds the epoch length it stops at
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None or fetcher.length is None:
        return False
    fetcher.length = total  # type: ignore[assignment]  # typed int | None; an inf limit works (never done)
    fetcher.done = fetched >= total
    return fetcher.done


def _loader_batches(trainer: Trainer, loader: object, batches_before: int) -> int | float:
    samplers = stateful_samplers_of(loader)
    if not samplers:
        framework = framework_of(trainer)
        return framework.parse_num_batches(framework.training_stage, len(loader), trainer.limit_train_batches)  # type: ignore[arg-type]
    cap = _epoch_cap(trainer, loader)
    batch_size, drop_last = loader_batching(loader, samplers[0])
    pass_length = samplers[0].pass_length()  # the pass under way from its start, whatever it drew already
    rest = pass_length // batch_size if drop_last else -(-pass_length // batch_size)
    return min(cap, batches_before + rest)


def _epoch_cap(trainer: Trainer, loader: object) -> int | float:
    """``limit_train_batches`` as a number of batches from the epoch's start: an int is itself (not
    capped by ``len(loader)``, which a resumed epoch may exceed), a fraction is of ``len(loader)``."""
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        return limit
    if limit >= 1.0:
        return float("inf")
    framework = framework_of(trainer)
    return framework.parse_num_batches(framework.training_stage, len(loader), limit)  # type: ignore[arg-type]
