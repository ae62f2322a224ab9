"""torch.distributed.checkpoint, 2 CPU processes (torchrun, gloo): examples/dcp_train.py resumed on 1 rank.

The exact resume on 2 ranks (SIGKILL mid-epoch, every batch and the final weights against an uninterrupted
run) is ``stateful-sampler verify`` on the example in tests/docs/test_examples.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from stateful_sampler import IncompatibleStateError, ResumableLoader, StatefulSampler
from stateful_sampler.dcp import DistributedLoaderState
from tests.integrations.harness import Run, assert_each_epoch_is_split_without_overlap, run


def launch(processes: int) -> list[str]:
    return ["python", "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "examples/dcp_train.py"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    root = tmp_path_factory.mktemp("dcp-killed")
    return run([*launch(2), "--root", str(root / "run"), "--kill-at", "17"], root / "records", expect_kill=True), root


@pytest.mark.slow
def test_a_checkpoint_of_2_ranks_resumes_on_1_and_the_epoch_still_takes_every_record_once(
    killed: tuple[Run, Path], tmp_path: Path
) -> None:
    killed_run, root = killed
    shutil.copytree(root / "run", tmp_path / "run")
    resumed = run([*launch(1), "--root", str(tmp_path / "run")], tmp_path / "records")
    assert "resumed from step 15 (epoch 1)" in resumed.output
    assert len(resumed.records[0]) == 22  # 203 - 2 * 2 * 8 records left of epoch 1, in batches of 8 on one rank
    before = {rank: batches[:15] for rank, batches in killed_run.records.items()}  # up to the checkpoint at step 15
    combined = {rank: before[rank] + (resumed.records[0] if rank == 0 else []) for rank in before}
    assert_each_epoch_is_split_without_overlap(combined, size=203, epochs=2)


def make_loader() -> ResumableLoader:
    return ResumableLoader(DataLoader(range(20), sampler=StatefulSampler(20, batch_size=4), batch_size=4))


def test_the_state_holds_each_rank_s_json_under_one_key_and_continues_the_epoch() -> None:
    loader = make_loader()
    iterator = iter(loader)
    consumed = [next(iterator).tolist() for _ in range(2)]
    state = DistributedLoaderState(loader).state_dict()
    assert list(state) == ["ranks"] and json.loads(state["ranks"][0])["sampler"]["position"] == 8
    resumed = make_loader()
    DistributedLoaderState(resumed).load_state_dict(state)
    assert consumed + [batch.tolist() for batch in resumed] == [batch.tolist() for batch in make_loader()]


def test_ranks_that_saved_different_positions_are_refused() -> None:
    loader = make_loader()
    state = DistributedLoaderState(loader).state_dict()
    iterator = iter(loader)
    next(iterator)
    other = DistributedLoaderState(loader).state_dict()["ranks"][0]
    with pytest.raises(IncompatibleStateError, match=r"state field 'ranks': saved 'rank 1: .*the saving ranks were not "
                       r"in step \(rank 0 differs\)"):  # fmt: skip
        DistributedLoaderState(make_loader()).load_state_dict({"ranks": [state["ranks"][0], other]})


@pytest.mark.parametrize("state", [{}, {"ranks": []}, {"ranks": [{"version": 1}]}, []])
def test_a_state_without_the_ranks_list_is_refused(state: object) -> None:
    with pytest.raises(IncompatibleStateError, match=r"state field 'ranks'.*a list of each rank's state"):
        DistributedLoaderState(make_loader()).load_state_dict(state)  # type: ignore[arg-type]


def _loader() -> ResumableLoader:
    return ResumableLoader(DataLoader(range(12), sampler=StatefulSampler(12, batch_size=2, seed=5), batch_size=2))


def test_ranks_whose_rng_states_differ_are_in_step_and_another_world_size_restores_none_of_them() -> None:
    """Each rank's RNG states are its own (ResumableLoader saves them by default); only the position must agree."""
    import random

    import torch

    saving = _loader()
    next(iter(saving))
    states = []
    for seed in (1, 2):  # two ranks, seeded apart
        torch.manual_seed(seed)
        states.append(json.dumps(saving.state_dict(), sort_keys=True))
    assert states[0] != states[1]
    torch.manual_seed(99)
    random_before = random.getstate()
    expected = torch.rand(3)
    torch.manual_seed(99)
    restored = _loader()
    DistributedLoaderState(restored).load_state_dict({"ranks": states})  # saved by 2 ranks, loaded by 1
    assert torch.equal(torch.rand(3), expected) and random.getstate() == random_before  # no rank's RNG restored
    assert [batch.tolist() for batch in restored] == [batch.tolist() for batch in saving]


def test_ranks_at_different_positions_are_still_refused() -> None:
    first, second = _loader(), _loader()
    next(iter(second))
    states = [json.dumps(loader.state_dict(), sort_keys=True) for loader in (first, second)]
    with pytest.raises(IncompatibleStateError, match=r"the saving ranks were not in step \(rank 0 differs\)"):
        DistributedLoaderState(_loader()).load_state_dict({"ranks": states})
