"""The fast per-sample seeding draws exactly what the original one-sample-at-a-time seeding drew, and
puts every global state back, whether samples come one by one or as a DataLoader batch."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import SampleKey
from stateful_sampler.order.mixing import (
    Domain,
    derive_seed,
    extend_seed,
    sample_seed,
    sample_seeds,
    seed_word_rows,
    seed_words,
)
from stateful_sampler.seeding import GLOBAL_RNGS, SampleRNG, SeededDataset, legacy_mt, seed_globals
from stateful_sampler.seeding.legacy_mt import LegacyMT
from tests.seeding.test_seeding import global_states

U64 = st.integers(0, 2**64 - 1)


class DrawsEverything:
    """Draws from every global stream, Gaussians included (NumPy and ``random`` cache every other one)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> tuple:
        return (
            index,
            random.random(),
            random.gauss(0, 1),
            *np.random.random(2).tolist(),
            float(np.random.standard_normal()),
            *torch.rand(2).tolist(),
            torch.randn(1).item(),
        )


class WithGenerators(DrawsEverything):
    def load_sample(self, index: int, rng: SampleRNG) -> tuple:
        drawn = self[index]
        return drawn + (torch.rand(1, generator=rng.torch).item(), float(rng.numpy.random()))


@contextmanager
def _restored() -> Iterator[None]:
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(saved[0]), np.random.set_state(saved[1]), torch.set_rng_state(saved[2])


def reference(dataset: Any, key: SampleKey, seed: int | None = None) -> Any:
    """What SeededDataset loaded before it was made fast: seed all three globals, load, put them back."""
    sample = sample_seed(key.seed if seed is None else seed, key.epoch, key.index)
    with _restored():
        seed_globals(sample)
        load_sample = getattr(dataset, "load_sample", None)
        return dataset[key.index] if load_sample is None else load_sample(key.index, SampleRNG(sample))


def keys_of(seed: int, epoch: int, indices: list[int]) -> list[SampleKey]:
    return [SampleKey(index, seed, epoch, position, False) for position, index in enumerate(indices)]


def disturb_outside(outside: int) -> None:
    """An arbitrary caller state, with a cached Gaussian in both NumPy and ``random``."""
    random.seed(outside), np.random.seed(outside % 2**32), torch.manual_seed(outside)
    random.gauss(0, 1), np.random.standard_normal(), torch.randn(1)


@settings(max_examples=30, deadline=None)
@given(
    seed=U64,
    epoch=st.integers(0, 2**40),
    indices=st.lists(st.integers(0, 999), min_size=1, max_size=20),
    outside=st.integers(0, 2**63),
    generators=st.booleans(),
)
def test_a_batch_draws_what_each_sample_drew_alone_before_and_restores_every_global_state(
    seed, epoch, indices, outside, generators
):
    inner = WithGenerators() if generators else DrawsEverything()
    keys = keys_of(seed, epoch, indices)
    disturb_outside(outside)
    before = global_states()
    expected = [reference(inner, key) for key in keys]
    assert global_states() == before
    batch = SeededDataset(inner).__getitems__(keys)
    assert global_states() == before
    assert batch == list(zip(expected, keys))
    assert [SeededDataset(inner)[key] for key in keys] == batch
    assert global_states() == before


def test_the_cached_gaussians_of_the_caller_survive_a_load():
    disturb_outside(5)
    after_load = SeededDataset(DrawsEverything())[SampleKey(1, 2, 3, 0, False)] and (
        np.random.standard_normal(),
        random.gauss(0, 1),
    )
    disturb_outside(5)
    assert (np.random.standard_normal(), random.gauss(0, 1)) == after_load


class Nested(DrawsEverything):
    """A record whose load first loads another record through an inner SeededDataset."""

    def __init__(self) -> None:
        self.inner = SeededDataset(DrawsEverything())

    def __getitem__(self, index: int) -> tuple:
        first = np.random.random(), random.random(), torch.rand(1).item()
        inner = self.inner[SampleKey(index + 1, 77, 0, 0, False)][0]
        return first, inner, (np.random.random(), random.random(), torch.rand(1).item())


def test_a_load_nested_in_a_load_leaves_the_outer_samples_streams_as_they_were():
    keys = keys_of(3, 1, [4, 9, 4])
    assert SeededDataset(Nested()).__getitems__(keys) == [(reference(Nested(), key), key) for key in keys]


@pytest.mark.parametrize("chosen", [("torch",), ("numpy",), ("random",), ("random", "torch")])
def test_each_chosen_global_draws_its_seeded_stream_and_the_others_draw_on_from_the_callers(chosen):
    key = SampleKey(6, 8, 2, 0, False)
    disturb_outside(11)
    sample, _ = SeededDataset(DrawsEverything(), global_rngs=chosen)[key]
    disturb_outside(11)
    unseeded = DrawsEverything()[6]
    seeded = reference(DrawsEverything(), key)
    columns = {"random": slice(1, 3), "numpy": slice(3, 6), "torch": slice(6, 9)}
    for name, columns_of in columns.items():
        assert sample[columns_of] == (seeded if name in chosen else unseeded)[columns_of], name


def test_a_failing_sample_in_a_batch_leaves_every_global_state_as_it_was():
    class FailsAtSeven(DrawsEverything):
        def __getitem__(self, index: int) -> tuple:
            if index == 7:
                raise KeyError(index)
            return super().__getitem__(index)

    disturb_outside(3)
    before = global_states()
    with pytest.raises(KeyError):
        SeededDataset(FailsAtSeven()).__getitems__(keys_of(1, 0, [1, 2, 7, 3]))
    assert global_states() == before


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(U64, st.integers(1, 2**32 - 1), st.just(2**32)))
def test_numpys_legacy_seeding_through_cpython_random_equals_numpys_own(key):
    fast = LegacyMT()
    fast.seed(key)
    np.random.seed(np.array([key & 0xFFFFFFFF, key >> 32], dtype=np.uint32))
    expected = np.random.get_state()
    state = fast.bit_generator.state["state"]
    assert state["pos"] == expected[2]
    np.testing.assert_array_equal(state["key"], expected[1])


def test_the_cpython_fast_path_is_taken_here_and_numpys_own_path_gives_the_same_batch(monkeypatch):
    assert legacy_mt._computer() is not None  # CPython: the fast path is checked and in use
    keys = keys_of(9, 4, list(range(12)))
    fast = SeededDataset(DrawsEverything()).__getitems__(keys)
    monkeypatch.setattr(LegacyMT, "__init__", _numpy_path_only)
    monkeypatch.setattr("stateful_sampler.seeding.process_rngs._spares", [])
    assert SeededDataset(DrawsEverything()).__getitems__(keys) == fast


def _numpy_path_only(self: LegacyMT) -> None:
    self.bit_generator = np.random.MT19937()
    self._computer = None


@settings(max_examples=20, deadline=None)
@given(seeds=st.lists(U64, min_size=1, max_size=9), epochs=st.lists(U64, min_size=9, max_size=9))
def test_batch_seed_derivations_equal_the_scalar_ones(seeds, epochs):
    array = np.array(seeds, dtype=np.uint64)
    rows = seed_word_rows(array, 0, 8)
    for row, seed in zip(rows, seeds):
        np.testing.assert_array_equal(row, seed_words(seed, 0, 8))
    derived = sample_seeds(array, np.array(epochs[: len(seeds)], dtype=np.uint64), array[::-1])
    assert derived.tolist() == [sample_seed(s, e, i) for s, e, i in zip(seeds, epochs, seeds[::-1])]


def test_all_three_globals_are_seeded_by_default():
    assert SeededDataset(DrawsEverything()).global_rngs == frozenset(GLOBAL_RNGS) == {"random", "numpy", "torch"}


@settings(max_examples=50, deadline=None)
@given(words=st.lists(U64, min_size=0, max_size=4), word=U64)
def test_extending_a_derived_seed_by_a_word_equals_deriving_it_with_that_word(words, word):
    assert extend_seed(derive_seed(Domain.SAMPLE, *words), word) == derive_seed(Domain.SAMPLE, *words, word)
