"""Find the ``StatefulSampler`` s of Lightning's train loaders, and refuse setups that cannot resume.

Lightning flattens list/dict/nested train loaders into one ``CombinedLoader``; each loader's
sampler sits at ``loader.sampler`` or ``loader.batch_sampler.sampler`` (the two places
Lightning itself calls ``set_epoch`` on), or is the batch sampler (``TokenBudgetBatches``), whose
epoch ``SamplerCheckpoint`` sets at each pass start. Anything else in those places cannot be resumed
exactly, so it is an error raised before the first training step, not a silent replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stateful_sampler.errors import BatchSizeError, SamplerSetupError
from stateful_sampler.lightning.framework import framework_of
from stateful_sampler.resumable import DatasetOrder
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.wrappers import BatchSizeWords, adopt_batch_size, batch_size_on, loaders_in, path_to, samplers_at

if TYPE_CHECKING:  # either package's; see framework.py
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.combined_loader import CombinedLoader


def combined_train_loader(trainer: Trainer) -> CombinedLoader | None:
    """The ``CombinedLoader`` the fit loop iterates (``None`` until Lightning builds it).

    ``trainer.train_dataloader`` gives the user's structure; the fit loop's own object also holds
    the per-loader batch limits, which ``carry`` keeps in step with its epoch lengths.
    """
    # private: the fit loop's own CombinedLoader holds the per-loader limits in force
    return trainer.fit_loop._combined_loader


def iterated_train_loader(trainer: Trainer) -> tuple[CombinedLoader, Any]:
    """The fit loop's ``CombinedLoader`` and its live iterator, which holds the limits in force."""
    combined = combined_train_loader(trainer)
    # private: the CombinedLoader's live iterator holds the limits in force
    iterator = combined._iterator if combined is not None else None
    if combined is None or iterator is None:
        raise RuntimeError("the train loader is not iterated yet: call this inside Trainer.fit, from on_train_start on")
    return combined, iterator


def restart_train_iteration(trainer: Trainer) -> None:
    """Start the fit loop's iteration over the train loaders again, so every sampler begins a new
    pass (and its workers drop what they prefetched)."""
    # private: iter(fetcher) restarts the fit loop's iteration, as Lightning does
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is None:
        raise RuntimeError("the train loader is not iterated yet: call this inside Trainer.fit, from on_train_start on")
    iter(fetcher)


def train_samplers(trainer: Trainer) -> list[StatefulSampler]:
    """Every ``StatefulSampler`` of the train loaders, in loader order, without checking the setup."""
    combined = combined_train_loader(trainer)
    if combined is None:
        return []
    return [s for loader in loaders_in(combined) for s in stateful_samplers_of(loader)]


def set_batch_sampler_epochs(trainer: Trainer, epoch: int) -> None:
    """Lightning's ``set_epoch`` at each epoch's start, for the one place it does not call it: a batch sampler
    that is a ``StatefulSampler`` (``TokenBudgetBatches``). Without it such a sampler still holds the last
    epoch's pass at the start of the next (Lightning stops fetching at its count, so that pass never sees its
    end), and the next epoch's batches would be counted from it."""
    combined = combined_train_loader(trainer)
    for loader in loaders_in(combined) if combined is not None else []:
        batch_sampler = getattr(loader, "batch_sampler", None)
        if isinstance(batch_sampler, StatefulSampler):
            batch_sampler.set_epoch(epoch)


@dataclass(frozen=True)
class _KeepOurBatchSamplers:
    """Lightning's ``_requires_distributed_sampler``, false as well for a loader whose batch sampler is ours."""

    requires: Callable[[Any], bool]

    def __call__(self, dataloader: Any) -> bool:
        return not isinstance(getattr(dataloader, "batch_sampler", None), StatefulSampler) and self.requires(dataloader)


def keep_distributed_batch_samplers(trainer: Trainer) -> None:
    """Under ``use_distributed_sampler`` (the default), leave a loader whose batch sampler is a ``StatefulSampler``
    (``TokenBudgetBatches``, a ``DistributedSampler``) as it is, as Lightning leaves one whose sampler is a
    ``DistributedSampler``. Lightning looks at ``loader.sampler`` only, a ``SequentialSampler`` beside a batch
    sampler, and rebuilds the batch sampler around a ``DistributedSampler`` of its own: a ``TypeError``, since
    ours takes none (it shards itself)."""
    # private: Lightning's decision to replace samplers lives on its data connector only
    connector = trainer._data_connector
    # private: wrapped, on this Trainer only, so a batch sampler of ours is kept
    if not isinstance(connector._requires_distributed_sampler, _KeepOurBatchSamplers):
        # private: the same, on this Trainer's connector only
        connector._requires_distributed_sampler = _KeepOurBatchSamplers(connector._requires_distributed_sampler)  # type: ignore[method-assign]


def stateful_samplers_of(loader: Any) -> list[StatefulSampler]:
    """The loader's StatefulSamplers, or its dataset when that is a DatasetOrder (ShardedStream)."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, DatasetOrder):
        return [dataset]  # type: ignore[list-item]
    return [s for s in samplers_at(loader) if isinstance(s, StatefulSampler)]


def superseded_loader_states(trainer: Trainer) -> list[int]:
    """Which entries of the loader states Lightning saves (one per loader with ``state_dict``, such
    as torchdata's ``StatefulDataLoader``) belong to loaders whose position a ``StatefulSampler``
    holds: ``SamplerCheckpoint``'s state replaces them, so the position has one source of truth."""
    combined = combined_train_loader(trainer)
    if combined is None:
        return []
    stateful = [loader for loader in loaders_in(combined) if isinstance(loader, framework_of(trainer).stateful)]
    return [index for index, loader in enumerate(stateful) if stateful_samplers_of(loader)]


def loader_batching(loader: Any, sampler: StatefulSampler) -> tuple[int, bool]:
    """The batch size and ``drop_last`` a loader batches its sampler's indices with."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    batch_size = getattr(loader, "batch_size", None) or getattr(batch_sampler, "batch_size", None)
    drop_last = getattr(loader, "drop_last", None) or getattr(batch_sampler, "drop_last", False)
    return batch_size or sampler.batch_size or 1, bool(drop_last)


def checked_train_samplers(trainer: Trainer) -> list[StatefulSampler]:
    """Every train loader's ``StatefulSampler``; raises ``SamplerSetupError`` for a loader that has none,
    one that Lightning wrapped, or one whose batch size disagrees with its loader."""
    combined = combined_train_loader(trainer)
    if combined is None:
        raise SamplerSetupError("SamplerCheckpoint found no train dataloader: it only works inside Trainer.fit")
    _check_not_overfitting(trainer)
    _check_not_cycled(combined)
    found = []
    for index, loader in enumerate(loaders_in(combined)):
        samplers = samplers_at(loader)
        stateful = stateful_samplers_of(loader)
        # either package's DistributedSamplerWrapper, found at run time (framework.py), so typed Any
        wrapped: list[Any] = [s for s in samplers if isinstance(s, framework_of(trainer).distributed_sampler_wrapper)]
        if wrapped:
            # private: the sampler DistributedSamplerWrapper wraps, named in the error
            inner = type(wrapped[0].dataset._sampler).__name__
            raise SamplerSetupError(
                f"train dataloader {index}: Lightning wrapped its {inner} in DistributedSamplerWrapper, which "
                f"replays the whole order every epoch; give the DataLoader a StatefulSampler directly: "
                f"DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B)"
            )
        if not stateful:
            names = ", ".join(type(s).__name__ for s in samplers) or "no sampler"
            raise SamplerSetupError(
                f"train dataloader {index} ({type(loader).__name__} with {names}) has no StatefulSampler, so a "
                f"resumed run would replay or skip batches: use "
                f"DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B) instead of shuffle=True"
            )
        for sampler in stateful:
            _check_batch_size(index, loader, sampler)
        found.extend(stateful)
    return found


def _check_not_overfitting(trainer: Trainer) -> None:
    """``overfit_batches`` makes Lightning replace every train sampler with a ``SequentialSampler``
    (the same first batches each epoch), so no StatefulSampler is left to resume."""
    overfit = trainer.overfit_batches  # type: ignore[attr-defined]  # set by Lightning's data connector, undeclared
    if overfit > 0:
        raise SamplerSetupError(
            f"Trainer(overfit_batches={overfit}) replaced the train dataloader's sampler with a "
            f"SequentialSampler over the first batches, so there is no StatefulSampler to checkpoint: for an "
            f"overfitting run remove SamplerCheckpoint from the callbacks, or set overfit_batches=0 to train on "
            f"the StatefulSampler"
        )


def _check_not_cycled(combined: CombinedLoader) -> None:
    """``max_size_cycle`` (Lightning's default for several loaders) restarts a shorter loader in the
    middle of an epoch, so its sampler's passes drift away from the epochs: there is no position
    that a resumed run could continue from."""
    loaders = loaders_in(combined)
    limits = combined.limits or [float("inf")] * len(loaders)
    batches = [min(len(loader), limit) for loader, limit in zip(loaders, limits)]
    # private: the CombinedLoader's mode, only stored privately
    if combined._mode == "max_size_cycle" and len(set(batches)) > 1:
        raise SamplerSetupError(
            f"train dataloaders of {batches} batches an epoch: CombinedLoader mode 'max_size_cycle' (the default "
            f"for several loaders) restarts the shorter ones mid-epoch, which no checkpoint can resume; give them "
            f"equal lengths or return CombinedLoader(loaders, mode='max_size') or mode='min_size'"
        )


def _check_batch_size(index: int, loader: Any, sampler: StatefulSampler) -> None:
    """The sampler counts consumed batches in its own batch size, so it must be the loader's: a sampler
    without one takes the loader's (asked once), a contradiction is refused."""
    path = path_to(loader, sampler)
    loader_batch = batch_size_on(path) if path is not None else None
    words = BatchSizeWords(
        "DataLoader", "StatefulSampler", "; pass the same value to both", f"train dataloader {index}: "
    )
    adopt_batch_size(sampler, loader_batch, words=words)
    if sampler.batch_size is None:
        hint = loader_batch if loader_batch is not None else "B"
        raise BatchSizeError(
            f"train dataloader {index}: StatefulSampler needs batch_size to count the batches training consumed: "
            f"StatefulSampler(..., batch_size={hint})",
            loader_batch_size=loader_batch,
            order_batch_size=None,
        )
