"""Twin test of ``ResumableLoader`` over the row samplers (docs/core.md, "Epoch ends and early exits").

``tests/core/test_twin_loader.py``'s machine (iter, counted ``next()``, a ``break``, a loop to
``StopIteration``, ``zip(range(len(loader)), loader)``, ``set_epoch(any)``, two interleaved iterators,
saves anywhere; ``len``, ``epoch`` and the saved state compared after every rule) over a real
``DataLoader`` at 0 and 2 workers: ``PackedRows`` (split and whole) as its ``sampler``, and
``TokenBudgetBatches`` as its ``batch_sampler``, sometimes capped with ``batches_per_epoch``. Batches
are compared with every row's (every record's) ``SampleKey``: its epoch, position and padding mark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import initialize
from torch.utils.data import DataLoader

from stateful_sampler import PackedRows, ResumableLoader, TokenBudgetBatches
from tests.core.test_twin_loader import ResumableTwins
from tests.twin_helpers import outcome, worker_variant

EXAMPLES = int(os.environ.get("TWIN_PACKING_LOADER_EXAMPLES", "150"))  # without workers
WORKER_EXAMPLES = int(os.environ.get("TWIN_PACKING_LOADER_WORKER_EXAMPLES", "10"))  # each pass starts 2 processes


class Echo:
    """A dataset whose item is what the sampler asked for: a row plan with its key, or a record's key."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item: Any) -> Any:
        return (list(item), item.key) if isinstance(item, list) else item


class Items(list):  # type: ignore[type-arg]
    """A collated batch: the items as they came (``tolist`` is what the machine compares)."""

    def tolist(self) -> list[Any]:
        return list(self)


def collate(items: list[Any]) -> Items:
    return Items(items)


@dataclass(frozen=True)
class RowLoaderConfig:
    kind: str  # "split", "whole" or "budget"
    lengths: tuple[int, ...]
    window: int
    tail: str
    world_size: int
    loader_batch: int
    cap: int | None  # ResumableLoader(batches_per_epoch=...)

    def dataloader(self, rank: int, workers: int) -> DataLoader:
        common = {"window": self.window, "num_replicas": self.world_size, "rank": rank, "seed": 3, "tail": self.tail}
        data = Echo(len(self.lengths))
        if self.kind == "budget":
            batches = TokenBudgetBatches(list(self.lengths), 30, yield_keys=True, **common)
            return DataLoader(data, batch_sampler=batches, collate_fn=collate, num_workers=workers)  # type: ignore[arg-type]
        rows = PackedRows(list(self.lengths), 16, split_records=self.kind == "split", **common)
        return DataLoader(data, sampler=rows, batch_size=self.loader_batch, collate_fn=collate, num_workers=workers)  # type: ignore[arg-type]


@st.composite
def row_loader_configs(draw: Any, max_world: int) -> RowLoaderConfig:
    kind = draw(st.sampled_from(["split", "whole", "budget"]))
    tails = ["pad", "drop", "uneven"]  # carry needs the sampler's own batch_size, which this loader holds
    lengths = tuple(draw(st.lists(st.integers(1, 14), min_size=1, max_size=24)))
    return RowLoaderConfig(
        kind,
        lengths,
        draw(st.integers(1, 8)),
        draw(st.sampled_from(tails)),
        draw(st.integers(1, max_world)),
        draw(st.integers(1, 3)),
        draw(st.one_of(st.none(), st.integers(1, 3))),
    )


class RowResumableTwins(ResumableTwins):
    @initialize(data=st.data())
    def build(self, data: Any) -> None:
        config = data.draw(row_loader_configs(self.max_world), label="config")
        built = outcome(lambda: [self.make(config, rank) for rank in range(config.world_size)])
        if built[0] == "raised":  # refused at construction (drop on more ranks than rows)
            assert built[1] == "ValueError", built
        assume(built[0] == "ok")
        self.config = config  # type: ignore[assignment]
        self.live = built[1]
        self.twin = None
        self.slots = []
        self.fresh = False
        self.serial = 0
        self.log = []

    def make(self, config: Any, rank: int) -> ResumableLoader:
        # rng_states=False: the process's RNG snapshot is not the data order (as in test_twin_loader.py)
        return ResumableLoader(config.dataloader(rank, self.workers), rng_states=False, batches_per_epoch=config.cap)


VARIANTS = {
    workers: worker_variant(RowResumableTwins, workers, EXAMPLES, WORKER_EXAMPLES, max_world=3) for workers in (0, 2)
}


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_restored_resumable_loader_over_row_samplers_behaves_as_the_live_one(workers: int) -> None:
    VARIANTS[workers].TestCase().runTest()
