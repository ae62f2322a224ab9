# Ported from pytorch/data, test/stateful_dataloader/test_state_dict.py at commit
# 088e43477c1c750c26ea6c1466b708c45cc8ba30 (BSD-style licence, Copyright (c) Meta Platforms, Inc. and affiliates):
# TestEndOfEpochBehavior_shard0.test_end_of_epoch_behavior, TestMultiEpochSDL_shard0.test_multi_epoch_sdl and
# TestMultiEpochState_shard0 (test_inline, test_pw), with StatefulSampler plugged in as the sampler.
"""torchdata's own end-of-epoch and multi-epoch state tests, our sampler inside ``StatefulDataLoader``.

Each adaptation that our documented contract (docs/core.md, "Epoch ends and early exits") makes is
marked ``ADAPTED`` beside it; everything else is upstream's code and upstream's assertions.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from stateful_sampler import StatefulSampler

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def cases(batch_sizes):
    """upstream's parameterized.expand(itertools.product([100], [0, 2], batch_sizes, [False, True])); 2 workers: slow."""
    return [
        pytest.param(100, workers, batch, shuffle, marks=[pytest.mark.slow] if workers else [])
        for workers, batch, shuffle in itertools.product([0, 2], batch_sizes, [False, True])
    ]


class DummyMapDataset(torch.utils.data.Dataset):  # upstream, unchanged
    def __init__(self, size, shuffle, include_generator=True):
        self.size = size
        self.data = [{"id": i, "strcol": f"strcol_{i}", "listcol": [i, i + 1, i + 2]} for i in range(size)]
        self.shuffle = shuffle
        self.include_generator = include_generator

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if self.shuffle:
            i = torch.randint(self.size, (1,)).item()
        return self.data[i]

    def state_dict(self):
        if self.include_generator:
            return {
                "g": torch.get_rng_state(),
            }
        else:
            return {}

    def load_state_dict(self, state_dict):
        if self.include_generator:
            torch.set_rng_state(state_dict["g"])


def identity(x):
    return x


def get_map_dl(data_size, num_workers, batch_size, shuffle):
    dataset = DummyMapDataset(data_size, shuffle=False)
    return StatefulDataLoader(
        dataset=dataset,
        num_workers=num_workers,
        batch_size=batch_size,
        # ADAPTED: our sampler instead of StatefulDataLoader(shuffle=...)'s RandomSampler; `shuffle` goes to it.
        sampler=StatefulSampler(dataset, shuffle=shuffle, seed=7),
    )


# -- TestEndOfEpochBehavior_shard0


def _count_items_yielded(data_loader: StatefulDataLoader) -> int:
    num_items_yielded = 0
    for batch in data_loader:
        num_items_yielded += 1
    return num_items_yielded


# ADAPTED (an addition, not a change): batch_size 3 as well as upstream's 1, so the last batch is short
# (100 = 33 * 3 + 1) and the batch sampler meets the sampler's end while the loop is still inside.
@pytest.mark.parametrize("datasize, num_workers, batch_size, shuffle", cases([1, 3]))
def test_end_of_epoch_behavior(datasize, num_workers, batch_size, shuffle):
    dataloader = get_map_dl(
        data_size=datasize,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    # Run through the dataloader for 1 epoch and count the number of items yielded
    num_items_yielded = 0

    for batch in dataloader:
        num_items_yielded += 1
        sd_in = dataloader.state_dict()
    sd_out = dataloader.state_dict()

    assert num_items_yielded == -(-datasize // batch_size)  # ADAPTED: batches, not items, once batch_size > 1

    # Create a new StatefulDataLoader instance and load the state dict saved before the end of epoch
    dataloader_sd_in = get_map_dl(
        data_size=datasize,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    dataloader_sd_in.load_state_dict(sd_in)

    # Run through the new dataloader for 1 epoch and count the number of items yielded
    # num_items_yielded should be 0 since the state dict was saved before the end of epoch
    num_items_yielded = _count_items_yielded(dataloader_sd_in)
    assert num_items_yielded == 0

    # Create a new StatefulDataLoader instance and load the state dict saved after the end of epoch
    dataloader_sd_out = get_map_dl(
        data_size=datasize,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    dataloader_sd_out.load_state_dict(sd_out)

    # Run through the new dataloader for 1 epoch and count the number of items yielded
    # num_items_yielded should be data_size since the state dict was saved after the end of epoch
    num_items_yielded = _count_items_yielded(dataloader_sd_out)
    assert num_items_yielded == -(-datasize // batch_size)  # ADAPTED: batches, as above

    # ADAPTED (an addition): the epochs after either resume are the live loader's next epochs, in order
    # (upstream's RandomSampler draws from torch's global RNG, so it cannot assert this).
    assert [b["id"].tolist() for b in dataloader_sd_in] == [b["id"].tolist() for b in dataloader]


# -- TestMultiEpochSDL_shard0


@pytest.mark.parametrize("datasize, num_workers, batch_size, shuffle", cases([1]))
def test_multi_epoch_sdl(datasize, num_workers, batch_size, shuffle):
    data_size = datasize
    # For reproducibility of testing, fixing the seed
    torch.manual_seed(0)
    dataloader1 = get_map_dl(
        data_size=data_size,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    # Run through the dataloader for 2 epochs and count the number of items yielded
    num_items_yielded = 0
    dataloader1_items = []
    for _ in range(2):
        for batch in dataloader1:
            dataloader1_items.append(batch)
            num_items_yielded += 1
    # Save the state dict
    state_dict = dataloader1.state_dict()
    # Create a new StatefulDataLoader instance and load the state dict
    new_dataloader1 = get_map_dl(
        data_size=data_size,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    new_dataloader1.load_state_dict(state_dict)
    # Run through the new dataloader for another 2 epochs and count the number of items yielded
    additional_num_items_yielded = 0
    for i in range(2):
        epoch_num_items_yielded = 0
        for batch in new_dataloader1:
            dataloader1_items.append(batch)
            epoch_num_items_yielded += 1
        additional_num_items_yielded += epoch_num_items_yielded
    # Check that the total number of items yielded is correct
    assert num_items_yielded + additional_num_items_yielded == data_size * 4

    # now run a second dataloder for 4 epochs and check if the order is same.
    # we need to fix the seed again since we want to bring the initial conditions to the same state as at the time of instantiating the first dataloader
    torch.manual_seed(0)
    dataloader2 = get_map_dl(
        data_size=data_size,
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )
    dataloader2_items = []
    for _ in range(4):
        for batch in dataloader2:
            dataloader2_items.append(batch)

    assert dataloader1_items == dataloader2_items


# -- TestMultiEpochState_shard0


class IndexDataset(torch.utils.data.Dataset):
    """ADAPTED: upstream's GeneratorIterable is an IterableDataset (no sampler) that yields (i, epoch) and
    counts its own epochs; a sampler needs a map-style dataset, and the epochs are the sampler's."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return i


def get_iterable_dl(pw, num_workers):
    data_size = [25, 50, 100, 75]
    dataset = IndexDataset(sum(data_size))  # ADAPTED: one map-style dataset; the workers share it by index
    return StatefulDataLoader(
        dataset=dataset,
        num_workers=num_workers,
        persistent_workers=pw,
        collate_fn=identity,
        sampler=StatefulSampler(dataset, seed=3),  # ADAPTED: our sampler plugged in
    )


@pytest.mark.parametrize("pw, num_workers", [(False, 0), pytest.param(True, 2, marks=pytest.mark.slow)],
                         ids=["test_inline", "test_pw"])  # fmt: skip
def test_multi_epoch_state(pw, num_workers):  # ADAPTED: test_pw at 2 workers (upstream: 4)
    dl = get_iterable_dl(pw, num_workers)
    exp0 = list(dl)
    state1 = dl.state_dict()
    exp1 = list(dl)
    exp2 = list(dl)
    # ADAPTED: upstream checks its dataset's epoch counter ((i, epoch - 1) == exp0); ours are the sampler's
    # epochs 0, 1, 2, each its own order of all 250 records, with no set_epoch called.
    order = StatefulSampler(250, seed=3)
    assert [exp0, exp1, exp2] == [[[i] for i in order.indices(epoch).tolist()] for epoch in range(3)]
    assert exp0 != exp1 != exp2

    dl = get_iterable_dl(pw, num_workers)
    it = iter(dl)
    for _ in range(2):
        next(it)
    dl.load_state_dict(state1)
    it = iter(dl)
    data1 = list(it)
    data2 = list(dl)
    assert data1 == exp1
    assert data2 == exp2
