"""The ``fast`` order's permutation: a bijection at every size, and a fair shuffle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.order.permutation import MAX_SIZE, FeistelPermutation


def assert_bijection(size: int, seed: int = 0, pass_index: int = 0) -> None:
    values = FeistelPermutation(size, seed, pass_index)(np.arange(size, dtype=np.int64))
    assert values.dtype == np.int64
    assert values.shape == (size,)
    if size:
        assert 0 <= values.min() and values.max() < size
    assert np.array_equal(np.bincount(values, minlength=size), np.ones(size, dtype=np.int64))


def edge_lengths(max_exponent: int) -> list[int]:
    """4^k, 4^k±1, 2^k±1 and primes near powers of two: where Grain's index shuffle broke."""
    sizes = set()
    for k in range(1, max_exponent + 1):
        sizes.update({2**k - 1, 2**k, 2**k + 1})
        if 2 * k <= max_exponent:
            sizes.update({4**k - 1, 4**k, 4**k + 1})
    sizes.update({65521, 65537, 1048573, 1048583, 16777213, 16777259})  # primes around 2^16, 2^20, 2^24
    return sorted(s for s in sizes if s <= 2**max_exponent + 1)


@pytest.mark.slow  # exhaustive: every size; the edge lengths below stay fast
def test_every_size_up_to_2_pow_14_is_a_bijection() -> None:
    """Every size, exhaustively, where that is cheap (the cost of size N is N; 2**16 took a minute of
    CI); above it the edge lengths below, where cycle-walking shuffles have broken."""
    for size in range(2**14 + 2):
        assert_bijection(size, seed=size % 7)


@pytest.mark.parametrize("size", edge_lengths(24))
def test_edge_lengths_up_to_2_pow_24_are_bijections(size: int) -> None:
    assert_bijection(size, seed=3, pass_index=1)


@pytest.mark.parametrize(
    "size", [2**32 + 1, 4**18 + 1, 4**20, 2**40 - 1, 2**40, 2**40 + 1, 1099511627791, MAX_SIZE - 1]
)
def test_sizes_up_to_2_pow_40_and_beyond_round_trip(size: int) -> None:
    """Too large to enumerate (a Feistel network is a bijection by construction): the values land
    in range and are distinct, on a contiguous block at each end and a random sample."""
    perm = FeistelPermutation(size, seed=11, pass_index=2)
    rng = np.random.default_rng(size % 2**32)
    positions = np.concatenate(
        [
            np.arange(4096, dtype=np.int64),
            np.arange(size - 4096, size, dtype=np.int64),
            rng.integers(0, size, 50_000, dtype=np.int64),
        ]
    )
    positions = np.unique(positions)
    values = perm(positions)
    assert values.min() >= 0 and values.max() < size
    assert np.unique(values).size == positions.size


def test_size_bounds() -> None:
    with pytest.raises(ValueError, match=r"size must lie in \[0, 2\*\*62\)"):
        FeistelPermutation(MAX_SIZE, 0, 0)
    assert_bijection(0)
    assert_bijection(1)


@pytest.mark.parametrize("size", [2, 3, 10, 17, 100, 1025, 5000])
def test_each_record_equally_likely_at_each_position(size: int) -> None:
    """Chi-square over (position, record) counts from many seeds; deterministic seeds, so the
    p-value is a fixed number: the bound is a real quality bar, not a flaky draw."""
    seeds = 6000 if size <= 17 else 30 * size if size <= 100 else 400
    positions = np.arange(size, dtype=np.int64) if size <= 100 else np.arange(0, size, size // 50, dtype=np.int64)
    counts = np.zeros((positions.size, size))
    for seed in range(seeds):
        counts[np.arange(positions.size), FeistelPermutation(size, seed, 0)(positions)] += 1
    expected = seeds / size
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = positions.size * (size - 1)
    assert stats.chi2.sf(chi2, dof) > 1e-4, (chi2, dof)


def test_epochs_and_seeds_give_different_orders() -> None:
    size = 1000
    orders = {
        tuple(FeistelPermutation(size, seed, epoch)(np.arange(size, dtype=np.int64)))
        for seed, epoch in itertools.product(range(5), range(5))
    }
    assert len(orders) == 25


@pytest.mark.slow
def test_batch_mates_cover_everyone_with_workers() -> None:
    """10 samples, batch 4, 2 workers, 20 epochs: every sample shares a batch with all 9 others
    (a per-worker chunked shuffle only ever mixes fixed groups and fails this)."""
    sampler = StatefulSampler(10, seed=0, batch_size=4)
    loader = DataLoader(torch.arange(10), sampler=sampler, batch_size=4, num_workers=2)
    mates: dict[int, set[int]] = {i: set() for i in range(10)}
    for epoch in range(20):
        sampler.set_epoch(epoch)
        for batch in loader:
            for record in batch.tolist():
                mates[record].update(set(batch.tolist()) - {record})
    assert {record: len(others) for record, others in mates.items()} == {i: 9 for i in range(10)}


@settings(max_examples=100)
@given(size=st.integers(1, 2**62 - 1), seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40),
       data=st.data())  # fmt: skip
def test_a_few_positions_in_python_ints_are_the_block_s_values_bit_for_bit(
    size: int, seed: int, pass_index: int, data: st.DataObject
) -> None:
    """A block of a few positions (Python ints) gives what the NumPy rounds give inside a large block."""
    permutation = FeistelPermutation(size, seed, pass_index)
    few = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=8))
    near_the_top = np.arange(max(0, size - 300), size)  # cycle walking happens up here
    block = np.concatenate((np.array(few, dtype=np.int64), near_the_top, np.zeros(200, dtype=np.int64)))
    through_numpy = permutation(block)  # 200+ positions: the NumPy rounds
    one_by_one = [int(permutation(block[i : i + 1])[0]) for i in range(len(block))]
    assert one_by_one == through_numpy.tolist()
    assert permutation(np.array(few)).tolist() == through_numpy[: len(few)].tolist()


@settings(max_examples=60)
@given(
    cases=st.lists(
        st.tuples(st.one_of(st.integers(1, 1100), st.integers(1, 2**62 - 1)), st.integers(0, 2**63 - 1),
                  st.integers(0, 2**40), st.floats(0, 1, exclude_max=True)),
        min_size=1, max_size=40,
    )
)  # fmt: skip
def test_permute_many_is_each_permutation_bit_for_bit(cases: list[tuple[int, int, int, float]]) -> None:
    from stateful_sampler.order.permutation import permute_many

    sizes, seeds, passes = (np.array([case[i] for case in cases], dtype=np.int64) for i in range(3))
    values = np.array([min(int(size * fraction), size - 1) for size, _, _, fraction in cases], dtype=np.int64)
    expected = [int(FeistelPermutation(*case[:3])(np.array([value]))[0]) for case, value in zip(cases, values)]
    assert permute_many(sizes, seeds, passes, values).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    size=st.one_of(
        st.integers(1, 1100), st.integers(1, 2**28), st.integers(1, 2**32), st.sampled_from([2**28, 2**28 + 1, 10**7])
    ),
    seed=st.integers(0, 2**63 - 1),
    pass_index=st.integers(0, 2**40),
    data=st.data(),
)
def test_a_block_through_the_round_tables_is_the_hashed_rounds_bit_for_bit(
    size: int, seed: int, pass_index: int, data: st.DataObject
) -> None:
    """A block of at least m positions of a domain with m up to 2**14 reads each round's F from a table; a second
    block of any size then reads it too. Both are what the hashed rounds give (tables off: a private limit of 0)."""
    from unittest import mock

    from stateful_sampler.order import permutation as module

    tabled = FeistelPermutation(size, seed, pass_index)
    width = min(size, tabled._m + data.draw(st.integers(0, 300)))  # private: m, the block that builds the tables
    start = data.draw(st.integers(0, size - width))
    block = np.concatenate((np.arange(start, start + width), np.arange(max(0, size - 300), size)))  # walks near the top
    later = np.array(data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=200)), dtype=np.int64)
    first, second = tabled(block), tabled(later)
    with mock.patch.object(module, "_TABLE_HALF", 0):  # private: the table limit
        hashed = FeistelPermutation(size, seed, pass_index)
        assert first.tolist() == hashed(block).tolist()
        assert second.tolist() == hashed(later).tolist()
    numpy_rounds = len(block) * module.rounds_for(size) > module._SMALL_BLOCK  # private: fewer go in Python ints
    assert (tabled._tables is not None) == (tabled._m <= module._TABLE_HALF and numpy_rounds)
