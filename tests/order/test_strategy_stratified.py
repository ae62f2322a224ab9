"""``Stratified``: every prefix of a pass a small copy of the class distribution, or every class once a window."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.order.stratified import Stratified, proportional_slots
from tests.strategy_resume_checks import elastic_resume, loader_resume, sigkilled_run

label_lists = st.lists(st.integers(0, 9), min_size=1, max_size=300)


def whole_pass(strategy: Stratified, size: int, seed: int, pass_index: int) -> np.ndarray:
    return strategy.pass_order(size, seed, pass_index)(np.arange(strategy.pass_length(size, pass_index)))


def prefix_counts(classes: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``counts[p - 1, c]``: how many of the first p positions hold class ``ids[c]``."""
    return np.cumsum(classes[:, None] == ids[None, :], axis=0)


@settings(max_examples=100, deadline=None)
@given(labels=label_lists, seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40))
def test_proportional_keeps_every_class_within_one_of_its_share_at_every_prefix(
    labels: list[int], seed: int, pass_index: int
) -> None:
    y = np.array(labels)
    order = whole_pass(Stratified(y), len(y), seed, pass_index)
    assert sorted(order.tolist()) == list(range(len(y)))  # a permutation of all N records
    ids, sizes = np.unique(y, return_counts=True)
    counts = prefix_counts(y[order], ids)
    quota = np.arange(1, len(y) + 1)[:, None] * sizes[None, :]
    assert np.all(quota // len(y) <= counts) and np.all(counts <= -(-quota // len(y)))  # floor <= count <= ceil


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=12) | st.lists(st.sampled_from([1, 2, 500]), min_size=3,
                                                                                 max_size=30))  # fmt: skip
@example(sizes=[500] + [1] * 20)  # the midpoint order leaves its windows here
def test_every_slot_table_is_a_quota_sequence_whichever_path_built_it(sizes: list[int]) -> None:
    """Skewed sizes (one large class among many of 1 or 2) make the midpoint order leave its windows, so the
    earliest-deadline-first fallback builds the table; the bound must hold either way."""
    n = np.array(sizes)
    slots = proportional_slots(n).astype(np.int64)
    starts = np.cumsum(n) - n
    classes = np.searchsorted(starts, slots, side="right") - 1
    assert np.array_equal(np.sort(slots), np.arange(n.sum()))
    counts = prefix_counts(classes, np.arange(len(n)))
    quota = np.arange(1, n.sum() + 1)[:, None] * n[None, :]
    assert np.all(quota // n.sum() <= counts) and np.all(counts <= -(-quota // n.sum()))


def test_each_class_is_shuffled_differently_every_pass_and_the_class_pattern_stays() -> None:
    y = np.arange(200) % 4
    strategy = Stratified(y)
    first, second = whole_pass(strategy, 200, 1, 0), whole_pass(strategy, 200, 1, 1)
    assert np.array_equal(y[first], y[second])  # which class sits where is fixed at construction
    for c in range(4):
        assert not np.array_equal(first[y[first] == c], second[y[second] == c])


@settings(max_examples=60, deadline=None)
@given(labels=label_lists, seed=st.integers(0, 2**63 - 1), passes=st.integers(1, 4), extra=st.integers(0, 30),
       first=st.sampled_from([0, 7, 2**40, 2**62 - 5]))  # fmt: skip
def test_balanced_windows_hold_each_class_once_and_each_class_walks_whole_permutations(
    labels: list[int], seed: int, passes: int, extra: int, first: int
) -> None:
    y = np.array(labels)
    ids, sizes = np.unique(y, return_counts=True)
    classes = len(ids)
    strategy = Stratified(y, mode="balanced", num_samples=classes * sizes.max() + extra)
    length = strategy.pass_length(len(y), 0)
    assert length == -(-(classes * sizes.max() + extra) // classes) * classes  # rounded up to whole windows
    stream = np.concatenate([whole_pass(strategy, len(y), seed, p) for p in range(first, first + passes)])
    windows = y[stream].reshape(-1, classes)
    assert np.all(np.sort(windows, axis=1) == ids[None, :])  # every aligned window: each class once
    for c, size in zip(ids, sizes):
        draws = stream[y[stream] == c]  # class c's draws continue across passes
        records = np.flatnonzero(y == c)
        aligned = -(first * (length // classes)) % int(size)  # where class c's next permutation starts
        for start in range(aligned, len(draws) - size + 1, size):
            assert np.array_equal(np.sort(draws[start : start + size]), records)  # one whole permutation each


def test_balanced_defaults_to_c_times_the_largest_class_and_reshuffles_each_permutation() -> None:
    y = np.array([0] * 12 + [1] * 3 + [2] * 5)
    strategy = Stratified(y, mode="balanced")
    assert strategy.pass_length(20, 0) == 36
    draws = whole_pass(strategy, 20, 4, 0)
    minority = draws[y[draws] == 1]  # 12 draws: four permutations of 3 records
    assert len({tuple(minority[k : k + 3]) for k in range(0, 12, 3)}) > 1


@pytest.mark.parametrize("mode", ["proportional", "balanced"])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly(mode: str, workers: int) -> None:
    labels = np.arange(90) * 7 % 5 // 3  # 54 and 36 records
    make = lambda: StatefulSampler(90, seed=3, batch_size=4, strategy=Stratified(labels, mode=mode))
    whole, resumed = loader_resume(make, workers, consumed=9)
    assert resumed == whole


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Any) -> None:
    whole, cut = sigkilled_run("stratified", tmp_path)
    assert len(whole) == 45  # 15 steps an epoch, 3 epochs; step 20 is inside epoch 1
    assert cut == whole


@settings(max_examples=30, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    mode=st.sampled_from(["proportional", "balanced"]),
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch_size=st.integers(1, 5),
    steps=st.integers(0, 30),
    tail=st.sampled_from(["pad", "drop", "uneven"]),
)
def test_a_state_saved_on_w_ranks_resumes_on_another_world_size_with_every_position_once(
    labels: list[int], mode: str, worlds: tuple[int, int], batch_size: int, steps: int, tail: str
) -> None:
    strategy = lambda: Stratified(labels, mode=mode)
    if tail == "drop" and min(len(labels), strategy().pass_length(len(labels), 0)) < max(worlds):
        tail = "pad"
    elastic_resume(strategy, len(labels), worlds, batch_size, steps, tail)


def test_a_state_from_other_labels_is_refused_naming_the_strategy_fingerprint() -> None:
    saved = StatefulSampler(6, strategy=Stratified([0, 0, 1, 1, 2, 2])).state_dict()
    others = (Stratified([0, 0, 1, 1, 2, 3]), Stratified([0, 0, 1, 1, 2, 2], mode="balanced"))
    for other in others:
        with pytest.raises(IncompatibleStateError, match="strategy_fingerprint"):
            StatefulSampler(6, strategy=other).load_state_dict(saved)
    StatefulSampler(6, strategy=Stratified(torch.tensor([0, 0, 1, 1, 2, 2]))).load_state_dict(saved)  # same labels


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: Stratified([0.5, 1.0]), TypeError, "labels must hold integer ids, got dtype float64 with 0.5 at position 0"),
        (lambda: Stratified(["a", "b"]), TypeError, "labels must hold integer ids, got dtype <U1"),
        (lambda: Stratified([0, -1]), ValueError, "labels must hold non-negative ids, got -1 at position 1"),
        (lambda: Stratified([0, 1], mode="even"), ValueError,
         r"mode must be one of \['proportional', 'balanced'\], got 'even'"),
        (lambda: Stratified([0, 1], num_samples=4), ValueError,
         ("num_samples applies to mode='balanced' only: a proportional pass is a permutation of all 2 records, "
          "got num_samples=4")),
        (lambda: Stratified([0, 1], mode="balanced", num_samples=0), ValueError,
         f"num_samples must be at least 1 and at most {2**62 - 1}, got 0"),
        (lambda: Stratified([0, 1], mode="balanced", num_samples=2**64), ValueError,
         f"num_samples must be at least 1 and at most {2**62 - 1}, got {2**64}"),
        (lambda: Stratified([0, 1], mode="balanced", num_samples=2**62 - 1), ValueError,
         (f"num_samples rounded up to a multiple of the 2 classes is {2**62}, at or past 2\\*\\*62 positions a "
          "pass: give fewer")),
        (lambda: StatefulSampler(3, strategy=Stratified([0, 1])), ValueError,
         "labels must have one entry per record: length 3, got 2"),
    ],
)  # fmt: skip
def test_bad_labels_are_refused_naming_the_argument(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        call()


def test_a_class_record_is_equally_likely_at_each_of_its_class_ranks_across_permutations() -> None:
    """Balanced draws walk one permutation of the class after another: over many permutations, each
    record of a class of 7 takes each of its 7 draw slots about equally often (chi-square)."""
    from scipy.stats import chisquare

    y = np.array([0] * 7 + [1])
    strategy = Stratified(y, mode="balanced", num_samples=2 * 7 * 3000)
    draws = whole_pass(strategy, 8, 5, 0)
    slots = draws[y[draws] == 0].reshape(-1, 7)  # one row per permutation of class 0
    counts = np.array([np.bincount(np.flatnonzero(row == 0), minlength=7) for row in slots]).sum(axis=0)
    assert chisquare(counts).pvalue > 1e-6
