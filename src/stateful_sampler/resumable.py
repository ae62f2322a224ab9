"""The data orders ``ResumableLoader`` and the framework integrations drive: ``StatefulSampler`` (and the row
samplers) in the loader's sampler, an order that lives in the dataset and reports its own passes
(``ShardedStream``), or a third party's order written against ``ResumableOrder`` alone.

``ResumableOrder`` is the whole seam: the loader reads and calls nothing else of an order, except one optional
method, ``remaining_length_later()`` (``StatefulSampler``'s: ``remaining_length()`` as a function to call later, or
None), which lets a pass whose length is still being counted start before its ``len()`` is known. Besides the
attributes every order has (``batch_size``, ``seed``, ``epoch``, ``num_replicas``, ``set_epoch``,
``len()``, ``remaining_length()``, ``state_dict`` / ``load_state_dict``), it asks three things of a pass:
``pass_begun`` (a pass began since the last ``set_epoch``, load or ``settle``), ``state_after(consumed)``
(the state once the loop consumed that many of this rank's records of the pass under way) and
``settle()`` (a pass taken to its end is done with: the next one starts after it). A dataset order
(``DatasetOrder``) also has ``loader_pass(loader)``, which iterates the loader as one pass of the order,
so that the order knows where each pass begins and ends although its copies in the workers deliver the
records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ResumableOrder(Protocol):
    """An order ``ResumableLoader`` drives: what it reads and calls, all of it public.

    A sampler-style order is a ``DataLoader``'s sampler (it yields this rank's indices); a dataset order
    (``DatasetOrder``) is the ``DataLoader``'s dataset. ``state_after(consumed)`` is how the loader saves what
    the loop consumed whatever workers prefetched: ``consumed`` counts this rank's records of the pass under
    way (else of the next pass), capped at the pass's records. ``settle()`` is called at an ``iter()`` of the
    loader with no pass of its own under way; a pass the loader broke off is put back instead, by
    ``load_state_dict(state_after(consumed))``, when the order is still in that pass's epoch or ``pass_begun``.
    ``len()`` counts this rank's records of the current epoch from its start, ``remaining_length()`` those left
    from the position ``state_dict()`` saves (read by the loader at a pass's start, for ``len(loader)``). A
    ``batch_size`` of ``None`` is set by the loader to its ``DataLoader``'s (so it must be writable then).
    """

    seed: int

    @property
    def batch_size(self) -> int | None: ...

    @property
    def epoch(self) -> int: ...

    @property
    def num_replicas(self) -> int: ...

    @property
    def pass_begun(self) -> bool: ...

    def set_epoch(self, epoch: int) -> None: ...

    def __len__(self) -> int: ...

    def remaining_length(self) -> int: ...

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]: ...

    def state_after(self, consumed: int) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def settle(self) -> None: ...


@runtime_checkable
class DatasetOrder(ResumableOrder, Protocol):
    """A ``ResumableOrder`` that lives in the ``DataLoader``'s dataset and is told of each pass by ``loader_pass``."""

    def loader_pass(self, loader: Iterable[Any]) -> Iterator[Any]: ...


def loader_batches(order: Any, loader: Iterable[Any]) -> Iterable[Any]:
    """What to iterate for one pass: the loader, through the order's ``loader_pass`` when it has one."""
    return order.loader_pass(loader) if isinstance(order, DatasetOrder) else loader
