"""HF Accelerate: a ``StatefulSampler`` loader prepared so that exactly one of the two shards, and checkpointed.

``accelerator.prepare(loader)`` on more than one process wraps the loader's batch sampler in a
``BatchSamplerShard`` that deals whole batches round-robin to the processes, whatever the sampler
is: a ``StatefulSampler`` (a ``DistributedSampler``) that already yields this rank's share would be
sharded twice, each rank seeing every W-th of its own batches. With ``even_batches`` (the default)
it also loops back to the epoch's start to fill the last round, duplicating records without a
mark. So here the sampler shards (with its tail policy and padding marks) and Accelerate does not:
the loader goes through Accelerate's ``prepare_data_loader`` as one process, which keeps device
placement and the end-of-loader signal gradient accumulation needs, and is registered for
``accelerator.save_state`` / ``load_state``, which then carry the consumed position: no
``skip_first_batches`` replay. ``accelerator.prepare`` itself is refused with ``DoubleShardingError`` in
every configuration, at prepare or at the first batch (``resharding.py``).
"""

from __future__ import annotations

from torch.utils.data import BatchSampler, DataLoader

from stateful_sampler.extras import missing_extra
from stateful_sampler.loader import ResumableLoader, find_sampler
from stateful_sampler.resumable import DatasetOrder

try:
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
except ModuleNotFoundError as error:
    raise missing_extra(error, "accelerate", __name__) from error


def prepare_loader(accelerator: Accelerator, loader: DataLoader) -> ResumableLoader:
    """Use instead of ``accelerator.prepare(loader)``; the result is registered for checkpointing.

    Example::

        loader = prepare_loader(accelerator, DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B))
        accelerator.save_state(path)   # saves the consumed position with the model and optimizer
        accelerator.load_state(path)   # O(1): the next pass starts there
    """
    sampler = find_sampler(loader)
    if accelerator.split_batches:
        raise ValueError(
            "split_batches=True splits each batch between processes, but the StatefulSampler already gives each "
            "process its own batches: use split_batches=False and the per-process batch_size"
        )
    if accelerator.dispatch_batches:
        raise ValueError(
            "dispatch_batches=True loads every batch on process 0, but the StatefulSampler gives each process its "
            "own share: use DataLoaderConfiguration(dispatch_batches=False)"
        )
    if isinstance(getattr(loader, "sampler", None), BatchSampler):
        raise TypeError(
            "DataLoader(sampler=BatchSampler(...), batch_size=None): Accelerate's prepare_data_loader cannot prepare "
            "a loader whose sampler yields batches (TypeError); pass it as DataLoader(dataset, batch_sampler=...)"
        )
    if isinstance(sampler, DatasetOrder) and accelerator.use_stateful_dataloader:
        raise ValueError(
            "use_stateful_dataloader=True builds torchdata's StatefulDataLoader over the ShardedStream and iterates it "
            "at prepare, outside any pass of the stream; the position is ResumableLoader's to keep: use "
            "DataLoaderConfiguration(use_stateful_dataloader=False)"
        )
    if sampler.num_replicas != accelerator.num_processes:
        raise ValueError(
            f"the StatefulSampler shards over num_replicas={sampler.num_replicas} but Accelerate runs "
            f"num_processes={accelerator.num_processes}: build the sampler after Accelerator(), or leave "
            f"num_replicas and rank unset"
        )
    prepared = prepare_data_loader(
        loader,
        accelerator.device,
        num_processes=1,  # one process as far as Accelerate's sharding is concerned: the sampler shards
        process_index=0,
        put_on_device=accelerator.device_placement,
        rng_types=accelerator.rng_types.copy(),
        dispatch_batches=False,
        non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader,
    )
    # DataLoaderShard sets the sampler's epoch from its own pass count, which restarts at 0 in a resumed process.
    # Accelerate's save_state/load_state carry every process's RNG states themselves: the loader's would be a
    # second copy, of rank 0's only (Accelerate saves registered objects from the main process).
    resumable = ResumableLoader(prepared, epoch_sync=prepared.set_epoch, rng_states=False)
    accelerator.register_for_checkpointing(resumable)
    return resumable
