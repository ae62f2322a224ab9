"""What the cases iterate: a trivial dataset and the loaders and samplers under test."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler

BATCH = 256
OURS = "ours"  # system names, shared by the cases and the report
PLAIN_LOADER = "DataLoader(shuffle=True)"
STATEFUL_LOADER = "StatefulDataLoader"


class TrivialDataset(Dataset):
    """Loading is free, so a loader's own per-batch cost is what gets measured."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


class SkippedBatches:
    """A batch sampler that resumes the way a plain DataLoader user would: iterate and discard."""

    def __init__(self, batches: BatchSampler, skip: int) -> None:
        self.batches = batches
        self.skip = skip

    def __iter__(self) -> Iterator[list[int]]:
        return islice(iter(self.batches), self.skip, None)

    def __len__(self) -> int:
        return len(self.batches) - self.skip


def random_batches(size: int, seed: int = 0) -> BatchSampler:
    generator = torch.Generator().manual_seed(seed)
    return BatchSampler(RandomSampler(TrivialDataset(size), generator=generator), BATCH, drop_last=False)


def torchdata_state_at(state: Any, batches: int) -> Any:
    """A ``StatefulDataLoader`` state moved to ``batches`` batches into its epoch, so the anchor's
    resume cost is measured without first iterating to N/2 (``check_torchdata_state_at`` shows
    that the moved state resumes exactly where a real run would)."""
    if not isinstance(state, dict):
        return state
    moved = {}
    for key, value in state.items():
        if key in ("yielded", "samples_yielded"):
            moved[key] = batches * BATCH
        elif key in ("_num_yielded", "_sampler_iter_yielded", "_snapshot_step"):
            moved[key] = batches
        else:
            moved[key] = torchdata_state_at(value, batches)
    return moved


def check_torchdata_state_at(workers: int, size: int = 10_000, batches: int = 10) -> None:
    """Raise unless a moved state gives the batch a real run gives after ``batches`` batches."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        torch.manual_seed(0)
        return StatefulDataLoader(TrivialDataset(size), batch_size=BATCH, shuffle=True, num_workers=workers)

    original = loader()
    batches_seen = iter(original)
    next(batches_seen)
    state = original.state_dict()
    expected = next(islice(batches_seen, batches - 1, None))
    resumed = loader()
    resumed.load_state_dict(torchdata_state_at(state, batches))
    if not torch.equal(next(iter(resumed)), expected):
        raise RuntimeError(f"a moved torchdata state does not resume like a real run ({workers} workers)")
