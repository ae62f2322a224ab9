"""``Curriculum``: the active bands in ascending order, each shuffled anew every pass, exactly resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.order.curriculum import Curriculum
from tests.strategy_resume_checks import elastic_resume, loader_resume, serve, sigkilled_run

band_ids = st.lists(st.integers(0, 6), min_size=1, max_size=150)


@settings(max_examples=60, deadline=None)
@given(ids=band_ids, seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40), data=st.data())
def test_bands_come_in_ascending_order_with_each_active_record_once(
    ids: list[int], seed: int, pass_index: int, data: st.DataObject
) -> None:
    bands = np.array(ids)
    present = sorted(set(ids))
    active = data.draw(st.integers(1, len(present)))
    strategy = Curriculum(bands, schedule=lambda epoch: active)
    length = strategy.pass_length(len(ids), pass_index)
    order = strategy.pass_order(len(ids), seed, pass_index)(np.arange(length))
    chosen = present[:active]
    assert sorted(order.tolist()) == np.flatnonzero(np.isin(bands, chosen)).tolist()
    assert np.all(np.diff(bands[order]) >= 0)


def test_each_band_is_shuffled_differently_every_pass() -> None:
    strategy = Curriculum(np.repeat([0, 1], 50))
    passes = [strategy.pass_order(100, 4, index)(np.arange(100)) for index in range(3)]
    assert all(sorted(order[:50]) == list(range(50)) for order in passes)
    assert len({tuple(order[:50]) for order in passes}) == 3
    assert len({tuple(order[50:]) for order in passes}) == 3


def test_a_listed_schedule_sets_each_epochs_bands_and_its_last_entry_holds_after_it() -> None:
    bands = np.arange(12) % 3  # 4 records a band
    sampler = StatefulSampler(12, seed=2, strategy=Curriculum(bands, schedule=[1, 1, 2, 3]))
    epochs = []
    for epoch in range(6):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    assert [len(taken) for taken in epochs] == [4, 4, 8, 12, 12, 12]
    assert [sorted({int(bands[i]) for i in taken}) for taken in epochs] == [[0], [0], [0, 1], [0, 1, 2], [0, 1, 2],
                                                                            [0, 1, 2]]  # fmt: skip


def test_band_ids_with_gaps_count_only_the_bands_present() -> None:
    strategy = Curriculum([5, 0, 5, 9], schedule=[2])
    assert strategy.num_bands == 3
    assert strategy.pass_order(4, 0, 0)(np.arange(3)).tolist()[0] == 1  # band 0 first, then band 5
    assert sorted(strategy.pass_order(4, 0, 0)(np.arange(3)).tolist()) == [0, 1, 2]


def test_pass_lengths_vary_only_when_the_schedule_varies_them() -> None:
    bands = [0, 1, 1, 2]
    assert not Curriculum(bands).passes_vary
    assert not Curriculum(bands, schedule=[3, 3]).passes_vary
    assert Curriculum(bands, schedule=[1, 3]).passes_vary
    assert Curriculum(bands, schedule=lambda epoch: 3).passes_vary  # a callable cannot be known
    StatefulSampler(4, strategy=Curriculum(bands), tail="carry", batch_size=2)
    message = r"^tail='carry' needs passes of one length, but Curriculum\(<3 bands of 4 records>, schedule=\[1, 3\]\)"
    with pytest.raises(ValueError, match=message):
        StatefulSampler(4, strategy=Curriculum(bands, schedule=[1, 3]), tail="carry", batch_size=2)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([1, 0], r"schedule must give between 1 and 3 active bands \(the bands present\), got 0 for epoch 1"),
        ([4], r"schedule must give between 1 and 3 active bands \(the bands present\), got 4 for epoch 0"),
        ([1.5], r"schedule must give between 1 and 3 active bands \(the bands present\), got 1.5 for epoch 0"),
    ],
)
def test_a_listed_schedule_out_of_range_is_refused_at_construction(schedule: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        Curriculum([0, 1, 2], schedule=schedule)


def test_a_callable_schedule_out_of_range_is_refused_when_its_epoch_is_first_asked_for() -> None:
    sampler = StatefulSampler(3, strategy=Curriculum([0, 1, 2], schedule=lambda epoch: epoch + 1))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert len(list(sampler)) == epoch + 1
    sampler.set_epoch(3)
    with pytest.raises(ValueError, match=r"^schedule must give between 1 and 3 active bands \(the bands present\), "
                                         r"got 4 for epoch 3$"):  # fmt: skip
        list(sampler)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: Curriculum([0.5, 1.0]),
            TypeError,
            "bands must hold integer ids, got dtype float64 with 0.5 at position 0",
        ),
        (lambda: Curriculum([0, -2]), ValueError, "bands must hold non-negative ids, got -2 at position 1"),
        (
            lambda: Curriculum([0, 1], schedule=[]),
            TypeError,
            r"schedule must be a non-empty list of band counts or a callable, got \[\]",
        ),
        (
            lambda: Curriculum([0, 1], schedule=2),
            TypeError,
            "schedule must be a non-empty list of band counts or a callable, got 2",
        ),
        (
            lambda: StatefulSampler(3, strategy=Curriculum([0, 1])),
            ValueError,
            "bands must have one entry per record: length 3, got 2",
        ),
    ],
)
def test_bad_bands_are_refused_naming_the_argument(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        call()


def one_more_band(epoch: int) -> int:
    return min(epoch + 1, 3)


def test_a_state_is_refused_by_other_bands_or_another_schedule_naming_the_strategy_fingerprint() -> None:
    bands = [0, 1, 2, 0, 1, 2]
    saved = StatefulSampler(6, strategy=Curriculum(bands, schedule=one_more_band)).state_dict()
    for other in (Curriculum([0, 0, 1, 1, 2, 2], schedule=one_more_band), Curriculum(bands, schedule=[1, 2, 3]),
                  Curriculum(bands, schedule=lambda epoch: min(epoch + 1, 3)), Curriculum(bands)):  # fmt: skip
        with pytest.raises(IncompatibleStateError, match="strategy_fingerprint"):
            StatefulSampler(6, strategy=other).load_state_dict(saved)
    StatefulSampler(6, strategy=Curriculum(np.array(bands), schedule=one_more_band)).load_state_dict(saved)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly_across_growing_epochs(workers: int) -> None:
    bands = np.arange(60) % 3
    make = lambda: StatefulSampler(60, seed=8, batch_size=4, strategy=Curriculum(bands, schedule=one_more_band))
    whole, resumed = loader_resume(make, workers, consumed=7, epoch=1)
    whole = serve(make(), workers) + whole  # epoch 0 first
    assert [len(whole), sum(map(len, whole))] == [5 + 10 + 15, 20 + 40 + 60]
    assert resumed == whole[5:]


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Path) -> None:
    """Without workers here (test_strategy_grouped kills one with 2): the save is the only thing that survives."""
    whole, cut = sigkilled_run("curriculum", tmp_path, kill_after=9, workers=(0, 0))
    assert len(whole) == 5 + 10 + 15  # 20, 40, 60 records in batches of 4; step 9 is inside epoch 1
    assert cut == whole


@settings(max_examples=40, deadline=None)
@given(
    ids=band_ids,
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch_size=st.integers(1, 5),
    steps=st.integers(0, 30),
    tail=st.sampled_from(["pad", "uneven"]),
    epoch=st.integers(0, 3),
)
def test_a_state_saved_on_w_ranks_resumes_on_another_world_size_with_every_position_once(
    ids: list[int], worlds: tuple[int, int], batch_size: int, steps: int, tail: str, epoch: int
) -> None:
    bands = np.array(ids)
    strategy = lambda: Curriculum(bands, schedule=lambda e: min(e + 1, len(set(ids))))
    elastic_resume(strategy, len(ids), worlds, batch_size, steps, tail, epoch=epoch, seed=5)
