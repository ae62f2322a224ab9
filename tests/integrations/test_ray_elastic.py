"""Ray Train's elastic group for real: ``ScalingConfig(num_workers=(1, 2))`` on a local cluster of slot nodes
(ray_elastic_run.py, one run), shrunk 2 -> 1 by a node removed mid-epoch, grown 1 -> 2 by a node added, then a
worker SIGKILLed and the group back at the same size, each time through ``ray.train.get_checkpoint()``.
The references are the loop restored from the same checkpoints in this process, never interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.train")

from tests.integrations import ray_elastic_run as elastic  # after importorskip: needs ray
from tests.integrations import ray_train_run as runs
from tests.integrations.test_ray import run_on_a_cluster

pytestmark = pytest.mark.slow
FIELDS = ("step", "epoch", "ids", "rand")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray_elastic")
    # A restart decided on a stale view of the nodes gives up its placement group after 5 s (60 by default).
    run_on_a_cluster(elastic, root, RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="5")
    return root


def attempts(root: Path) -> list[list[list[dict[str, Any]]]]:
    """Each attempt's lines, by rank."""
    out = root / "elastic"
    return [
        [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(out.glob(f"attempt{a}-*"))]
        for a in range(len(list(out.glob("attempt*-rank0.jsonl"))))
    ]


def summary(root: Path) -> dict[str, Any]:
    return json.loads((root / "summary.json").read_text())


def records(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{name: line[name] for name in FIELDS} for line in lines]


def test_each_attempt_ran_at_the_size_the_nodes_left_from_the_step_it_was_checkpointed_at(root: Path) -> None:
    by_attempt = attempts(root)
    assert [len(ranks) for ranks in by_attempt] == [2, 1, 2, 2]  # shrunk by the node lost, grown by the node added
    expected_steps = [[1, 2], [3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13]]
    for ranks, steps in zip(by_attempt, expected_steps, strict=True):
        assert [[line["step"] for line in rank] for rank in ranks] == [steps] * len(ranks)  # equal steps per rank
        assert {line["world_size"] for rank in ranks for line in rank} == {len(ranks)}
        assert {line["restored"] for rank in ranks for line in rank} == {steps[0] > 1}
    assert summary(root)["addresses"] == ["127.0.0.1"]


def test_the_node_lost_and_the_node_added_are_the_ones_the_workers_ran_on(root: Path) -> None:
    (first, second), (alone,), grown, _ = attempts(root)
    lost, added = summary(root)["lost"], summary(root)["added"]
    assert {line["node"] for line in second} == {lost} and {line["node"] for line in first} != {lost}
    assert {line["node"] for line in alone} == {first[0]["node"]}  # the node left
    assert {rank[0]["node"] for rank in grown} == {first[0]["node"], added}


def test_epoch_0_across_both_resizes_has_every_record_once(root: Path) -> None:
    lines = [line for ranks in attempts(root) for rank in ranks for line in rank]
    consumed = [i for line in lines if line["epoch"] == 0 for i in line["ids"]]
    assert sorted(consumed) == list(range(runs.SIZE))  # none lost, none again: 2, 1 and 2 ranks in one epoch
    assert len(consumed) == runs.SIZE


@pytest.mark.parametrize(("attempt", "saved", "world_size"), [(1, 2, 1), (2, 1, 2)])
def test_a_restart_at_another_size_is_the_checkpoints_restore_at_that_size_and_says_the_rngs_are_not_restored(
    root: Path, attempt: int, saved: int, world_size: int
) -> None:
    ranks = attempts(root)[attempt]
    step = (elastic.SHRINK_AT, elastic.GROW_AT)[attempt - 1]
    reference = elastic.resumed(summary(root)["checkpoints"][str(step)], world_size, step)
    for rank, lines in enumerate(ranks):
        assert records(lines) == reference[rank][: len(lines)]  # the batches the elastic rule lays out, exactly
        (warning,) = lines[0]["warnings"]
        assert warning.startswith(f"RNG states saved at world size {saved} are not restored at world size {world_size}")


def test_the_grown_group_killed_comes_back_at_the_same_size_with_every_batch_and_draw_of_the_uninterrupted_run(
    root: Path,
) -> None:
    grown, killed = attempts(root)[2:]
    reference = elastic.resumed(summary(root)["checkpoints"][str(elastic.GROW_AT)], 2, elastic.GROW_AT)
    assert (root / "elastic" / "paused-2-rank1").exists() and killed[0][0]["step"] == elastic.KILL_AT + 1
    for rank in range(2):
        assert records(grown[rank] + killed[rank]) == reference[rank]  # the torch.rand draws: RNGs restored
        assert killed[rank][0]["warnings"] == []
    assert reference[0][-1]["step"] == 13 and {line["epoch"] for line in reference[0]} == {0, 1}
