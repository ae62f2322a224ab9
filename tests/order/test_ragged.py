"""``order/ragged.py`` on its own: one seeded bijection on [0, size_d) for every domain d, evaluated for a block
of (domain, value) pairs at once, each pair getting what it gets alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stateful_sampler.order.ragged import RaggedPermutation

SEEDS = st.integers(0, 2**63 - 1)


def images(permutation: RaggedPermutation, seed: int, domain: int) -> np.ndarray:
    size = int(permutation.sizes[domain])
    return permutation(seed, np.full(size, domain, dtype=np.int64), np.arange(size, dtype=np.int64))


def test_the_images_of_a_fixed_seed_are_pinned() -> None:
    """A change here reorders every saved ``Grouped`` and ``Mixture`` run: it must be deliberate."""
    permutation = RaggedPermutation(np.array([5, 1, 12]))
    assert images(permutation, 7, 0).tolist() == [0, 2, 3, 1, 4]
    assert images(permutation, 7, 1).tolist() == [0]
    assert images(permutation, 7, 2).tolist() == [8, 11, 5, 9, 7, 10, 4, 2, 3, 6, 0, 1]


def test_the_moduli_of_a_huge_square_domain_are_exact() -> None:
    """At 2147283648**2 records the float square root of size - 1 rounds up a whole unit: the moduli are
    corrected to the exact integer root, and the images are pinned (a wrong root is another permutation)."""
    size = 2147283648**2
    permutation = RaggedPermutation(np.array([size], dtype=np.int64))
    drawn = permutation(3, np.zeros(4, dtype=np.int64), np.array([0, 1, 2, size - 1], dtype=np.int64))
    assert drawn.tolist() == [2651133661890276952, 3172733411529955015, 95117761789602126, 1936026512809353887]


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=12), seed=SEEDS)
def test_each_domain_is_a_bijection_of_its_own_size(sizes: list[int], seed: int) -> None:
    permutation = RaggedPermutation(np.array(sizes))
    for domain, size in enumerate(sizes):
        drawn = images(permutation, seed, domain)
        assert drawn.dtype == np.int64
        assert sorted(drawn.tolist()) == list(range(size))


def test_edge_sizes_are_bijections() -> None:
    """Squares, one either side of them and of powers of two: where the moduli (m, n) and the cycle walk turn."""
    sizes = sorted({s for k in range(1, 12) for base in (k * k, 2**k) for s in (base - 1, base, base + 1) if s >= 1})
    permutation = RaggedPermutation(np.array(sizes))
    for domain, size in enumerate(sizes):
        for seed in (0, 1, 2**63 - 1):
            assert sorted(images(permutation, seed, domain).tolist()) == list(range(size))


@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=10),
    seed=SEEDS,
    data=st.data(),
)
def test_a_mixed_block_gives_each_pair_what_it_gets_alone(sizes: list[int], seed: int, data: st.DataObject) -> None:
    permutation = RaggedPermutation(np.array(sizes))
    count = data.draw(st.integers(1, 50))
    domains = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=count, max_size=count)))
    values = np.array([data.draw(st.integers(0, sizes[d] - 1)) for d in domains], dtype=np.int64)
    block = permutation(seed, domains, values)
    for index in range(count):
        alone = permutation(seed, domains[index : index + 1], values[index : index + 1])
        assert int(block[index]) == int(alone[0]) == int(images(permutation, seed, int(domains[index]))[values[index]])


def test_huge_domains_stay_in_range_and_distinct() -> None:
    """Too large to enumerate (sizes up to 2**62 - 1, moduli below 2**31): a block at each end and a random
    sample land in range and are distinct."""
    sizes = np.array([2**62 - 1, 2**40 + 1, 2**31 + 11], dtype=np.int64)
    permutation = RaggedPermutation(sizes)
    rng = np.random.default_rng(5)
    for domain, size in enumerate(sizes.tolist()):
        values = np.unique(
            np.concatenate(
                [np.arange(2048), np.arange(size - 2048, size), rng.integers(0, size, 4096, dtype=np.int64)]
            ).astype(np.int64)
        )
        drawn = permutation(3, np.full(len(values), domain, dtype=np.int64), values)
        assert 0 <= int(drawn.min()) and int(drawn.max()) < size
        assert len(np.unique(drawn)) == len(values)


def test_seeds_and_domains_shuffle_differently() -> None:
    permutation = RaggedPermutation(np.array([50, 50]))
    orders = {tuple(images(permutation, seed, domain).tolist()) for seed in range(4) for domain in range(2)}
    assert len(orders) == 8
    assert tuple(range(50)) not in orders
    assert np.array_equal(images(permutation, 9, 0), images(permutation, 9, 0))  # pure in (seed, domain)


@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=10), data=st.data())
def test_at_seeds_gives_each_value_what_its_own_seed_gives(sizes: list[int], data: st.DataObject) -> None:
    """``at_seeds`` is the block of per-seed calls it replaces (a mixture's draws under many source-epochs)."""
    permutation = RaggedPermutation(np.array(sizes))
    count = data.draw(st.integers(0, 40))
    seeds = data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=count, max_size=count))
    domains = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=count, max_size=count)), np.int64)
    values = np.array([data.draw(st.integers(0, sizes[d] - 1)) for d in domains], dtype=np.int64)
    block = permutation.at_seeds(np.array(seeds, dtype=np.uint64), domains, values)
    alone = [int(permutation(seed, domains[i : i + 1], values[i : i + 1])[0]) for i, seed in enumerate(seeds)]
    assert block.dtype == np.int64 and block.tolist() == alone


@given(sizes=st.lists(st.integers(1, 60), min_size=2, max_size=10), seed=SEEDS, data=st.data())
def test_at_seeds_with_one_seed_and_with_two_is_the_per_seed_call(
    sizes: list[int], seed: int, data: st.DataObject
) -> None:
    """A block under one seed takes that seed's round keys once; a second seed turns on per-value keys: the same."""
    permutation = RaggedPermutation(np.array(sizes))
    domains = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=2, max_size=30)), np.int64)
    values = np.array([data.draw(st.integers(0, sizes[d] - 1)) for d in domains], dtype=np.int64)
    seeds = np.full(len(domains), seed, dtype=np.uint64)
    assert permutation.at_seeds(seeds, domains, values).tolist() == permutation(seed, domains, values).tolist()
    seeds[-1] ^= np.uint64(1)
    alone = permutation(int(seeds[-1]), domains[-1:], values[-1:])
    assert permutation.at_seeds(seeds, domains, values).tolist() == [*permutation(seed, domains, values)[:-1], *alone]
