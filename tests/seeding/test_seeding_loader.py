"""Per-sample seeding through real DataLoaders: every sample's augmentation is exact after a
mid-epoch resume, whatever the worker count, the world size, or the main process's RNG."""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from stateful_sampler import StatefulSampler
from stateful_sampler.seeding import SeededDataset, seed_worker

SIZE, BATCH, SEED, EPOCHS = 22, 4, 12345, 2
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
Row = tuple  # (epoch, position, index, is_padding, torch draw, numpy draw, random draw)


class Augmented(Dataset):
    """Each record's 'augmentation' comes from torch.rand, np.random and random.random."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, torch.rand(1).item(), np.random.random(), random.random()], dtype=torch.float64)


def perturb_main_rng(draws: int) -> None:
    torch.rand(draws), np.random.random(draws), [random.random() for _ in range(draws)]


def make(
    num_workers: int,
    *,
    world_size: int = 1,
    rank: int = 0,
    tail: str = "pad",
    seed: int = SEED,
    persistent: bool = False,
) -> tuple[StatefulSampler, DataLoader]:
    batch = BATCH // world_size
    sampler = StatefulSampler(
        Augmented(), seed=seed, num_replicas=world_size, rank=rank, tail=tail, batch_size=batch, yield_keys=True
    )
    loader = DataLoader(
        SeededDataset(Augmented()),
        sampler=sampler,
        batch_size=batch,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    return sampler, loader


def rows_of(batch: tuple[torch.Tensor, object]) -> list[Row]:
    samples, keys = batch
    return [
        (int(epoch), int(position), int(sample[0]), bool(padding), *sample[1:].tolist())
        for epoch, position, padding, sample in zip(keys.epoch, keys.position, keys.is_padding, samples)
    ]


def train(
    sampler: StatefulSampler, loader: DataLoader, *, stop_at: tuple[int, int] | None = None, epochs: int = EPOCHS
) -> tuple[list[Row], dict | None]:
    """Rows of every sample trained on, epoch by epoch from the sampler's epoch; with ``stop_at``
    = (epoch, batches), stop after that many batches of that epoch and return the state to resume."""
    rows: list[Row] = []
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for consumed, batch in enumerate(loader, 1):
            rows += rows_of(batch)
            if stop_at == (epoch, consumed):
                return rows, sampler.state_dict(consumed_batches=consumed)
    return rows, None


@cache
def uninterrupted(num_workers: int, tail: str = "pad", seed: int = SEED) -> list[Row]:
    return train(*make(num_workers, tail=tail, seed=seed))[0]


def interrupted(
    save_workers: int,
    resume_workers: int,
    stop_at: tuple[int, int],
    *,
    tail: str = "pad",
    seed: int = SEED,
    persistent: bool = False,
) -> list[Row]:
    before, state = train(*make(save_workers, tail=tail, seed=seed, persistent=persistent), stop_at=stop_at)
    assert state is not None
    perturb_main_rng(7)
    sampler, loader = make(resume_workers, tail=tail, seed=seed, persistent=persistent)
    sampler.load_state_dict(state)
    return before + train(sampler, loader)[0]


def test_the_augmentation_differs_between_samples_and_epochs():
    rows = uninterrupted(0)
    assert len(rows) == EPOCHS * SIZE
    draws = [row[4:] for row in rows]
    assert len(set(draws)) == len(draws)
    assert sorted(row[2] for row in rows if row[0] == 0) == list(range(SIZE))


@settings(max_examples=15, deadline=None)
@given(
    stop_epoch=st.integers(0, EPOCHS - 1),
    stop_batch=st.integers(1, 5),
    tail=st.sampled_from(["pad", "drop", "uneven", "carry"]),
    seed=st.integers(0, 2**63 - 1),  # default_collate cannot put a key's seed >= 2**63 in an int64 tensor
)
def test_a_resume_at_any_batch_sees_exactly_the_samples_of_the_uninterrupted_run(stop_epoch, stop_batch, tail, seed):
    expected = uninterrupted(0, tail, seed)
    assert interrupted(0, 0, (stop_epoch, stop_batch), tail=tail, seed=seed) == expected


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [2, 3])
def test_any_worker_count_draws_the_same_values(num_workers):
    assert uninterrupted(num_workers) == uninterrupted(0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("save_workers", "resume_workers", "stop_at", "persistent"),
    [
        (2, 2, (0, 3), False),
        (2, 2, (1, 2), True),
        (0, 2, (0, 4), False),
        (2, 3, (1, 1), False),
        (3, 0, (0, 2), False),
    ],
)
def test_a_mid_epoch_resume_with_workers_sees_exactly_the_uninterrupted_values(
    save_workers, resume_workers, stop_at, persistent
):
    assert interrupted(save_workers, resume_workers, stop_at, persistent=persistent) == uninterrupted(0)


def two_rank_rows(num_workers: int, tail: str = "pad") -> list[Row]:
    """Both ranks of a simulated world of 2, interleaved step by step as DDP runs them."""
    rows = []
    runs = [make(num_workers, world_size=2, rank=rank, tail=tail) for rank in (0, 1)]
    for epoch in range(EPOCHS):
        for sampler, _ in runs:
            sampler.set_epoch(epoch)
        for batches in zip(*(loader for _, loader in runs)):
            for batch in batches:
                rows += rows_of(batch)
    return rows


def assert_same_values_per_global_position(world_rows: list[Row], single_rows: list[Row]) -> None:
    """Real records carry the single-rank values of their global position; padding repeats the
    values of its record in that epoch."""
    single = {(row[0], row[1]): row for row in single_rows}
    by_record = {(row[0], row[2]): row[4:] for row in single_rows}
    real = [row for row in world_rows if not row[3]]
    assert sorted(real) == sorted(single_rows)
    for row in world_rows:
        assert row[4:] == (by_record[row[0], row[2]] if row[3] else single[row[0], row[1]][4:])


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_world_size_two_draws_the_values_of_world_size_one_per_global_position(num_workers):
    world_rows = two_rank_rows(num_workers)
    assert not any(row[3] for row in world_rows)  # 22 records split evenly over 2 ranks
    assert_same_values_per_global_position(world_rows, uninterrupted(0))


def test_padding_on_two_ranks_repeats_its_records_values():
    odd = StatefulSampler(21, seed=SEED, num_replicas=2, rank=1, batch_size=2, yield_keys=True)
    loader = DataLoader(SeededDataset(Augmented()), sampler=odd, batch_size=2)
    rows = [row for batch in loader for row in rows_of(batch)]
    padding = [row for row in rows if row[3]]
    assert [row[1] for row in padding] == [21]
    single = StatefulSampler(21, seed=SEED, batch_size=4, yield_keys=True)
    single_rows = [
        row for batch in DataLoader(SeededDataset(Augmented()), sampler=single, batch_size=4) for row in rows_of(batch)
    ]
    assert padding[0][4:] == next(row[4:] for row in single_rows if row[2] == padding[0][2])


@pytest.mark.slow
def test_seed_worker_passed_uncalled_fails_in_the_worker_saying_it_is_a_factory():
    loader = DataLoader(Augmented(), batch_size=2, num_workers=1, worker_init_fn=seed_worker)
    expected = r"seed_worker is a factory: pass worker_init_fn=seed_worker\(sampler\), not seed_worker"
    with pytest.raises(TypeError, match=expected):
        next(iter(loader))


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_a_run_saved_on_two_ranks_and_resumed_on_one_draws_the_single_rank_values(steps):
    runs = [make(0, world_size=2, rank=rank) for rank in (0, 1)]
    before = []
    for step, batches in enumerate(zip(*(loader for _, loader in runs)), 1):
        before += [row for batch in batches for row in rows_of(batch)]
        if step == steps:
            break
    state = runs[0][0].state_dict(consumed_batches=steps)
    assert runs[1][0].state_dict(consumed_batches=steps) == state
    sampler, loader = make(0)
    sampler.load_state_dict(state)
    after = train(sampler, loader)[0]
    assert sorted(before) + after == uninterrupted(0)
