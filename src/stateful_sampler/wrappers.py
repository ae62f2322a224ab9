"""Where frameworks keep the loader and the sampler they wrap, in one table, and one walk over it.

A loop hands ``ResumableLoader``, Lightning's callback and the stream whatever its framework made of the user's
``DataLoader``: Fabric's ``_FabricDataLoader``, Accelerate's ``DataLoaderShard`` / ``DataLoaderDispatcher`` /
``SkipDataLoader`` (around a ``DataLoader`` or torchdata's ``StatefulDataLoader``, itself a ``DataLoader``),
Lightning's ``CombinedLoader``, our ``ResumableLoader`` and the stream loader's pass. ``WRAPPED`` says at which
attribute each keeps what it wraps; ``walk`` follows them, and the rest of the package asks it
(``dataloaders_under``, ``innermost_dataloader``, ``path_to_order``, ``loaders_in``) rather than naming
attributes itself, so that a new framework is one row here.

The batch size is asked once: ``adopt_batch_size`` gives an order without one the loader's, and refuses a
contradiction with ``BatchSizeError``, in the words of the integration that asks.

Example:
    >>> from torch.utils.data import BatchSampler, DataLoader
    >>> sampler = StatefulSampler(10)
    >>> loader = DataLoader(range(10), batch_sampler=BatchSampler(sampler, 4, drop_last=False))
    >>> path = path_to_order(loader)
    >>> [type(obj).__name__ for obj in path]
    ['DataLoader', 'BatchSampler', 'StatefulSampler']
    >>> adopt_batch_size(sampler, batch_size_on(path))   # the sampler had none: it takes the loader's
    >>> sampler.batch_size
    4
    >>> adopt_batch_size(sampler, 5)
    Traceback (most recent call last):
    ...
    stateful_sampler.errors.BatchSizeError: the loader's batch_size=5 contradicts the sampler's batch_size=4: ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torch.utils.data import DataLoader

from stateful_sampler.checks import check_int
from stateful_sampler.errors import BatchSizeError
from stateful_sampler.order.layout import MAX_BATCH
from stateful_sampler.resumable import ResumableOrder
from stateful_sampler.sampler import StatefulSampler


class Holds(Enum):
    """What a wrapper keeps at an attribute."""

    LOADER = "loader"  # the loader it iterates
    LOADERS = "loaders"  # a list of loaders it iterates together
    SAMPLER = "sampler"  # a sampler, or a batch sampler around one
    DATASET = "dataset"  # a loader's dataset: an order when it is a DatasetOrder (ShardedStream)


@dataclass(frozen=True)
class Wrapped:
    """One row of ``WRAPPED``: the attribute, what it holds, and whose it is."""

    attribute: str
    holds: Holds
    kept_by: str


WRAPPED = (
    Wrapped("sampler", Holds.SAMPLER, "torch's DataLoader and BatchSampler"),
    Wrapped("batch_sampler", Holds.SAMPLER, "torch's DataLoader; Accelerate's BatchSamplerShard, SkipBatchSampler"),
    Wrapped("_dataloader", Holds.LOADER, "Fabric's _FabricDataLoader: Fabric keeps it at this private name only"),
    Wrapped("base_dataloader", Holds.LOADER, "Accelerate's DataLoaderShard, DataLoaderDispatcher, SkipDataLoader"),
    Wrapped("dataloader", Holds.LOADER, "the pass ShardedStream.loader_pass iterates for a StreamLoader"),
    Wrapped("loader", Holds.LOADER, "ResumableLoader"),
    Wrapped("dataset", Holds.DATASET, "torch's DataLoader (a DatasetOrder: ShardedStream)"),
    Wrapped("flattened", Holds.LOADERS, "Lightning's CombinedLoader: its loaders, in order"),
)

# Deep enough for every stack of wrappers above (ResumableLoader > Accelerate > DataLoader > BatchSamplerShard >
# BatchSampler > sampler), shallow enough that an unknown object's attributes are not searched at length.
MAX_WRAPPING = 6
_TO_AN_ORDER = frozenset({Holds.SAMPLER, Holds.LOADER, Holds.DATASET})
_TO_A_LOADER = frozenset({Holds.LOADER})


def walk(obj: Any, holds: frozenset[Holds] = _TO_AN_ORDER) -> Iterator[list[Any]]:
    """Depth-first from ``obj`` through the ``WRAPPED`` attributes that hold one object of a kind in ``holds``,
    each object once, at most ``MAX_WRAPPING`` wrappers deep: the path from ``obj`` to each object reached,
    ``[obj]`` first. (A wrapper of several loaders is not walked: which of them is meant is the caller's.)"""
    seen: set[int] = set()

    def visit(found: Any, above: list[Any]) -> Iterator[list[Any]]:
        if found is None or id(found) in seen or len(above) > MAX_WRAPPING:
            return
        seen.add(id(found))
        path = [*above, found]
        yield path
        for wrapped in WRAPPED:
            if wrapped.holds in holds:
                yield from visit(getattr(found, wrapped.attribute, None), path)

    return visit(obj, [])


def dataloaders_under(loader: Any) -> Iterator[DataLoader]:
    """Each ``DataLoader`` at ``loader`` or inside the wrappers frameworks put around it, outermost first."""
    return (path[-1] for path in walk(loader, _TO_A_LOADER) if isinstance(path[-1], DataLoader))


def innermost_dataloader(loader: Any) -> DataLoader | None:
    """The ``DataLoader`` the wrappers at ``loader`` iterate (the last one found), ``None`` without one."""
    found = list(dataloaders_under(loader))
    return found[-1] if found else None


def path_to_order(loader: Any) -> list[Any] | None:
    """The objects from ``loader`` to the first ``ResumableOrder`` (sampler, batch sampler or dataset) inside it."""
    for path in walk(loader):
        if isinstance(path[-1], (StatefulSampler, ResumableOrder)):  # a StatefulSampler without the protocol's check
            return path
    return None


def path_to(loader: Any, order: Any) -> list[Any] | None:
    """The objects from ``loader`` to ``order`` (this very object) inside it."""
    return next((path for path in walk(loader) if path[-1] is order), None)


def loaders_in(combined: Any) -> list[Any]:
    """The loaders a wrapper of several iterates together (Lightning's ``CombinedLoader``), in order."""
    rows = [row for row in WRAPPED if row.holds is Holds.LOADERS]
    return [loader for row in rows for loader in getattr(combined, row.attribute, None) or ()]


def samplers_at(loader: Any) -> list[Any]:
    """The distinct objects where a ``DataLoader`` keeps its sampler: ``loader.sampler``,
    ``loader.batch_sampler.sampler``, and ``loader.batch_sampler`` when it is a ``StatefulSampler`` itself
    (``TokenBudgetBatches``)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    ours = batch_sampler if isinstance(batch_sampler, StatefulSampler) else None
    candidates = [getattr(loader, "sampler", None), ours, getattr(batch_sampler, "sampler", None)]
    distinct: dict[int, Any] = {id(c): c for c in candidates if c is not None}
    return list(distinct.values())


def batch_size_on(path: list[Any]) -> int | None:
    """The batch size the wrappers on ``path`` batch its last object's records with: the innermost one given."""
    sizes = [size for size in (getattr(obj, "batch_size", None) for obj in path[:-1]) if size is not None]
    return sizes[-1] if sizes else None


@dataclass(frozen=True)
class BatchSizeWords:
    """How a refusal names the loader's and the order's batch sizes, and the fix: each integration's own words."""

    loader: str = "the loader's"
    order: str = "the sampler's"
    fix: str = ": give the batch size once (the DataLoader's is enough)"
    where: str = ""  # what the message starts with, e.g. "train dataloader 0: "


def adopt_batch_size(
    order: Any, loader_batch_size: int | None, *, words: BatchSizeWords = BatchSizeWords(), unbatched: bool = True
) -> None:
    """Give ``order`` the loader's batch size when it has none (the batch size is asked once); refuse a
    contradiction with ``BatchSizeError``, naming both values. ``loader_batch_size=None`` (records one by one)
    is no contradiction, unless ``unbatched=False``: an order that delivers whole batches (a stream)."""
    if loader_batch_size is None and unbatched:
        return
    if order.batch_size is None and loader_batch_size is not None:
        field = f"{words.where}{words.loader} batch_size"
        order.batch_size = check_int(field, loader_batch_size, minimum=1, maximum=MAX_BATCH)
    elif loader_batch_size != order.batch_size:
        raise BatchSizeError(
            f"{words.where}{words.loader} batch_size={loader_batch_size} contradicts {words.order} "
            f"batch_size={order.batch_size}{words.fix}",
            loader_batch_size=loader_batch_size,
            order_batch_size=order.batch_size,
        )
