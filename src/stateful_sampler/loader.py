"""``ResumableLoader``: the position a training loop has *consumed*, as a ``Stateful`` any framework saves.

DataLoader workers (and Accelerate's one-batch lookahead) draw indices ahead of training, so the
sampler's own drawn position is ahead of what the model saw. Counting the batches handed to the
loop and saving ``sampler.state_dict(consumed_batches=k)`` is exact whatever prefetched; exposing it
as ``state_dict`` / ``load_state_dict`` lets ``fabric.save``, ``torch.distributed.checkpoint`` and
``accelerator.save_state`` carry it without code of their own.

The state is the same on every rank of a run in step (the sampler's position is a global one), so
frameworks that write rank 0's copy only (Fabric, Accelerate) resume every rank from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from stateful_sampler.errors import DoubleShardingError, IncompatibleStateError, SamplerNotFoundError
from stateful_sampler.resumable import DatasetOrder, loader_batches
from stateful_sampler.sampler import StatefulSampler

LOADER_STATE_VERSION = 1

# Where frameworks keep the loader or sampler they wrap: torch's DataLoader and BatchSampler,
# Fabric's _FabricDataLoader (_dataloader), Accelerate's DataLoaderShard / BatchSamplerShard /
# SkipDataLoader (batch_sampler, base_dataloader); a DataLoader's dataset, for a DatasetOrder (ShardedStream).
_WRAPPED = ("sampler", "batch_sampler", "_dataloader", "base_dataloader", "dataloader", "loader", "dataset")
_MAX_DEPTH = 6
_LOADERS = ("_dataloader", "base_dataloader", "dataloader", "loader")  # where wrappers keep the loader they iterate

BatchHook = Callable[["ResumableLoader", Any, int], None]
StateHook = Callable[["ResumableLoader", int], None]
_batch_hooks: list[BatchHook] = []
_state_hooks: list[StateHook] = []


def add_batch_hook(hook: BatchHook) -> Callable[[], None]:
    """Call ``hook(loader, batch, consumed)`` for every batch any ``ResumableLoader`` hands to the loop.

    ``consumed`` counts the batches of the pass under way, this one included (1-based). This is the
    point where tools observe what training consumed without editing the user's loop (verify's
    batch recorder switches itself on through it). Returns a function that removes the hook.
    """
    _batch_hooks.append(hook)
    return lambda: _batch_hooks.remove(hook)


def add_state_hook(hook: StateHook) -> Callable[[], None]:
    """Call ``hook(loader, consumed)`` whenever any ``ResumableLoader`` gives its state (a checkpoint is being
    taken), with the batches of the pass under way it saves as consumed (0 when no pass is under way).
    Returns a function that removes it."""
    _state_hooks.append(hook)
    return lambda: _state_hooks.remove(hook)


@dataclass(frozen=True)
class LoaderState:
    """What ``ResumableLoader.state_dict`` saves: the sampler's state at the consumed position."""

    version: int
    sampler: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "sampler": dict(self.sampler)}

    @classmethod
    def from_dict(cls, data: Any) -> LoaderState:
        if not isinstance(data, Mapping):
            expected = "a dict from ResumableLoader.state_dict()"
            raise IncompatibleStateError("loader state", type(data).__name__, expected)
        version = data.get("version", "<missing>")
        if type(version) is not int or version != LOADER_STATE_VERSION:
            raise IncompatibleStateError("version", version, LOADER_STATE_VERSION, "unknown loader state version")
        for name in sorted(set(data) - {"version", "sampler"}):
            raise IncompatibleStateError(name, data[name], "<absent>", "not a field of loader state version 1")
        sampler = data.get("sampler", "<missing>")
        if not isinstance(sampler, Mapping):
            raise IncompatibleStateError("sampler", sampler, "a dict from StatefulSampler.state_dict()")
        return cls(version=version, sampler=dict(sampler))


class ResumableLoader:
    """Iterates ``loader`` and saves the position the loop consumed; ``loader`` may be a framework's wrapper.

    Args:
        loader: a ``DataLoader`` (or Fabric's / Accelerate's wrapper of one) whose sampler is a
            ``StatefulSampler`` with ``batch_size`` set, directly or inside its batch sampler.
        epoch_sync: called with the sampler's epoch before each pass, for wrappers that set the
            sampler's epoch themselves from a count of their own passes (Fabric, Accelerate): a
            resumed process starts that count at 0, which would rewind the restored epoch.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = ResumableLoader(DataLoader(range(10), sampler=StatefulSampler(10, batch_size=4), batch_size=4))
        >>> first = next(iter(loader))
        >>> state = loader.state_dict()                # after 1 consumed batch, whatever workers prefetched
        >>> resumed = ResumableLoader(DataLoader(range(10), sampler=StatefulSampler(10, batch_size=4), batch_size=4))
        >>> resumed.load_state_dict(state)
        >>> [first.tolist()] + [batch.tolist() for batch in resumed] == [batch.tolist() for batch in loader]
        True
    """

    def __init__(self, loader: Iterable[Any], *, epoch_sync: Callable[[int], None] | None = None) -> None:
        self.loader = loader
        self.sampler = find_sampler(loader)
        self._epoch_sync = epoch_sync
        self._consumed: int | None = None  # batches of the pass under way; None: no pass under way
        self._pass_epoch = 0
        self._generators = _own_generators(loader)
        if os.environ.get("STATEFUL_SAMPLER_RECORD"):  # `stateful-sampler verify` records this run from outside
            from stateful_sampler.verify.loader_hook import record_from_environment

            record_from_environment()

    @property
    def epoch(self) -> int:
        """The epoch of the pass under way, else the one the next pass draws. The sampler's own epoch
        moves on as soon as workers have drawn the pass to its end, before the loop has its last batches."""
        return self.sampler.epoch if self._consumed is None else self._pass_epoch

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start; the restored epoch keeps its position (as ``StatefulSampler.set_epoch``)."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self._epoch_sync is not None:
            self._epoch_sync(self.sampler.epoch)
        self._pass_epoch, self._consumed = self.sampler.epoch, 0
        for generator in self._generators:
            generator.manual_seed((self.sampler.seed * 1_000_003 + self._pass_epoch) % (1 << 63))
        for consumed, batch in enumerate(loader_batches(self.sampler, self.loader), 1):
            self._consumed = consumed
            for hook in tuple(_batch_hooks):
                hook(self, batch, consumed)
            yield batch
        self._consumed = None  # the pass ended: the sampler's drawn position is the consumed one

    def state_dict(self) -> dict[str, Any]:
        """The state after the batches the loop consumed, a small JSON-serialisable dict."""
        if self._consumed is None:
            sampler_state = self.sampler.state_dict()
        else:
            sampler_state = self.sampler.state_dict(consumed_batches=self._consumed)
        for hook in tuple(_state_hooks):
            hook(self, self._consumed or 0)
        return LoaderState(LOADER_STATE_VERSION, sampler_state).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state in O(1); the next pass starts at the saved consumed position."""
        self.sampler.load_state_dict(LoaderState.from_dict(state).sampler)
        self._consumed = None


def find_sampler(loader: Any) -> StatefulSampler:
    """The ``StatefulSampler`` inside ``loader``, through the wrappers frameworks put around loaders.

    Refuses a loader without one, a sampler without ``batch_size``, a loader batch size that differs
    from the sampler's, and a wrapper that shards the sampler's already sharded output again.
    """
    path = _path_to_sampler(loader, [], set())
    if path is None:
        inner = getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None)
        raise SamplerNotFoundError(
            f"ResumableLoader needs a StatefulSampler at loader.sampler or loader.batch_sampler.sampler, found none in "
            f"{type(loader).__name__} (sampler: {type(inner).__name__}): build the loader as "
            f"DataLoader(dataset, sampler=StatefulSampler(dataset, batch_size=B), batch_size=B)"
        )
    sampler = path[-1]
    if sampler.batch_size is None:
        raise ValueError("ResumableLoader counts consumed batches: it needs StatefulSampler(..., batch_size=B)")
    batch_sizes = [size for size in (getattr(obj, "batch_size", None) for obj in path[:-1]) if size is not None]
    if batch_sizes and batch_sizes[-1] != sampler.batch_size:
        raise ValueError(
            f"the loader's batch_size must equal the sampler's batch_size={sampler.batch_size}, got {batch_sizes[-1]}"
        )
    for wrapper in path[:-1]:
        processes = getattr(wrapper, "num_processes", 1)
        if isinstance(processes, int) and processes > 1 and sampler.num_replicas > 1:
            raise DoubleShardingError(
                f"{type(wrapper).__name__} (num_processes={processes}) shards the batches of a StatefulSampler that "
                f"already shards over num_replicas={sampler.num_replicas}: each rank would see 1/{processes} of its "
                f"share; prepare the loader with stateful_sampler.accelerate.prepare_loader(accelerator, loader)"
            )
    return sampler


def _own_generators(loader: Any) -> list[torch.Generator]:
    """Give each ``DataLoader`` iterated under ``loader`` that has none a generator of its own, to be seeded per pass.

    A ``DataLoader`` draws its workers' base seed from torch's global RNG each time a pass starts, so
    a pass a resume starts mid-epoch would shift training's random stream (dropout) by a draw the
    uninterrupted run took at the epoch's start. With its own generator, seeded from (seed, epoch),
    the global stream is untouched and a resumed pass's workers get the base seed of the epoch.
    """
    generators = []
    seen: set[int] = set()
    pending = [loader]
    while pending:
        obj = pending.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, DataLoader) and obj.generator is None:
            obj.generator = torch.Generator()
            generators.append(obj.generator)
        pending += [getattr(obj, name, None) for name in _LOADERS]
    return generators


def _path_to_sampler(obj: Any, path: list[Any], seen: set[int]) -> list[Any] | None:
    """Depth-first through the known wrapper attributes; the objects from ``obj`` to the sampler."""
    if id(obj) in seen or len(path) > _MAX_DEPTH:
        return None
    seen.add(id(obj))
    if isinstance(obj, (StatefulSampler, DatasetOrder)):
        return [*path, obj]
    for name in _WRAPPED:
        inner = getattr(obj, name, None)
        if inner is not None:
            found = _path_to_sampler(inner, [*path, obj], seen)
            if found is not None:
                return found
    return None
