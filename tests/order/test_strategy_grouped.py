"""``Grouped``: whole groups shuffled per pass, each group's records consecutive, exactly resumable."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import IncompatibleStateError, StatefulSampler
from stateful_sampler.order.grouped import Grouped
from tests.strategy_resume_checks import elastic_resume, loader_resume, sigkilled_run

group_ids = st.lists(st.integers(0, 12), min_size=1, max_size=120)


def runs(order: list[int], groups: np.ndarray) -> list[list[int]]:
    """``order`` cut into maximal runs of records of one group."""
    cut: list[list[int]] = []
    for record in order:
        if cut and groups[cut[-1][-1]] == groups[record]:
            cut[-1].append(record)
        else:
            cut.append([record])
    return cut


@settings(max_examples=60, deadline=None)
@given(ids=group_ids, seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40))
def test_every_group_appears_once_per_pass_contiguous_and_in_ascending_order(
    ids: list[int], seed: int, pass_index: int
) -> None:
    groups = np.array(ids)
    strategy = Grouped(groups)
    order = strategy.pass_order(len(ids), seed, pass_index)(np.arange(strategy.pass_length(len(ids), pass_index)))
    pieces = runs(order.tolist(), groups)
    assert sorted(groups[piece[0]] for piece in pieces) == sorted(set(ids))  # each group one run
    for piece in pieces:
        assert piece == np.flatnonzero(groups == groups[piece[0]]).tolist()


@settings(max_examples=60, deadline=None)
@given(ids=group_ids, seed=st.integers(0, 2**63 - 1), pass_index=st.integers(0, 2**40))
def test_shuffle_within_keeps_groups_contiguous_with_each_record_once(
    ids: list[int], seed: int, pass_index: int
) -> None:
    groups = np.array(ids)
    strategy = Grouped(groups, shuffle_within=True)
    order = strategy.pass_order(len(ids), seed, pass_index)(np.arange(len(ids)))
    pieces = runs(order.tolist(), groups)
    assert len(pieces) == len(set(ids))
    for piece in pieces:
        assert sorted(piece) == np.flatnonzero(groups == groups[piece[0]]).tolist()


def test_the_group_order_and_the_order_inside_groups_change_every_pass() -> None:
    groups = np.repeat(np.arange(50), 20)
    strategy = Grouped(groups, shuffle_within=True)
    passes = [strategy.pass_order(1000, 7, index)(np.arange(1000)) for index in range(3)]
    firsts = [tuple(groups[order[::20]]) for order in passes]
    assert len(set(firsts)) == 3
    insides = [tuple(order[groups[order] == 0]) for order in passes]
    assert len(set(insides)) == 3 and all(sorted(inside) == list(range(20)) for inside in insides)


def test_every_position_of_a_group_is_equally_likely_inside_it() -> None:
    """Over 2000 passes, record i of a 5-record group lands at each of its 5 slots about 400 times."""
    groups = np.repeat([0, 1], [5, 3])
    strategy = Grouped(groups, shuffle_within=True)
    counts = np.zeros((5, 5), dtype=np.int64)
    for index in range(2000):
        order = strategy.pass_order(8, 1, index)(np.arange(8))
        inside = order[groups[order] == 0]
        counts[inside, np.arange(5)] += 1
    expected = 400
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 50, counts  # 16 degrees of freedom: p below 1e-5


def test_on_two_ranks_the_default_layout_deals_a_groups_records_round_robin() -> None:
    """Rank r takes global positions r, r+2, ...: a group of 4 gives 2 records to each rank."""
    groups = np.repeat([0, 1, 2], 4)
    order = Grouped(groups).pass_order(12, 5, 0)(np.arange(12)).tolist()
    ranks = [list(StatefulSampler(12, seed=5, strategy=Grouped(groups), num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert ranks == [order[0::2], order[1::2]]
    assert all(len({int(groups[i]) for i in ranks[0][k : k + 2]}) == 1 for k in range(0, 6, 2))


@pytest.mark.parametrize("world_size", [2, 3])
def test_lanes_keep_each_group_whole_and_in_order_on_one_rank_with_equal_steps(world_size: int) -> None:
    sizes = [7, 1, 3, 5, 2, 2, 9, 4, 1, 6]
    groups = np.repeat(np.arange(10), sizes)
    size = len(groups)
    for epoch in range(3):
        ranks = []
        for rank in range(world_size):
            lanes = Grouped(groups, lanes=world_size)
            sampler = StatefulSampler(size, seed=11, strategy=lanes, num_replicas=world_size, rank=rank, batch_size=2)
            sampler.set_epoch(epoch)
            ranks.append(list(sampler))
        assert len({len(taken) for taken in ranks}) == 1  # equal step counts
        owner: dict[int, int] = {}
        for rank, taken in enumerate(ranks):
            lane = runs(taken, groups)
            distinct = list(dict.fromkeys(int(groups[piece[0]]) for piece in lane))
            for group in distinct:
                assert owner.setdefault(group, rank) == rank  # one rank per group
            whole = [i for g in distinct for i in np.flatnonzero(groups == g).tolist()]
            assert taken == (whole * 2)[: len(taken)]  # whole groups in order, then the lane wraps
        assert sorted(owner) == list(range(10))


def test_lanes_deal_the_groups_so_lane_totals_differ_by_at_most_the_largest_group() -> None:
    sizes = np.array([9, 9, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    strategy = Grouped(np.repeat(np.arange(len(sizes)), sizes), lanes=3)
    # Largest first, in snake order: 9 | 9 | 8, then the 1s to lanes 2 1 0, 0 1 2, 2 1 0, 0.
    assert strategy._lane_sizes.tolist() == [13, 12, 11]
    assert strategy.pass_length(36, 0) == 3 * 13  # every lane as long as the longest


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_resumed_from_consumed_batches_continues_exactly(workers: int) -> None:
    groups = np.arange(90) * 13 % 17
    make = lambda: StatefulSampler(90, seed=3, batch_size=4, strategy=Grouped(groups, shuffle_within=True))
    whole, resumed = loader_resume(make, workers, consumed=9)  # workers ran ahead of these 9
    assert resumed == whole


@pytest.mark.slow
def test_a_sigkilled_training_process_resumes_from_its_last_save_exactly(tmp_path: Path) -> None:
    whole, cut = sigkilled_run("grouped", tmp_path)
    assert len(whole) == 45  # 15 steps an epoch, 3 epochs; step 20 is inside epoch 1
    assert cut == whole


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=30),
    worlds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch_size=st.integers(1, 5),
    steps=st.integers(0, 30),
    tail=st.sampled_from(["pad", "drop", "uneven"]),
    lanes=st.booleans(),
)
def test_a_state_saved_on_w_ranks_resumes_on_another_world_size_with_every_position_once(
    sizes: list[int], worlds: tuple[int, int], batch_size: int, steps: int, tail: str, lanes: bool
) -> None:
    before, after = worlds
    groups = np.repeat(np.arange(len(sizes)), sizes)
    strategy = lambda: Grouped(groups, lanes=min(before, len(sizes)) if lanes else 1)
    if tail == "drop" and len(groups) < max(before, after):
        tail = "pad"
    elastic_resume(strategy, len(groups), worlds, batch_size, steps, tail)


def test_a_state_from_other_groups_is_refused_naming_the_strategy_fingerprint() -> None:
    saved = StatefulSampler(6, strategy=Grouped([0, 0, 1, 1, 2, 2])).state_dict()
    other = StatefulSampler(6, strategy=Grouped([0, 0, 0, 1, 1, 2]))
    with pytest.raises(IncompatibleStateError, match="strategy_fingerprint"):
        other.load_state_dict(saved)
    with pytest.raises(IncompatibleStateError, match="strategy_fingerprint"):
        StatefulSampler(6, strategy=Grouped([0, 0, 1, 1, 2, 2], shuffle_within=True)).load_state_dict(saved)
    StatefulSampler(6, strategy=Grouped(torch.tensor([0, 0, 1, 1, 2, 2]))).load_state_dict(saved)  # same groups


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: Grouped([0.5, 1.0]),
            TypeError,
            "groups must hold integer ids, got dtype float64 with 0.5 at position 0",
        ),
        (lambda: Grouped(["a", "b"]), TypeError, "groups must hold integer ids, got dtype <U1"),
        (lambda: Grouped([0, -1]), ValueError, "groups must hold non-negative ids, got -1 at position 1"),
        (lambda: Grouped([[0, 1]]), ValueError, r"groups must be 1-D, got shape \(1, 2\)"),
        (lambda: Grouped(3), TypeError, "groups must be a list, a NumPy array or a 1-D tensor, got int"),
        (lambda: Grouped([0, 1], lanes=3), ValueError, r"lanes must be at most the number of groups \(2\), got 3"),
        (lambda: Grouped([0, 1], lanes=0), ValueError, "lanes must be at least 1, got 0"),
        (lambda: Grouped([0, 1], shuffle_within=1), TypeError, "shuffle_within must be a bool, got int 1"),
        (
            lambda: StatefulSampler(3, strategy=Grouped([0, 1])),
            ValueError,
            "groups must have one entry per record: length 3, got 2",
        ),
    ],
)
def test_bad_groups_are_refused_naming_the_argument(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        call()


@pytest.mark.slow
def test_two_ddp_processes_with_lanes_see_whole_groups_and_resume_exactly(tmp_path: Path) -> None:
    """Real gloo processes in lockstep: each rank takes whole groups, in order, and a run stopped after 5 steps
    and resumed in new processes sees exactly the rest of the uninterrupted run."""
    from tests.helpers import run_ranks
    from tests.order.strategy_ddp_run import GROUPS

    script = Path(__file__).with_name("strategy_ddp_run.py")
    uncut, cut = tmp_path / "whole", tmp_path / "cut"
    uncut.mkdir(), cut.mkdir()
    run = lambda out, *args: run_ranks([sys.executable, str(script), "grouped", str(out), *args], 2,
                                       script.parents[2], timeout=180)  # fmt: skip
    run(uncut, "whole")
    run(cut, "head", "5")
    run(cut, "rest")
    read = lambda out, name, rank: json.loads((out / f"{name}_rank{rank}.json").read_text())
    whole = [read(uncut, "whole", rank) for rank in (0, 1)]
    assert len(whole[0]) == len(whole[1]) == 2 * 8  # lanes of 24 and 22 (+2 wrapped) records, batches of 3
    owners = [{int(GROUPS[i]) for batch in whole[rank][:8] for i in batch} for rank in (0, 1)]
    assert owners[0].isdisjoint(owners[1]) and owners[0] | owners[1] == set(range(12))  # each group on one rank
    for rank in (0, 1):
        assert read(cut, "head", rank) + read(cut, "rest", rank) == whole[rank]
        first_epoch = [i for batch in whole[rank][:8] for i in batch]
        pieces = runs(first_epoch, GROUPS)
        distinct = list(dict.fromkeys(int(GROUPS[piece[0]]) for piece in pieces))
        in_order = [i for group in distinct for i in np.flatnonzero(GROUPS == group).tolist()]
        assert first_epoch == (in_order * 2)[: len(first_epoch)]
