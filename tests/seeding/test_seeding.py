"""Per-sample and per-worker seeds: exact, restoring, collision-free and independent streams."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from stateful_sampler import SampleKey
from stateful_sampler.order.mixing import (
    Domain,
    derive_seed,
    mix64,
    mix64_array,
    sample_seed,
    seed_words,
    worker_seed,
)
from stateful_sampler.seeding import (
    SampleRNG,
    SeededDataset,
    WorkerSeeds,
    seed_globals,
    seed_worker,
)
from stateful_sampler.seeding.generators import TORCH_GENERATOR_WORDS

U64 = st.integers(0, 2**64 - 1)


class Augmented:
    """Draws its 'augmentation' from all three global RNGs, as transforms commonly do."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        return index, torch.rand(1).item(), float(np.random.random()), random.random()


class ExplicitAugmented(Augmented):
    """Takes the sample's explicit generators instead of the globals."""

    def load_sample(self, index: int, rng: SampleRNG) -> tuple[int, float, float]:
        return index, torch.rand(1, generator=rng.torch).item(), float(rng.numpy.random())


def draws() -> np.ndarray:
    return np.array([torch.rand(1).item(), np.random.random(), random.random()])


def first_draws(seed: int) -> np.ndarray:
    """The first value each global stream draws after ``seed_globals(seed)``."""
    seed_globals(seed)
    return draws()


def global_states() -> tuple:
    numpy_state = np.random.get_state()
    numpy_state = (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:])
    return random.getstate(), numpy_state, torch.get_rng_state().tolist()


# -- exact and restoring


@settings(max_examples=40, deadline=None)
@given(seed=U64, epoch=st.integers(0, 2**40), index=st.integers(0, 2**40), outside=st.integers(0, 2**32 - 1))
def test_a_sample_draws_the_same_values_whatever_the_global_state(seed, epoch, index, outside):
    dataset = SeededDataset(Augmented())
    key = SampleKey(index % 100, seed, epoch, 5, False)
    first = dataset[key]
    random.seed(outside), np.random.seed(outside), torch.manual_seed(outside)
    assert dataset[key] == first
    assert first[1] is key
    seed_globals(sample_seed(seed, epoch, key.index))
    assert first[0] == (key.index, torch.rand(1).item(), float(np.random.random()), random.random())


@settings(max_examples=25, deadline=None)
@given(seed=U64, epoch=st.integers(0, 1000), outside=st.integers(0, 2**32 - 1))
def test_global_rng_states_are_restored_after_each_sample(seed, epoch, outside):
    random.seed(outside), np.random.seed(outside), torch.manual_seed(outside)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's legacy state
    torch.randn(1)
    before = global_states()
    dataset = SeededDataset(Augmented())
    for index in range(3):
        dataset[SampleKey(index, seed, epoch, index, False)]
        assert global_states() == before


class Failing(Augmented):
    def __getitem__(self, index: int):
        torch.rand(3), np.random.random(), random.random()
        raise KeyError(index)


def test_global_rng_states_are_restored_when_a_sample_fails():
    torch.manual_seed(1)
    before = global_states()
    with pytest.raises(KeyError):
        SeededDataset(Failing())[SampleKey(3, 0, 0, 0, False)]
    assert global_states() == before


def test_explicit_generators_are_exact_and_leave_the_globals_alone():
    dataset = SeededDataset(ExplicitAugmented())
    key = SampleKey(7, 11, 2, 0, False)
    torch.manual_seed(0)
    before = global_states()
    sample, _ = dataset[key]
    assert global_states() == before
    rng = SampleRNG(sample_seed(11, 2, 7))
    assert sample == (7, torch.rand(1, generator=rng.torch).item(), float(rng.numpy.random()))
    assert sample == dataset[key][0]
    assert dataset[key._replace(index=8)][0][1:] != sample[1:]


def test_torch_streams_use_all_64_bits_of_the_seed():
    # torch.manual_seed keeps only the low 32 bits: these two seeds give torch the same stream.
    low, high = 5, 5 + (1 << 40)
    assert torch.manual_seed(low).initial_seed() == low
    same = torch.rand(4), (torch.manual_seed(high), torch.rand(4))[1]
    assert torch.equal(*same)
    assert first_draws(low)[0] != first_draws(high)[0]
    assert torch.initial_seed() == high
    assert torch.rand(1, generator=SampleRNG(low).torch) != torch.rand(1, generator=SampleRNG(high).torch)


def test_torch_generator_runs_the_derived_mt19937_state():
    """torch's generator continues exactly the MT19937 stream NumPy runs from the same 624 words."""
    seed = 0xDEADBEEF12345678
    words = seed_words(seed, TORCH_GENERATOR_WORDS.start, TORCH_GENERATOR_WORDS.stop)
    reference = np.random.MT19937()
    reference.state = {"bit_generator": "MT19937", "state": {"key": words, "pos": 624}}
    expected = (reference.random_raw(1000) & 0xFFFFFF) / 2**24  # torch.rand's float32 from one word
    drawn = torch.rand(1000, generator=SampleRNG(seed).torch).double().numpy()
    np.testing.assert_array_equal(drawn, expected)


# -- no collisions, independent streams


@pytest.mark.slow
def test_a_million_distinct_triples_get_distinct_sample_seeds():
    seeds, epochs, indices = (
        axis.ravel()
        for axis in np.meshgrid(
            np.array([0, 1, 2, 3, 2**63, 2**64 - 1], dtype=np.uint64),
            np.arange(0, 17, dtype=np.uint64),
            np.arange(0, 10_000, dtype=np.uint64),
        )
    )
    state = np.full(seeds.shape, mix64(int(Domain.SAMPLE)), dtype=np.uint64)
    for words in (seeds, epochs, indices):  # derive_seed, vectorised: state = mix64(state ^ word)
        state = mix64_array(state ^ words, 0, state)
    assert seeds.size >= 10**6
    assert np.unique(state).size == seeds.size
    picks = np.random.default_rng(0).choice(seeds.size, 200, replace=False)
    assert [sample_seed(int(seeds[i]), int(epochs[i]), int(indices[i])) for i in picks] == state[picks].tolist()


def test_sample_and_worker_seeds_live_in_separate_domains():
    assert sample_seed(1, 2, 3) == derive_seed(Domain.SAMPLE, 1, 2, 3)
    assert worker_seed(1, 2, 3, 4) == derive_seed(Domain.WORKER, 1, 2, 3, 4)
    assert sample_seed(1, 2, 3) != derive_seed(Domain.WORKER, 1, 2, 3)


NEIGHBOURS = {  # a triple (seed, epoch, index) against the triple shifted by this much
    "next index": (0, 0, 1),
    "next seed": (1, 0, 0),
    "next epoch": (0, 1, 0),
    "next seed, previous index": (1, 0, -1),  # where Grain's seed + index collides
}


def independence_failures(draw, pairs: int = 3000) -> list[str]:
    """Where first draws of neighbouring triples are not independent: correlation and a chi-square
    test on the joint 8x8 histogram of the pairs, at bounds an independent pair fails ~1e-6 of the time."""
    failures = []
    base = [(s, 3, i) for s in range(30) for i in range(pairs // 30)]
    for name, (ds, de, di) in NEIGHBOURS.items():
        first = np.array([draw(s, e, i + 1) for s, e, i in base])
        second = np.array([draw(s + ds, e + de, i + 1 + di) for s, e, i in base])
        for column in range(first.shape[1]):
            a, b = first[:, column], second[:, column]
            r = np.corrcoef(a, b)[0, 1]
            table = np.histogram2d(a, b, bins=8, range=[[0, 1], [0, 1]])[0]
            p = stats.chi2_contingency(table)[1]
            if abs(r) > 5 / np.sqrt(len(a)) or p < 1e-6 or np.any(a == b):
                failures.append(f"{name}, stream {column}: r={r:.3f}, p={p:.2g}")
    return failures


@pytest.mark.slow
def test_neighbouring_triples_draw_independent_first_values():
    def ours(seed: int, epoch: int, index: int) -> np.ndarray:
        draws = first_draws(sample_seed(seed, epoch, index))
        rng = SampleRNG(sample_seed(seed, epoch, index))
        explicit = [torch.rand(1, generator=rng.torch, dtype=torch.float64).item(), rng.numpy.random()]
        return np.append(draws, explicit)

    assert independence_failures(ours) == []


def test_the_naive_seed_plus_index_scheme_fails_the_same_check():
    def naive(seed: int, epoch: int, index: int) -> np.ndarray:
        return np.array([np.random.default_rng(seed + epoch + index).random()])

    failures = independence_failures(naive, pairs=600)
    # seed + epoch + index gives many triples of the grid one seed, so every neighbour check fails.
    assert {failure.rsplit(", stream", 1)[0] for failure in failures} == set(NEIGHBOURS)
    assert any(failure.startswith("next seed, previous index, stream 0: r=1.000") for failure in failures)


# -- worker seeds


class FakeSampler:
    seed, epoch, rank = 9, 4, 1


def test_worker_seeder_seeds_from_seed_epoch_rank_and_worker_id():
    seed_worker(FakeSampler())(2)
    drawn = draws()
    np.testing.assert_array_equal(drawn, first_draws(worker_seed(9, 4, 1, 2)))
    seed_worker(np.uint64(9))(2)
    drawn = draws()
    np.testing.assert_array_equal(drawn, first_draws(worker_seed(9, 0, 0, 2)))
    assert not np.array_equal(drawn, first_draws(worker_seed(9, 0, 0, 3)))


def test_a_pickled_worker_seeder_carries_the_epoch_of_its_pickling_not_the_sampler():
    sampler = FakeSampler()
    sampler.dataset = list(range(100_000))  # stays behind: a spawned worker needs three ints
    seeder = seed_worker(sampler)
    payload = pickle.dumps(seeder)
    sampler.epoch = 5
    assert len(payload) < 300
    assert pickle.loads(payload).seeds() == WorkerSeeds(9, 4, 1)
    assert seeder.seeds() == WorkerSeeds(9, 5, 1)


# -- bad input


def test_a_plain_index_gets_a_type_error_saying_how_to_wire_the_sampler():
    expected = r"SeededDataset expects a SampleKey, got int 3: .*yield_keys=True.*sampler=sampler"
    with pytest.raises(TypeError, match=expected):
        SeededDataset(Augmented())[3]


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ("7", TypeError, "needs the loader's sampler .* got str without seed, epoch, rank"),
        (True, TypeError, "got bool"),
        (-1, ValueError, r"seed must be at least 0 and at most 18446744073709551615, got -1"),
        (2**64, ValueError, "seed must be at least 0"),
    ],
)
def test_seed_worker_refuses_what_is_neither_a_sampler_nor_a_seed(source, error, message):
    with pytest.raises(error, match=message):
        seed_worker(source)
