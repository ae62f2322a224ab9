"""The data orders ``ResumableLoader`` and the framework integrations drive: ``StatefulSampler`` in the
loader's sampler, or an order that lives in the dataset and reports its own passes (``ShardedStream``).

Both give ``batch_size``, ``seed``, ``epoch``, ``num_replicas``, ``set_epoch``,
``state_dict(consumed_batches=...)`` and ``load_state_dict``; a dataset order also has
``loader_pass(loader)``, which iterates the loader as one pass of the order, so that the order knows
where each pass begins and ends although its copies in the workers deliver the records.

``ResumableLoader`` also reads, of either, ``len()`` and ``remaining_length()`` (this rank's records of
the epoch, and of the pass under way or the next), ``pass_length()`` (Lightning's bookkeeping), and
calls ``_settle_pass()`` at an ``iter()`` with no pass of its own under way and checks ``_pass`` (a
pass begun since the last load or ``set_epoch``): the seam through which a pass taken to its end is
done with, and one the loader broke off is put back at the batches it consumed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from torch.utils.data import DataLoader

# Where wrappers keep the loader they iterate (Fabric, Accelerate, ResumableLoader, StreamLoader's pass).
WRAPPED_LOADERS = ("_dataloader", "base_dataloader", "dataloader", "loader")


@runtime_checkable
class DatasetOrder(Protocol):
    batch_size: int
    seed: int

    @property
    def epoch(self) -> int: ...

    @property
    def num_replicas(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def loader_pass(self, loader: Iterable[Any]) -> Iterator[Any]: ...


def loader_batches(order: Any, loader: Iterable[Any]) -> Iterable[Any]:
    """What to iterate for one pass: the loader, through the order's ``loader_pass`` when it has one."""
    return order.loader_pass(loader) if isinstance(order, DatasetOrder) else loader


def dataloaders_under(loader: Any) -> Iterator[DataLoader]:
    """Each ``DataLoader`` at ``loader`` or inside the wrappers frameworks put around it, once each."""
    pending, seen = [loader], set()
    while pending:
        obj = pending.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, DataLoader):
            yield obj
        pending += [getattr(obj, name, None) for name in WRAPPED_LOADERS]
