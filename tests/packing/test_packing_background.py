"""An epoch's first rows while its row count runs in a background thread (issue 26, item 5).

Whole-record packing knows a pass's row count only by counting every window. From ``_COUNTED_LATER`` draws on,
that count runs in a thread and the sampler serves the rows below a floor the pass surely has; a state, a length
or anything past the floor waits for the count. These tests hold the count back (a ``threading.Event`` that the
count waits for), so that "served before the count" is a fact, not a timing, and compare everything with a
sampler that counts first (the constant patched to never count in the background).
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import Mixture, PackedRows, TokenBudgetBatches
from stateful_sampler.order import rows as rows_module

SIZE = 300_000  # above _COUNTED_LATER (2**18): counted in the background unpatched
LENGTHS = np.clip(np.random.default_rng(3).lognormal(4.5, 1.0, SIZE), 1, 512).astype(np.int32)


def whole_rows(**kwargs: object) -> PackedRows:
    return PackedRows(LENGTHS, 512, split_records=False, seed=5, **kwargs)


@contextmanager
def counted_first() -> Iterator[None]:
    """Samplers that count a pass's rows before its first row (as before item 5): the reference."""
    with mock.patch.object(rows_module, "_COUNTED_LATER", 1 << 62):  # private: where the background starts
        yield


@contextmanager
def held_count() -> Iterator[dict[str, object]]:
    """Every pass count in a background thread waits for ``held["release"]`` (one asked for by the main thread,
    or in a forked child, runs at once); ``held["done"]`` names the threads of the counts finished."""
    release, done = threading.Event(), []
    original = rows_module.PassRows._rows_of_every_window

    def held(self: rows_module.PassRows) -> np.ndarray:
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(60), "the count was never released"
        counts = original(self)
        done.append(threading.current_thread().name)
        return counts

    with mock.patch.object(rows_module.PassRows, "_rows_of_every_window", held):
        yield {"release": release, "done": done}
        release.set()


def test_the_first_rows_come_before_the_count_and_are_the_counted_samplers_rows():
    with counted_first():
        reference = whole_rows(num_replicas=2, rank=1, batch_size=4)
        expected = list(reference)
        expected_state = None
    with held_count() as held:
        rows = whole_rows(num_replicas=2, rank=1, batch_size=4)
        iterator = iter(rows)
        first = [next(iterator) for _ in range(300)]
        assert held["done"] == []  # 300 rows served while the count is still held back
        assert first == expected[:300]
        held["release"].set()
        state = rows.state_dict(consumed_batches=75)  # waits for the count
        assert held["done"] == ["stateful-sampler-count"]
        assert list(iterator) == expected[300:]
    with counted_first():
        reference = whole_rows(num_replicas=2, rank=1, batch_size=4)
        iterator = iter(reference)
        for _ in range(300):
            next(iterator)
        expected_state = reference.state_dict(consumed_batches=75)
    assert state == expected_state
    assert rows.rows_in_epoch(0) == reference.rows_in_epoch(0)


def test_a_length_asked_during_the_held_count_waits_for_it_and_is_exact():
    with counted_first():
        expected = len(whole_rows(num_replicas=3, rank=2))
    with held_count() as held:
        rows = whole_rows(num_replicas=3, rank=2)
        next(iter(rows))
        threading.Timer(0.0, held["release"].set).start()  # released from another thread: len() must wait for it
        assert len(rows) == expected
        assert len(held["done"]) == 1


def test_pickled_and_deep_copied_while_counting_and_after():
    with counted_first():
        expected = list(whole_rows())
    with held_count() as held:
        rows = whole_rows()
        iterator = iter(rows)
        first = [next(iterator) for _ in range(10)]
        twin = pickle.loads(pickle.dumps(rows))  # a sampler sent to spawned processes mid-count
        copied = copy.deepcopy(rows)
        held["release"].set()
        assert first + list(iterator) == expected
    assert list(twin) == expected[10:] and list(copied) == expected[10:]
    after = pickle.loads(pickle.dumps(rows))  # after the pass: both go on to the next epoch
    assert after.epoch == rows.epoch == 1 and list(after) == list(rows)


def test_one_count_runs_in_the_background_at_a_time_and_another_pass_is_counted_where_asked():
    with counted_first():
        expected = list(whole_rows(num_replicas=2, rank=1))
    with held_count() as held:
        first, second = whole_rows(num_replicas=2, rank=0), whole_rows(num_replicas=2, rank=1)
        next(iter(first))  # its count runs, held
        assert list(iter(second)) == expected  # counted in the main thread, not queued behind the held one
        assert held["done"] == ["MainThread"]
        held["release"].set()
        assert first.rows_in_epoch(0) == second.rows_in_epoch(0)
        assert held["done"] == ["MainThread", "stateful-sampler-count"]


def _count_in_child(rows: PackedRows, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(rows.rows_in_epoch(0))


def test_a_forked_child_counts_for_itself_while_the_parent_count_is_held():
    with counted_first():
        expected = whole_rows().rows_in_epoch(0)
    context = multiprocessing.get_context("fork")
    with held_count() as held:
        rows = whole_rows()
        next(iter(rows))  # the parent's count starts, held
        queue = context.Queue()
        child = context.Process(target=_count_in_child, args=(rows, queue))
        child.start()
        assert queue.get(timeout=120) == expected
        child.join(60)
        assert child.exitcode == 0 and held["done"] == []  # the child's count was its own
        held["release"].set()
        assert rows.rows_in_epoch(0) == expected


def test_a_count_that_fails_in_the_thread_is_counted_again_where_it_is_asked():
    with counted_first():
        expected = list(whole_rows(num_replicas=2, rank=0))
    original, failures = rows_module.PassRows._rows_of_every_window, []

    def fails_in_the_thread(self: rows_module.PassRows) -> np.ndarray:
        if threading.current_thread() is not threading.main_thread():
            failures.append(1)
            raise MemoryError("the thread ran out of memory")
        return original(self)

    with mock.patch.object(rows_module.PassRows, "_rows_of_every_window", fails_in_the_thread):
        rows = whole_rows(num_replicas=2, rank=0)
        assert list(iter(rows)) == expected  # iter: list(rows) would ask len() first, counting before any row
    assert failures == [1]


def test_an_error_of_the_count_itself_is_raised_at_the_call_that_asks():
    def broken(self: rows_module.PassRows) -> np.ndarray:
        raise ValueError("count broken")

    with mock.patch.object(rows_module.PassRows, "_rows_of_every_window", broken):
        rows = whole_rows()
        iterator = iter(rows)
        next(iterator)  # below the floor: served
        with pytest.raises(ValueError, match="count broken"):
            rows.state_dict()


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: TokenBudgetBatches(LENGTHS, 4096, padded=True, seed=2, **kw),
        lambda **kw: TokenBudgetBatches(LENGTHS, 4096, padded=False, seed=2, **kw),
        lambda **kw: PackedRows(LENGTHS, 300, split_records=False, truncate=True, seed=2, **kw),
        lambda **kw: PackedRows(
            LENGTHS,
            512,
            split_records=False,
            seed=2,
            strategy=Mixture([SIZE // 2, SIZE - SIZE // 2], [3, 1], num_samples=SIZE),
            **kw,
        ),
    ],
    ids=["budget-padded", "budget-unpadded", "truncated-rows", "mixture-rows"],
)
def test_every_whole_record_mode_serves_its_counted_rows_from_a_held_count(make):
    with counted_first():
        expected = list(make(num_replicas=4, rank=3, tail="pad"))
    with held_count() as held:
        sampler = make(num_replicas=4, rank=3, tail="pad")
        iterator = iter(sampler)
        first = next(iterator)
        assert held["done"] == [] and first == expected[0]
        held["release"].set()
        assert [first, *iterator] == expected


@settings(max_examples=60, deadline=None)
@given(
    world_size=st.integers(1, 5),
    tail=st.sampled_from(["pad", "drop", "uneven"]),  # carry needs passes of one length: not whole records
    mode=st.sampled_from(["whole", "padded", "unpadded"]),
    window=st.integers(3, 40),
    saves=st.lists(st.integers(0, 400), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_any_floor_gives_the_counted_samplers_rows_and_states(world_size, tail, mode, window, saves, seed):
    """Every pass counted in the background (the threshold patched to 0) against every pass counted first: the
    same rows and the same state at any step, on any ranks and tail, wherever the floor falls."""
    lengths = np.random.default_rng(seed).integers(1, 60, 500)

    def make(rank: int) -> PackedRows | TokenBudgetBatches:
        common = {"seed": seed, "window": window, "num_replicas": world_size, "rank": rank, "tail": tail}
        if mode == "whole":
            return PackedRows(lengths, 64, split_records=False, batch_size=2, **common)
        return TokenBudgetBatches(lengths, 128, padded=mode == "padded", **common)

    def run(rank: int) -> tuple[list[object], list[object]]:
        sampler, drawn, states = make(rank), [], []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            iterator = iter(sampler)
            for step in range(max(saves) + 1):
                if step in saves:
                    states.append(sampler.state_dict())
                item = next(iterator, None)
                if item is None:
                    break
                drawn.append(item)
        return drawn, states

    with mock.patch.object(rows_module, "_COUNTED_LATER", 0):  # private: every pass in the background
        background = [run(rank) for rank in range(world_size)]
    with counted_first():
        counted = [run(rank) for rank in range(world_size)]
    assert background == counted


class Plans:
    """A dataset whose item for a row plan is the plan's slices."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, plan: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        return [tuple(piece) for piece in plan]


def resumable_rows(batches_per_epoch: int | None) -> object:
    from torch.utils.data import DataLoader

    from stateful_sampler import ResumableLoader

    rows = whole_rows(num_replicas=2, rank=1)
    loader = DataLoader(Plans(), sampler=rows, batch_size=8, collate_fn=list)
    return ResumableLoader(loader, batches_per_epoch=batches_per_epoch)


def _loader_run(batches_per_epoch: int | None, stop: int) -> tuple[list[list[object]], dict[str, object], int]:
    """A ResumableLoader over whole rows (rank 1 of 2, 0 workers): its first ``stop`` batches, then its state
    and len()."""
    loader = resumable_rows(batches_per_epoch)
    iterator = iter(loader)
    taken = [next(iterator) for _ in range(stop)]
    return taken, loader.state_dict(), len(loader)


@pytest.mark.parametrize("batches_per_epoch", [None, 10**6])
def test_a_resumable_loader_serves_its_first_batches_before_the_count_unless_it_caps_the_epoch(batches_per_epoch):
    with counted_first():
        expected = _loader_run(batches_per_epoch, 40)
    with held_count() as held:
        loader = resumable_rows(batches_per_epoch)
        iterator = iter(loader)
        taken = [next(iterator) for _ in range(40)]
        # no cap: the batches came while the count was held; a cap counts the epoch first, in the main thread
        assert held["done"] == ([] if batches_per_epoch is None else ["MainThread"])
        held["release"].set()
        assert (taken, loader.state_dict(), len(loader)) == expected
