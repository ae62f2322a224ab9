"""``Mixture(on_change="continue")``: a state saved under another mixture (other weights, other schedule entries,
sources appended) continues at its saved position with this mixture's weights; the change is recorded in every
later state, so a resume from a later checkpoint is exact; a resized or reordered source stays refused."""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.audit.mixture import audit_mixture, audit_segments, source_of
from stateful_sampler.dcp import DistributedLoaderState
from stateful_sampler.keys import SampleKey
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.packing import PackedRows
from tests.helpers import json_round_trip

SIZES = [5, 7, 9]
OLD = {"weights": [1, 1, 1], "num_samples": 20}


def old_mixture(**changes: Any) -> Mixture:
    return Mixture(changes.pop("sizes", SIZES), **{**OLD, **changes})


def sampler(mixture: Mixture, **options: Any) -> StatefulSampler:
    options.setdefault("batch_size", 1)
    return StatefulSampler(sum(mixture.sizes.tolist()), strategy=mixture, seed=options.pop("seed", 3), **options)


def saved_after(mixture: Mixture, draws: int, epoch: int = 0, **options: Any) -> tuple[list[int], dict[str, Any]]:
    """The first ``draws`` indices of ``epoch`` and the state saved there (one rank, batch 1 unless told)."""
    saving = sampler(mixture, **options)
    saving.set_epoch(epoch)
    head = list(saving)[:draws]
    return head, json_round_trip(saving.state_dict(consumed_batches=draws // saving.batch_size))


def by_source(mixture: Mixture, records: list[int]) -> list[list[int]]:
    """Each source's records in the order drawn, as indices inside the source."""
    ends = (mixture.offsets + mixture.sizes).tolist()
    out: list[list[int]] = [[] for _ in ends]
    for record in records:
        d = next(i for i, end in enumerate(ends) if record < end)
        out[d].append(record - int(mixture.offsets[d]))
    return out


def test_another_mixture_continues_the_saved_run_where_every_source_stood() -> None:
    head, state = saved_after(old_mixture(), 8)
    new = Mixture([5, 7, 9, 4], [0, 1, 2, 1], num_samples=20, on_change="continue")  # source 0 removed, 3 appended
    resumed = sampler(new)
    resumed.load_state_dict(state)
    rest = list(resumed)
    resumed.set_epoch(1)
    rest += list(resumed)
    assert len(rest) == 12 + 20
    sources = np.searchsorted((new.offsets + new.sizes), rest, side="right")
    counts = np.cumsum(np.eye(4, dtype=np.int64)[sources], axis=0)
    target = np.outer(np.arange(1, len(rest) + 1), [0, 1 / 4, 2 / 4, 1 / 4])
    assert np.abs(counts - target).max() < 1  # the new weights' prefix bound, from the change on
    # Each source goes on through its own permutation: its records in the changed run are exactly the first
    # ones it draws in any run of the same seed (here: the old mixture run on, a long way).
    reference = sampler(Mixture([5, 7, 9, 4], [1, 1, 1, 1], num_samples=200))
    everything = by_source(new, list(reference))
    for d, drawn in enumerate(by_source(new, head + rest)):
        assert drawn == everything[d][: len(drawn)], d
    assert [len(drawn) for drawn in by_source(new, head + rest)] == [3, 3 + 8, 2 + 16, 8]


def test_the_change_is_recorded_so_a_later_checkpoint_resumes_both_segments_exactly() -> None:
    _, state = saved_after(old_mixture(), 6)
    new = lambda on_change: Mixture(
        [5, 7, 9], [3, 1, 0], num_samples=20, schedule={(1, 4): [1, 1, 1]}, on_change=on_change
    )
    live = sampler(new("continue"), batch_size=2)
    live.load_state_dict(state)
    iterator = iter(live)
    for _ in range(4):
        next(iterator)
    later = json_round_trip(live.state_dict(consumed_batches=2))
    assert later["strategy_state"]["change"] == 6
    rest = list(iterator) + [index for e in (1, 2) for index in (live.set_epoch(e), list(live))[1]]
    for on_change in ("continue", "refuse"):  # the state's own change: no on_change needed to continue it
        twin = sampler(new(on_change), batch_size=2)
        twin.load_state_dict(later)
        assert twin.strategy.fingerprint() == live.strategy.fingerprint()
        assert [index for e in (0, 1, 2) for index in (e and twin.set_epoch(e), list(twin))[1]] == rest


def test_a_second_change_continues_from_the_draws_the_first_continued_mixture_made() -> None:
    _, first = saved_after(old_mixture(), 5)
    second_mixture = Mixture([5, 7, 9], [1, 0, 1], num_samples=20, on_change="continue")
    second = sampler(second_mixture)
    second.load_state_dict(first)
    middle = list(second)[:7]
    state = json_round_trip(second.state_dict(consumed_batches=7))
    assert state["strategy_state"]["draws"] == second_mixture.continued_at(5, [2, 2, 1]).draws_before(0, 12).tolist()
    third = sampler(Mixture([5, 7, 9, 3], [0, 1, 0, 1], num_samples=20, on_change="continue"))
    third.load_state_dict(state)
    assert third.strategy.change == 12 and third.strategy.draws_before(0, 12).tolist() == [
        *state["strategy_state"]["draws"],
        0,
    ]
    assert [by_source(third.strategy, middle)[d] for d in (1,)] == [[]]  # the second mixture drew no source 1
    rest = list(third)
    assert by_source(third.strategy, rest)[0] == [] and len(by_source(third.strategy, rest)[3]) == 4


def test_by_default_and_from_a_state_saved_before_0_3_0_another_mixture_is_refused() -> None:
    _, state = saved_after(old_mixture(), 4)
    with pytest.raises(IncompatibleStateError, match="on_change='continue'") as caught:
        sampler(Mixture(SIZES, [2, 1, 1], num_samples=20)).load_state_dict(state)
    assert caught.value.field == "strategy_fingerprint"
    with pytest.raises(IncompatibleStateError) as caught:
        sampler(Mixture([*SIZES, 2], [1, 1, 1, 1], num_samples=20)).load_state_dict(state)
    assert caught.value.field == "size"
    version_2 = {key: value for key, value in state.items() if key != "strategy_state"} | {"version": 2}
    with pytest.raises(IncompatibleStateError) as caught:
        sampler(Mixture(SIZES, [2, 1, 1], num_samples=20, on_change="continue")).load_state_dict(version_2)
    assert caught.value.field == "strategy_fingerprint"
    same = sampler(old_mixture())
    same.load_state_dict(version_2)  # its own mixture continues it, as before
    assert list(same) == saved_after(old_mixture(), 20)[0][4:]


@pytest.mark.parametrize(
    ("sizes", "field", "message"),
    [
        ([5, 8, 9], "sizes[1]", "source 1 has another size than in the saved run, or the sources were reordered"),
        ([7, 5, 9], "sizes[0]", "source 0 has another size than in the saved run, or the sources were reordered"),
        ([5, 7, 9, 2, 1][1:], "sizes[0]", "or the sources were reordered"),
        ([5, 7], "sizes", "keep a removed source, with weight 0, and append new ones after the saved ones"),
    ],
)
def test_a_resized_reordered_or_dropped_source_stays_refused_naming_it(
    sizes: list[int], field: str, message: str
) -> None:
    _, state = saved_after(old_mixture(), 4)
    changed = sampler(Mixture(sizes, [1] * len(sizes), num_samples=20, on_change="continue"))
    before = changed.state_dict()
    with pytest.raises(IncompatibleStateError, match=re.escape(message)) as caught:
        changed.load_state_dict(state)
    assert caught.value.field == field
    assert changed.state_dict() == before  # a refused state leaves the sampler as it was


def test_another_epoch_length_and_a_bad_slot_are_refused_naming_the_field() -> None:
    _, state = saved_after(old_mixture(), 4)
    with pytest.raises(IncompatibleStateError, match="places its epochs in the stream") as caught:
        sampler(Mixture(SIZES, [1, 1, 1], num_samples=21, on_change="continue")).load_state_dict(state)
    assert caught.value.field == "num_samples"
    slot = state["strategy_state"]
    for bad, field in (
        ({**slot, "draws": [1, -1, 0]}, "strategy_state.draws"),
        ({**slot, "draws": [1, 2.0, 0]}, "strategy_state.draws"),
        ({**slot, "version": 9}, "strategy_state.version"),
        ({**slot, "change": "6"}, "strategy_state.change"),
        ({**slot, "sizes": "ab"}, "strategy_state.sizes"),
        ({key: value for key, value in slot.items() if key != "sizes_digest"}, "strategy_state"),
        ({**slot, "sizes_digest": 5}, "strategy_state.sizes_digest"),
    ):
        with pytest.raises(IncompatibleStateError) as caught:
            sampler(Mixture(SIZES, [2, 1, 1], num_samples=20, on_change="continue")).load_state_dict(
                {**state, "strategy_state": bad}
            )
        assert caught.value.field == field
    with pytest.raises(IncompatibleStateError) as caught:
        sampler(old_mixture()).load_state_dict({**state, "strategy_state": [1, 2]})
    assert caught.value.field == "strategy_state"
    with pytest.raises(ValueError, match=re.escape("on_change must be one of ['refuse', 'continue'], got 'keep'")):
        Mixture(SIZES, [1, 1, 1], num_samples=20, on_change="keep")


def test_epochs_before_the_change_are_refused_not_answered_with_other_weights() -> None:
    _, state = saved_after(old_mixture(), 4, epoch=1)
    resumed = sampler(Mixture(SIZES, [0, 0, 1], num_samples=20, on_change="continue"))
    resumed.load_state_dict(state)
    assert resumed.strategy.segment_starts() == [(1, 4)]
    with pytest.raises(
        ValueError, match=re.escape("(0, 0) (epoch, position) lies before this mixture's change at (1, 4)")
    ):
        resumed.indices(0)
    with pytest.raises(ValueError, match="lies before this mixture's change"):
        resumed.strategy.weights_at(1, 3)
    assert resumed.strategy.weights_at(1, 4).tolist() == [0, 0, 1]


@pytest.mark.parametrize("workers", [0, 2])
def test_resumable_loader_continues_a_changed_mixture_exactly(workers: int) -> None:
    old, new = old_mixture(), Mixture([5, 7, 9, 6], [1, 3, 1, 2], num_samples=20, on_change="continue")

    def loader(mixture: Mixture) -> ResumableLoader:
        data = torch.arange(sum(mixture.sizes.tolist()))
        return ResumableLoader(
            DataLoader(data, sampler=sampler(mixture, batch_size=3), batch_size=3, num_workers=workers)
        )

    first = loader(old)
    head = []
    for step, batch in enumerate(first, 1):
        head.append(batch.tolist())
        if step == 2:
            break
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader(new)
    resumed.load_state_dict(state)
    rest = [batch.tolist() for batch in resumed]
    plain = sampler(new, batch_size=3)
    plain.load_state_dict(state["sampler"])
    expected = list(plain)
    assert [index for batch in rest for index in batch] == expected and len(expected) == 20 - 6
    later = resumed.state_dict()  # at the epoch's end, the change recorded
    again = loader(Mixture([5, 7, 9, 6], [1, 3, 1, 2], num_samples=20))
    again.load_state_dict(later)
    resumed.sampler.set_epoch(1)
    again.sampler.set_epoch(1)
    assert [b.tolist() for b in again] == [b.tolist() for b in resumed]


def test_a_state_round_trips_through_json_and_torch_save_as_a_checkpoint_holds_it() -> None:
    _, state = saved_after(old_mixture(), 4)
    new = Mixture(SIZES + [3], [1, 2, 3, 4], num_samples=20, on_change="continue")
    live = sampler(new, batch_size=2)
    live.load_state_dict(state)
    iterator = iter(live)
    next(iterator), next(iterator)
    later = live.state_dict(consumed_batches=1)
    buffer = io.BytesIO()
    torch.save({"sampler": later}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["sampler"]
    assert loaded == later == json_round_trip(later)
    twin = sampler(new, batch_size=2)
    twin.load_state_dict(loaded)
    assert list(twin) == list(iterator)


@pytest.mark.parametrize(("worlds", "batches"), [((4, 3), (4, 2)), ((2, 4), (2, 1))])
def test_an_elastic_resume_after_a_change_takes_every_unconsumed_draw_once(
    worlds: tuple[int, int], batches: tuple[int, int]
) -> None:
    (before, after), (batch, half) = worlds, batches
    old = old_mixture(num_samples=30)
    saving = [sampler(old, num_replicas=before, rank=r, batch_size=batch) for r in range(before)]
    steps = 2
    state = json_round_trip(saving[0].state_dict(consumed_batches=steps))
    new = Mixture([5, 7, 9, 4], [1, 1, 0, 3], num_samples=30, on_change="continue")
    ranks = [sampler(new, num_replicas=after, rank=r, batch_size=half, yield_keys=True) for r in range(after)]
    for rank in ranks:
        rank.load_state_dict(state)
    keys: list[list[SampleKey]] = [list(rank) for rank in ranks]
    assert len({len(k) for k in keys}) == 1  # equal steps on every rank
    position = steps * batch * before
    global_order = [key for step in zip(*keys) for key in step]
    real = [key for key in global_order if not key.is_padding]
    assert [key.position for key in real] == list(range(position, 30))
    alone = sampler(new)
    alone.load_state_dict(state)
    assert [key.index for key in real] == list(alone)  # the continued order, whatever the ranks
    assert len(global_order) - len(real) < after


def test_the_state_stays_under_1_kb_for_100_sources_after_10_changes() -> None:
    """Measured as ``len(pickle.dumps(state))`` of the sampler's whole state (what torch.save pickles)."""
    sizes = (np.arange(100) * 7919 % 9_000_000 + 1_000_000).tolist()
    rng = np.random.default_rng(0)
    state: dict[str, Any] = {"position": 0}
    for change in range(11):  # the first run, then 10 changes, 10^7 draws apart
        mixture = Mixture(sizes, rng.integers(1, 1000, 100).tolist(), num_samples=2 * 10**8, on_change="continue")
        live = StatefulSampler(sum(sizes), strategy=mixture, batch_size=64, num_replicas=8, rank=0)
        if change:
            live.load_state_dict(state)
        state = live.state_after(((change + 1) * 10**7 - state["position"]) // 8)
    assert state["strategy_state"]["change"] == 10**8 and state["position"] == 11 * 10**7
    assert sum(state["strategy_state"]["draws"]) == 11 * 10**7 and min(state["strategy_state"]["draws"]) > 10**4
    assert len(pickle.dumps(state)) < 1024, len(pickle.dumps(state))


@st.composite
def changes(draw: st.DrawFn) -> tuple[Mixture, Mixture]:
    sources = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 7), min_size=sources, max_size=sources))
    num_samples = draw(st.integers(3, 13))
    weights = lambda n: draw(st.lists(st.integers(0, 4), min_size=n, max_size=n).filter(any))
    old = Mixture(sizes, weights(sources), num_samples=num_samples)
    appended = draw(st.lists(st.integers(1, 5), max_size=2))
    starts = draw(st.sets(st.integers(1, 3 * num_samples - 1), max_size=2))
    n = sources + len(appended)
    schedule = {divmod(start, num_samples): weights(n) for start in starts}
    new = Mixture(sizes + appended, weights(n), num_samples=num_samples, schedule=schedule, on_change="continue")
    return old, new


def calls(sampler: StatefulSampler, epochs: int) -> list[Any]:
    """Everything a caller can ask, call after call: each pass, its state, len and remaining length."""
    out: list[Any] = []
    for epoch in range(sampler.epoch, sampler.epoch + epochs):
        sampler.set_epoch(epoch)
        out += [len(sampler), sampler.remaining_length(), sampler.indices().tolist(), sampler.state_dict()]
        out += [list(sampler), sampler.state_dict(), sampler.strategy.fingerprint()]
    return out


@settings(max_examples=20, deadline=None)
@given(changes(), st.integers(1, 3), st.data())
def test_twin_a_restored_sampler_equals_the_live_one_for_every_later_call_across_a_change(
    pair: tuple[Mixture, Mixture], batch_size: int, data: st.DataObject
) -> None:
    old, new = pair
    epoch = data.draw(st.integers(0, 2))
    saving = sampler(old, batch_size=batch_size)
    saving.set_epoch(epoch)
    steps = data.draw(st.integers(0, -(-old.num_samples // batch_size)))
    list(saving)
    state = json_round_trip(saving.state_dict(consumed_batches=steps))
    live = sampler(new, batch_size=batch_size)
    live.load_state_dict(state)
    iterator = iter(live)
    for _ in range(data.draw(st.integers(0, live.remaining_length()))):
        next(iterator)
    later = live.state_dict()  # the drawn position: exact with no workers
    twin = sampler(new, batch_size=batch_size)
    twin.load_state_dict(json_round_trip(later))
    assert calls(twin, 3) == calls(live, 3)


def test_the_audit_shows_each_segment_of_a_changed_run_against_its_weights() -> None:
    first = Mixture(SIZES, [1, 1, 1], num_samples=20, schedule={(0, 6): [2, 1, 0]})
    head, state = saved_after(first, 12)
    second_run = sampler(Mixture([*SIZES, 4], [0, 1, 1, 2], num_samples=20, on_change="continue"))
    second_run.load_state_dict(state)
    rest = list(second_run)
    second = second_run.strategy
    audit = audit_segments(first, second, until=(1, 0))
    assert [(s.start, s.stop, s.draws) for s in audit.segments] == [((0, 0), (0, 6), 6), ((0, 6), (0, 12), 6),
                                                                    ((0, 12), (1, 0), 8)]  # fmt: skip
    drawn = source_of(second, np.array(head + rest))
    for segment, (low, high) in zip(audit.segments, [(0, 6), (6, 12), (12, 20)]):
        realised = np.bincount(drawn[low:high], minlength=4) / (high - low)
        assert segment.shares.tolist() == realised.tolist()
        assert segment.largest_prefix_deviation < 1
    assert audit.segments[2].weights.tolist() == [0, 0.25, 0.25, 0.5]
    assert audit.table().splitlines()[3].startswith("         (0, 12)          8")
    with pytest.raises(ValueError, match="does not continue the draws of mixture 0"):
        audit_segments(Mixture(SIZES, [1, 1, 1], num_samples=20), second, until=(1, 0))
    with pytest.raises(ValueError, match="audit it with the run's earlier mixtures"):
        audit_mixture(second, 1)


def test_packed_rows_keep_a_scheduled_change_exact() -> None:
    """(A change at a resume, under packed rows: tests/packing/test_packing_continue.py.)"""
    lengths = [3, 5, 2, 8, 4, 6, 1, 7, 9, 2, 3, 5, 4, 6, 2, 1, 8, 3, 2, 5, 7]
    scheduled = lambda: PackedRows(
        lengths,
        seq_len=8,
        batch_size=2,
        seed=3,
        strategy=Mixture(SIZES, [1, 1, 1], num_samples=20, schedule={(0, 9): [0, 1, 3]}),
    )
    whole = list(scheduled())
    saving = scheduled()
    head = list(saving)[:4]
    resumed = scheduled()
    resumed.load_state_dict(json_round_trip(saving.state_dict(consumed_batches=2)))
    assert head + list(resumed) == whole


def test_the_dcp_stateful_carries_the_change_unchanged() -> None:
    def loader(mixture: Mixture) -> ResumableLoader:
        data = torch.arange(sum(mixture.sizes.tolist()))
        return ResumableLoader(DataLoader(data, sampler=sampler(mixture, batch_size=2), batch_size=2))

    first = loader(old_mixture())
    iterator = iter(first)
    next(iterator), next(iterator)
    saved = DistributedLoaderState(first).state_dict()
    new = Mixture([*SIZES, 5], [1, 0, 2, 2], num_samples=20, on_change="continue")
    resumed = loader(new)
    DistributedLoaderState(resumed).load_state_dict(saved)
    plain = sampler(new, batch_size=2)
    plain.load_state_dict(first.state_dict()["sampler"])
    assert [index for batch in resumed for index in batch.tolist()] == list(plain)
    assert resumed.sampler.strategy.change == 4


def test_a_slot_on_a_state_of_a_strategy_that_saves_none_is_refused() -> None:
    state = StatefulSampler(10, batch_size=2).state_dict()
    with pytest.raises(IncompatibleStateError, match="saves no state of its own") as caught:
        StatefulSampler(10, batch_size=2).load_state_dict({**state, "strategy_state": {"draws": [1]}})
    assert caught.value.field == "strategy_state"
