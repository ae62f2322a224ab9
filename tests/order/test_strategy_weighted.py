"""``Weighted``: draws in proportion to the weights, each position a pure function of (seed, pass, position)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from stateful_sampler import IncompatibleStateError, SampleKey, SeededDataset, StatefulSampler
from stateful_sampler.order.weighted import Weighted, alias_table
from tests.strategy_resume_checks import elastic_resume, loader_resume, sigkilled_run

weight_lists = st.lists(st.floats(0, 1e6, allow_nan=False) | st.sampled_from([0.0, 1e-300, 1.0]), min_size=1,
                        max_size=200).filter(lambda w: sum(w) > 0)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(weights=weight_lists)
@example(weights=[1.0, 806489.313231263, 806489.313231263, 806489.313231263, 1.0, 1.0])  # a deficit sum = a surplus sum
def test_the_alias_table_gives_each_record_exactly_its_share_of_the_weight(weights: list[float]) -> None:
    w = np.array(weights)
    prob, alias = alias_table(w)
    assert np.all((0 <= prob) & (prob <= 1))
    share = prob.copy()
    np.add.at(share, alias, 1 - prob)  # a column's remainder goes to its alias
    np.testing.assert_allclose(share / len(w), w / w.sum(), rtol=0, atol=1e-12)


@settings(max_examples=12, deadline=None)
@given(weights=st.lists(st.integers(0, 20), min_size=2, max_size=12).filter(lambda w: sum(w) > 0),
       seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40))  # fmt: skip
def test_frequencies_converge_to_the_weights_by_a_chi_square_test(
    weights: list[int], seed: int, pass_index: int
) -> None:
    w = np.array(weights, dtype=float)
    draws = 20_000
    order = Weighted(w, num_samples=draws).pass_order(len(w), seed, pass_index)(np.arange(draws))
    counts = np.bincount(order, minlength=len(w))
    assert counts[w == 0].sum() == 0
    positive = w > 0
    if positive.sum() > 1:
        assert chisquare(counts[positive], draws * w[positive] / w.sum()).pvalue > 1e-6


def test_any_block_of_positions_draws_what_the_whole_pass_draws_there() -> None:
    strategy = Weighted(np.arange(1, 101) ** 2.0, num_samples=5000)
    whole = strategy.pass_order(100, 7, 3)(np.arange(5000))
    block = np.array([4999, 17, 2500, 0])
    assert strategy.pass_order(100, 7, 3)(block).tolist() == whole[block].tolist()
    assert not np.array_equal(strategy.pass_order(100, 7, 4)(np.arange(5000)), whole)  # each pass draws anew
    assert not np.array_equal(strategy.pass_order(100, 8, 3)(np.arange(5000)), whole)  # and each seed


@settings(max_examples=40, deadline=None)
@given(weights=weight_lists, seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40))
def test_without_replacement_a_pass_takes_each_record_of_positive_weight_once(
    weights: list[float], seed: int, pass_index: int
) -> None:
    w = np.array(weights)
    strategy = Weighted(w, replacement=False)
    length = strategy.pass_length(len(w), pass_index)
    order = strategy.pass_order(len(w), seed, pass_index)(np.arange(length))
    assert sorted(order.tolist()) == np.flatnonzero(w).tolist()


def test_without_replacement_the_first_draw_follows_the_weights() -> None:
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    first = [Weighted(w, replacement=False, num_samples=2).pass_order(5, 11, p)(np.array([0]))[0] for p in range(8000)]
    counts = np.bincount(first, minlength=5)
    assert counts[4] == 0
    assert chisquare(counts[:4], 8000 * w[:4] / w.sum()).pvalue > 1e-6


def test_the_default_pass_length_is_n_with_replacement_and_the_positive_weights_without() -> None:
    w = [0.0, 1.0, 2.0, 0.0, 5.0]
    assert StatefulSampler(5, strategy=Weighted(w)).total_size == 5
    assert StatefulSampler(5, strategy=Weighted(w, replacement=False)).total_size == 3
    assert StatefulSampler(5, strategy=Weighted(w, num_samples=12)).total_size == 12


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly(workers: int) -> None:
    weights = np.arange(90) % 7 + 0.5
    make = lambda: StatefulSampler(90, seed=3, batch_size=4, strategy=Weighted(weights, num_samples=70))
    whole, resumed = loader_resume(make, workers, consumed=9)
    assert resumed == whole


def test_a_loader_resumed_without_replacement_continues_exactly() -> None:
    make = lambda: StatefulSampler(90, seed=3, batch_size=4, strategy=Weighted(np.arange(90) % 7, replacement=False))
    whole, resumed = loader_resume(make, 0, consumed=5)
    assert resumed == whole


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Any) -> None:
    whole, cut = sigkilled_run("weighted", tmp_path)
    assert len(whole) == 45  # 15 steps an epoch, 3 epochs; step 20 is inside epoch 1
    assert cut == whole


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(1, 60),
    num_samples=st.integers(1, 90),
    replacement=st.booleans(),
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch_size=st.integers(1, 5),
    steps=st.integers(0, 30),
    tail=st.sampled_from(["pad", "drop", "uneven"]),
)
def test_a_state_saved_on_w_ranks_resumes_on_another_world_size_with_every_position_once(
    size: int, num_samples: int, replacement: bool, worlds: tuple[int, int], batch_size: int, steps: int, tail: str
) -> None:
    weights = np.arange(size) % 3 + 1.0
    num_samples = num_samples if replacement else min(num_samples, size)
    if tail == "drop" and min(size, num_samples) < max(worlds):
        tail = "pad"
    strategy = lambda: Weighted(weights, num_samples=num_samples, replacement=replacement)
    elastic_resume(strategy, size, worlds, batch_size, steps, tail)


def test_a_state_from_other_weights_is_refused_naming_the_strategy_fingerprint() -> None:
    saved = StatefulSampler(4, strategy=Weighted([1, 2, 3, 4])).state_dict()
    others = (Weighted([1, 2, 3, 5]), Weighted([1, 2, 3, 4], num_samples=4), Weighted([1, 2, 3, 4], replacement=False))
    for other in others:
        with pytest.raises(IncompatibleStateError, match="strategy_fingerprint"):
            StatefulSampler(4, strategy=other).load_state_dict(saved)
    StatefulSampler(4, strategy=Weighted(torch.tensor([1.0, 2.0, 3.0, 4.0]))).load_state_dict(saved)  # same weights


class Noise:
    """A record whose sample is one draw of the sample's generator: equal draws, equal augmentations."""

    def __len__(self) -> int:
        return 3

    def load_sample(self, index: int, rng: Any) -> float:
        return float(rng.numpy.random())


def test_per_draw_seeding_gives_each_draw_of_a_record_its_own_augmentation() -> None:
    sampler = StatefulSampler(3, seed=5, strategy=Weighted([1, 1, 1], num_samples=30), yield_keys=True)
    keys: list[SampleKey] = list(sampler)
    per_record = SeededDataset(Noise(), global_rngs=())
    per_draw = SeededDataset(Noise(), global_rngs=(), per_draw=True)
    record = keys[0].index
    repeats = [key for key in keys if key.index == record]
    assert len(repeats) > 1
    assert len({per_record[key][0] for key in repeats}) == 1  # (seed, epoch, index) alone: one augmentation
    assert len({per_draw[key][0] for key in repeats}) == len(repeats)
    assert per_draw[repeats[1]][0] == SeededDataset(Noise(), global_rngs=(), per_draw=True)[repeats[1]][0]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: Weighted([1.0, -1.0]), ValueError, "weights must be finite and non-negative, got -1.0 at position 1"),
        (lambda: Weighted([1.0, float("nan")]), ValueError,
         "weights must be finite and non-negative, got nan at position 1"),
        (lambda: Weighted([float("inf")]), ValueError,
         "weights must be finite and non-negative, got inf at position 0"),
        (lambda: Weighted([0, 0.0]), ValueError, r"weights must have a positive sum, got all zeros \(2 weights\)"),
        (lambda: Weighted(["a"]), TypeError, "weights must hold numbers, got dtype <U1"),
        (lambda: Weighted([1.0], num_samples=0), ValueError, r"num_samples must be at least 1 and at most \d+, got 0"),
        (lambda: Weighted([1.0], replacement=0), TypeError, "replacement must be a bool, got int 0"),
        (lambda: Weighted([1.0, 0.0, 2.0], num_samples=3, replacement=False), ValueError,
         "num_samples must be at most 2, the records of positive weight, without replacement; got 3"),
        (lambda: StatefulSampler(3, strategy=Weighted([1.0, 2.0])), ValueError,
         "weights must have one entry per record: length 3, got 2"),
        (lambda: SeededDataset(Noise(), per_draw=1), TypeError, "per_draw must be a bool, got int 1"),
    ],
)  # fmt: skip
def test_bad_weights_are_refused_naming_the_argument(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        call()
