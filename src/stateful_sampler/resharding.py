"""Refuse a framework wrapper that deals an already sharded order to the processes a second time.

``accelerator.prepare(loader)`` on several processes builds a ``BatchSamplerShard`` (each rank takes
every W-th batch), an ``IterableDatasetShard`` (every W-th record of a stream) or, with
``dispatch_batches``, a ``DataLoaderDispatcher`` (process 0 loads and splits each batch between the
processes) around the loader, whatever its sampler is. Over a ``StatefulSampler`` or
``ShardedStream``, which already give each rank its own share, every rank would see 1/W of its share.
Its options decide whether ``prepare`` touches the sampler at all (``use_seedable_sampler`` sets no
generator), so the refusal looks for the wrappers themselves, on the calls that reach the order:
a pass start (every rank that draws) and ``set_epoch`` (which the dispatcher calls on every rank,
before process 0 draws). The user's code is not ours to see, so the search is over the calling frames.

The wrappers are found by module and process count, without importing Accelerate (the core imports
no framework); ``stateful_sampler.accelerate.prepare_loader`` prepares as one process, which builds none.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

from stateful_sampler.errors import DoubleShardingError

# Frames searched above the call: a pass that Accelerate's dispatcher starts through a DataLoader with
# workers (torchdata's, too) is 9-14 frames below the dispatcher's __iter__.
_DEPTH = 16
_ACCELERATE_LOADERS = "accelerate.data_loader"  # BatchSamplerShard, IterableDatasetShard, DataLoaderDispatcher
FIX = "prepare the loader with stateful_sampler.accelerate.prepare_loader(accelerator, loader)"


def refuse_resharding(order: Any, frame: FrameType | None) -> None:
    """Raise ``DoubleShardingError`` if a frame from ``frame`` up belongs to a wrapper that deals to more
    than one process what it iterates of ``order``, which already shards over its ``num_replicas``.

    Example:
        >>> import sys
        >>> from stateful_sampler import StatefulSampler
        >>> refuse_resharding(StatefulSampler(8, num_replicas=2, rank=0), sys._getframe())  # no wrapper: no error
    """
    replicas = order.num_replicas
    if replicas < 2:
        return  # an order on one rank is the only one sharded: the wrapper's deal is the one deal
    for _ in range(_DEPTH):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        processes = _dealt_processes(owner) if owner is not None else 1
        if processes > 1:
            raise DoubleShardingError(
                f"{type(owner).__name__} (num_processes={processes}) deals to the processes what it takes from a "
                f"{type(order).__name__} that already shards over num_replicas={replicas}: each rank would see "
                f"1/{processes} of its share; {FIX}"
            )
        frame = frame.f_back


def _dealt_processes(owner: Any) -> int:
    """The processes ``owner`` deals what it iterates to: its ``num_processes`` (the shards) or its
    process state's (the dispatcher), for Accelerate's data-loader wrappers; 1 for anything else.

    ``type(owner)``, not ``owner.__class__``: Accelerate's loaders pose as ``DataLoader`` through it."""
    if type(owner).__module__ != _ACCELERATE_LOADERS:
        return 1
    count = getattr(owner, "num_processes", None)
    if count is None:
        count = getattr(getattr(owner, "state", None), "num_processes", None)
    return count if isinstance(count, int) else 1
