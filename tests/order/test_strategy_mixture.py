"""``Mixture``: draws from several sources at set weights, every prefix within 1 draw of its target,
each source walking its own reshuffled passes across epochs, resumable and elastic."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.audit.mixture import audit_mixture, source_of
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.quota import _earliest_deadline_first, _inside_windows
from stateful_sampler.order.ragged import RaggedPermutation
from stateful_sampler.stream import MixedStream
from tests.helpers import json_round_trip
from tests.strategy_resume_checks import loader_resume, sigkilled_run


def stream_sources(mixture: Mixture, epochs: int) -> np.ndarray:
    positions = np.arange(mixture.num_samples, dtype=np.int64)
    return np.concatenate([mixture.locate(epoch, positions)[0] for epoch in range(epochs)])


def prefix_deviation(sources: np.ndarray, weights: np.ndarray, start: np.ndarray | None = None) -> float:
    """Largest |count_d(p) - (start_d + p * w_d)| over every prefix p >= 1."""
    onehot = np.zeros((len(sources), len(weights)))
    onehot[np.arange(len(sources)), sources] = 1
    counts = np.cumsum(onehot, axis=0)
    target = np.outer(np.arange(1, len(sources) + 1), weights)
    return float(np.abs(counts - target).max())


integer_weights = st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(any)


@settings(max_examples=150, deadline=None)
@given(weights=integer_weights, num_samples=st.integers(1, 60), epochs=st.integers(1, 5), data=st.data())
def test_every_prefix_of_the_stream_across_epochs_is_within_one_draw_of_its_target(
    weights: list[int], num_samples: int, epochs: int, data: Any
) -> None:
    sizes = data.draw(st.lists(st.integers(1, 20), min_size=len(weights), max_size=len(weights)))
    mixture = Mixture(sizes, weights, num_samples=num_samples)
    sources = stream_sources(mixture, epochs)
    normalised = np.array(weights) / sum(weights)
    assert prefix_deviation(sources, normalised) < 1
    assert np.allclose(mixture.weights_at(epochs - 1), normalised)


@settings(max_examples=8, deadline=None)  # each builds a period of up to 10**6 positions
@given(weights=st.lists(st.floats(0.001, 1.0), min_size=2, max_size=12))
def test_float_weights_are_rounded_to_millionths_and_the_bound_holds_against_those(weights: list[float]) -> None:
    mixture = Mixture([3] * len(weights), weights, num_samples=2000)
    used = mixture.weights_at(0)
    assert np.abs(used - np.array(weights) / sum(weights)).max() <= 1e-6
    assert prefix_deviation(stream_sources(mixture, 2), used) < 1


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=1, max_size=9))
def test_earliest_deadline_first_keeps_every_draw_inside_its_quota_window(counts: list[int]) -> None:
    """The fallback when the midpoint order leaves a window (about 1 in 4 of small weight sets)."""
    array = np.array(counts, dtype=np.int64)
    assert _inside_windows(array, _earliest_deadline_first(array))


def test_decimal_weights_are_exact_and_repeat_with_a_period_of_ten() -> None:
    mixture = Mixture([5, 30, 100], [0.5, 0.3, 0.2], num_samples=40)
    assert mixture.weights_at(0).tolist() == [0.5, 0.3, 0.2]
    sources = stream_sources(mixture, 1)
    assert sources[:10].tolist() == sources[10:20].tolist()
    assert np.bincount(sources[:10]).tolist() == [5, 3, 2]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    num_samples=st.integers(1, 40),
    seed=st.integers(0, 2**40),
    data=st.data(),
)
def test_each_source_walks_whole_permutations_of_its_records_one_source_epoch_after_another(
    sizes: list[int], num_samples: int, seed: int, data: Any
) -> None:
    weights = data.draw(st.lists(st.integers(1, 9), min_size=len(sizes), max_size=len(sizes)))
    mixture = Mixture(sizes, weights, num_samples=num_samples)
    sampler = StatefulSampler(sum(sizes), strategy=mixture, seed=seed)
    records = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        records += list(sampler)
    drawn = np.array(records)
    offsets = np.cumsum(sizes) - sizes
    for d, size in enumerate(sizes):
        mine = drawn[source_of(mixture, drawn) == d] - offsets[d]
        whole = len(mine) // size * size
        for start in range(0, whole, size):
            assert sorted(mine[start : start + size]) == list(range(size))
        assert len(set(mine[whole:].tolist())) == len(mine) - whole  # the unfinished pass repeats nothing
    assert (mixture.draws_before(4) == np.bincount(source_of(mixture, drawn), minlength=len(sizes))).all()


def test_a_large_source_continues_where_the_last_epoch_stopped_and_a_small_one_repeats_reshuffled() -> None:
    mixture = Mixture([4, 100], [1, 1], num_samples=20)
    sampler = StatefulSampler(104, strategy=mixture, seed=5)
    epochs = []
    for epoch in range(10):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    large = [r - 4 for epoch in epochs for r in epoch if r >= 4]
    assert sorted(large) == list(range(100))  # 10 epochs of 10 draws: one pass, nothing restarted
    small = [r for epoch in epochs for r in epoch if r < 4]
    passes = {tuple(small[i : i + 4]) for i in range(0, 100, 4)}
    assert all(sorted(p) == [0, 1, 2, 3] for p in passes) and len(passes) > 1
    assert audit_mixture(mixture, 10).source_epochs_completed.tolist() == [25, 1]


def test_a_schedule_restarts_the_bound_at_each_change_and_every_source_keeps_walking_its_passes() -> None:
    plain = Mixture([6, 9, 11], [3, 2, 1], num_samples=17)
    scheduled = Mixture([6, 9, 11], [3, 2, 1], num_samples=17, schedule={3: [1, 1, 4]})
    run = lambda mixture, epochs: [list((s.set_epoch(e), s)[1]) for s in [StatefulSampler(26, strategy=mixture, seed=4)]
                                   for e in range(epochs)]  # fmt: skip
    assert run(scheduled, 3) == run(plain, 3)  # epochs before the change are untouched
    assert scheduled.segment_start(7) == 3 and scheduled.weights_at(7).tolist() == [1 / 6, 1 / 6, 4 / 6]
    after = np.concatenate([scheduled.locate(epoch, np.arange(17))[0] for epoch in range(3, 8)])
    assert prefix_deviation(after, scheduled.weights_at(3)) < 1  # measured from the change
    before = scheduled.draws_before(3)
    assert before.tolist() == np.bincount(stream_sources(plain, 3), minlength=3).tolist()
    records = np.array([r for epoch in run(scheduled, 8) for r in epoch])
    offsets = np.array([0, 6, 15])
    for d, size in enumerate([6, 9, 11]):
        mine = records[source_of(scheduled, records) == d] - offsets[d]
        for start in range(0, len(mine) // size * size, size):  # passes run straight through the change
            assert sorted(mine[start : start + size]) == list(range(size))
    assert audit_mixture(scheduled, 8).largest_prefix_deviation < 1


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly(workers: int) -> None:
    make = lambda: StatefulSampler(60, seed=3, batch_size=4, strategy=Mixture([7, 23, 30], [5, 3, 2], num_samples=50))
    whole, resumed = loader_resume(make, workers, consumed=9)  # workers ran ahead of these 9
    assert resumed == whole


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Path) -> None:
    whole, cut = sigkilled_run("mixture", tmp_path, kill_after=25)
    assert len(whole) == 33  # 11 steps an epoch, 3 epochs; step 25 is inside epoch 2, after the weights changed
    assert cut == whole


@settings(max_examples=40, deadline=None)
@given(
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch_size=st.integers(1, 5),
    num_samples=st.integers(4, 50),
    steps=st.integers(0, 15),
    tail=st.sampled_from(["pad", "drop", "uneven"]),
    epoch=st.integers(0, 3),
)
def test_a_state_saved_on_w_ranks_resumes_on_another_world_size_with_every_position_once(
    worlds: tuple[int, int], batch_size: int, num_samples: int, steps: int, tail: str, epoch: int
) -> None:
    before, after = worlds
    strategy = lambda: Mixture([3, 5, 8], [1, 2, 3], num_samples=num_samples, schedule={2: [3, 2, 1]})
    config: dict[str, Any] = {"seed": 9, "tail": tail, "batch_size": batch_size}
    saving = [StatefulSampler(16, strategy=strategy(), num_replicas=before, rank=r, **config) for r in range(before)]
    for sampler in saving:
        sampler.set_epoch(epoch)
    batches = min(steps, -(-len(saving[0]) // batch_size))
    consumed = [list(sampler)[: batches * batch_size] for sampler in saving]
    state = json_round_trip(saving[0].state_dict(consumed_batches=batches))
    resumed = [StatefulSampler(16, strategy=strategy(), num_replicas=after, rank=r, **config) for r in range(after)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    rest = [list(sampler) for sampler in resumed]
    if tail != "uneven":
        assert len({len(part) for part in rest}) == 1  # equal step counts on the new ranks
    order = strategy().pass_order(16, 9, epoch)(np.arange(num_samples)).tolist()
    position = min(state["position"], num_samples)
    assert [consumed[k % before][k // before] for k in range(position)] == order[:position]
    left = order[position:] if state["position"] < state["epoch_end"] else []
    served = [rest[k % after][k // after] for k in range(sum(map(len, rest)))]
    if tail == "uneven" or (tail == "pad" and not left):
        assert served[: len(left)] == left
    elif tail == "pad":
        assert served[: len(left)] == left and len(served) - len(left) < after  # then marked repeats
    else:
        assert served == left[: len(served)] and len(left) - len(served) < after  # drop cuts fewer than W


def test_a_state_of_other_weights_or_another_split_is_refused_by_the_fingerprint() -> None:
    state = StatefulSampler(60, strategy=Mixture([7, 23, 30], [5, 3, 2], num_samples=50), batch_size=4).state_dict()
    for other in (
        Mixture([7, 23, 30], [5, 3, 3], num_samples=50),
        Mixture([8, 22, 30], [5, 3, 2], num_samples=50),
        Mixture([7, 23, 30], [5, 3, 2], num_samples=50, schedule={4: [1, 1, 1]}),
        Mixture([7, 23, 30], [5, 3, 2], num_samples=51),
    ):
        with pytest.raises(IncompatibleStateError) as caught:
            StatefulSampler(60, strategy=other, batch_size=4).load_state_dict(state)
        assert caught.value.field == "strategy_fingerprint"
        assert "build it with on_change='continue'" in str(caught.value)
    same_ratios = StatefulSampler(60, strategy=Mixture([7, 23, 30], [0.5, 0.3, 0.2], num_samples=50), batch_size=4)
    same_ratios.load_state_dict(state)  # the weights normalise to the same ones: the same order


def test_other_weights_of_a_mixture_of_more_than_a_thousand_sources_are_refused_by_the_fingerprint() -> None:
    """NumPy abbreviates the repr of more than 1,000 values: the fingerprint must see every source's weight."""
    sources = 2000
    weights = np.ones(sources)
    changed = weights.copy()
    changed[sources // 2] = 5  # one weight in the middle, where an abbreviated repr shows "..."
    saved = StatefulSampler(3 * sources, strategy=Mixture([3] * sources, weights, num_samples=500), batch_size=4)
    other = StatefulSampler(3 * sources, strategy=Mixture([3] * sources, changed, num_samples=500), batch_size=4)
    assert saved.strategy.fingerprint() != other.strategy.fingerprint()
    with pytest.raises(IncompatibleStateError) as caught:
        other.load_state_dict(saved.state_dict())
    assert caught.value.field == "strategy_fingerprint"


def test_a_source_added_between_runs_is_refused_naming_the_dataset_size() -> None:
    state = StatefulSampler(60, strategy=Mixture([7, 23, 30], [5, 3, 2], num_samples=50)).state_dict()
    grown = StatefulSampler(70, strategy=Mixture([7, 23, 30, 10], [5, 3, 2, 1], num_samples=50))
    with pytest.raises(IncompatibleStateError, match=re.escape("state field 'size': saved 60, expected 70")) as caught:
        grown.load_state_dict(state)
    assert str(caught.value).endswith(
        "the state belongs to another order; a Mixture's sizes, weights, num_samples and schedule are its identity: "
        "to continue the saved run with this mixture's weights (or with sources appended), build it with "
        "on_change='continue' (docs/mixtures.md, 'Changing a mixture mid-run')"
    )


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (([3, 4], [1, -1]), ValueError, "weights must be finite and non-negative, got -1.0 at position 1"),
        (([3, 4], [1, float("nan")]), ValueError, "weights must be finite and non-negative, got nan at position 1"),
        (([3, 4], [0, 0]), ValueError, "weights must have a positive sum, got all zeros (2 weights)"),
        (([3, 0], [1, 1]), ValueError, "each of at least 1 record, got source 1 has 0 records"),
        (([], []), ValueError, "sizes must hold at least one source, each of at least 1 record, got no sources"),
        (([3, 4], [1, 1, 1]), ValueError, "weights must have one entry per source: 2 sources, got 3"),
        (([3, 4], [1e-9, 1.0]), ValueError, "weights must give every positive weight a share of at least 1/1000000"),
        (([3, 4], [1, 1], {0: [1, 2]}), ValueError, "schedule epoch must be at least 1, got 0"),
        (([3, 4], [1, 1], {2: [1]}), ValueError, "schedule[2] must have one entry per source: 2 sources, got 1"),
        (([3, -4], [1, 1]), ValueError, "sizes must hold non-negative ids, got -4 at position 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(arguments: tuple[Any, ...], error: type, message: str) -> None:
    sizes, weights, *schedule = arguments
    with pytest.raises(error, match=re.escape(message)):
        Mixture(sizes, weights, num_samples=10, schedule=schedule[0] if schedule else None)


def test_num_samples_is_required_and_positive_and_the_sizes_must_add_up_to_n() -> None:
    with pytest.raises(TypeError, match="num_samples"):
        Mixture([3, 4], [1, 1])  # type: ignore[call-arg]
    for num_samples in (0, 2**62, 2**64):  # an epoch's draws stay positions below 2**62, refused where given
        with pytest.raises(
            ValueError, match=re.escape(f"num_samples must be at least 1 and at most {2**62 - 1}, got {num_samples}")
        ):
            Mixture([3, 4], [1, 1], num_samples=num_samples)
        with pytest.raises(ValueError, match=re.escape(f"at most {2**62 - 1}, got {num_samples}")):
            MixedStream([range(3), range(4)], [1, 1], batch_size=2, num_samples=num_samples)
    with pytest.raises(ValueError, match=re.escape("sizes must add up to the dataset's N = 8, got 7")):
        StatefulSampler(8, strategy=Mixture([3, 4], [1, 1], num_samples=5))
    tensor = Mixture(torch.tensor([3, 4]), torch.tensor([1.0, 3.0]), num_samples=5)
    assert tensor.fingerprint() == Mixture(np.array([3, 4]), [1, 3], num_samples=5).fingerprint()


def test_the_audit_reports_shares_per_epoch_and_cumulatively_against_the_targets() -> None:
    audit = audit_mixture(Mixture([5, 30, 100], [0.5, 0.3, 0.2], num_samples=40), 3)
    assert audit.epoch_shares.tolist() == [[0.5, 0.3, 0.2]] * 3  # 40 draws: 4 whole periods of 10
    assert audit.cumulative_shares[-1].tolist() == [0.5, 0.3, 0.2]
    assert audit.source_epochs_completed.tolist() == [12, 1, 0]
    assert 0 < audit.largest_prefix_deviation < 1
    assert "largest prefix deviation" in audit.table()


def records_one_source_epoch_at_a_time(mixture: Mixture, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """A pass's records as 0.3.0's first ``Mixture`` computed them: one permutation call per source-epoch."""
    sources, draws = mixture.locate(epoch, positions)
    source_epochs, inside = np.divmod(draws, mixture.sizes[sources])
    permutations = RaggedPermutation(mixture.sizes)
    records = np.empty_like(inside)
    for source_epoch in np.unique(source_epochs):
        at = source_epochs == source_epoch
        key = derive_seed(Domain.PERMUTATION, seed, 0x4D495854, int(source_epoch))
        records[at] = permutations(key, sources[at], inside[at])
    return mixture.offsets[sources] + records


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    data=st.data(),
    seed=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 40),
)
def test_a_pass_places_the_records_of_the_loop_over_source_epochs_it_replaced(
    sizes: list[int], data: st.DataObject, seed: int, epoch: int
) -> None:
    """One cipher for a block whose small sources span many source-epochs gives the very records of the loop."""
    weights = lambda: data.draw(st.lists(st.integers(0, 5), min_size=len(sizes), max_size=len(sizes)).filter(any))
    num_samples = data.draw(st.integers(1, 40))
    key = data.draw(st.tuples(st.integers(0, 3), st.integers(0, num_samples - 1)).filter(lambda k: k != (0, 0)))
    mixture = Mixture(sizes, weights(), num_samples=num_samples, schedule={key: weights()})
    positions = np.array(data.draw(st.lists(st.integers(0, num_samples - 1), max_size=50)), dtype=np.int64)
    drawn = mixture.pass_order(sum(sizes), seed, epoch)(positions)
    assert drawn.tolist() == records_one_source_epoch_at_a_time(mixture, seed, epoch, positions).tolist()


def test_the_records_of_a_pass_are_pinned() -> None:
    """A change here reorders every saved ``Mixture`` run: it must be deliberate (these are 0.3.0's first records)."""
    mixture = Mixture([3, 1, 5, 40], [2, 1, 3, 1], num_samples=30, schedule={(1, 7): [1, 1, 0, 5]})
    order = mixture.pass_order(49, 9, 4)
    assert order(np.arange(30, dtype=np.int64)).tolist() == [
        21, 48, 13, 0, 3, 19, 30, 35, 10, 34, 1, 3, 27, 31, 16, 38, 45, 2, 3, 33, 17, 41, 27, 21, 0, 3, 13, 37, 42, 20
    ]  # fmt: skip
    assert order(np.array([29, 0, 13, 13, 5], dtype=np.int64)).tolist() == [20, 21, 31, 31, 19]
