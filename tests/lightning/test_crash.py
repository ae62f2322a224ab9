"""Issue case 7, a real crash: a training subprocess is killed with SIGKILL (the whole process
group: every DDP rank and DataLoader worker) after a checkpoint was written, then resumed with
``ckpt_path="last"``. The pre-crash prefix plus the resumed record must equal the uninterrupted
record, per rank and step (dataset indices and a hash of the batch tensors, so augmentation
counts too), and the final weights must be bitwise equal.

Kill points are drawn from a seeded RNG; the seed and the point are in each test id.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from stateful_sampler.verify.lightning_cli.launch import LightningCLILaunch as RunSettings
from stateful_sampler.verify.recorder import BatchRecord, RunRecord
from stateful_sampler.verify.runner import run_and_kill, run_training
from tests.lightning.verify_harness import digits_config

pytestmark = pytest.mark.slow

SEED = 20261130
_draw = random.Random(SEED)
# 2 epochs of 29 steps, a checkpoint every 10 steps and at each epoch end: kill after the first one.
SINGLE_KILLS = sorted(_draw.sample(range(11, 58), 2))
# DDP: 899 positions per rank, 15 steps of 64 per epoch, 30 steps.
DDP_KILL = _draw.randrange(11, 30)
TIMEOUT = 300.0


def in_training_order(batches: list[BatchRecord]) -> list[BatchRecord]:
    return sorted(batches, key=lambda record: record.key)


def assert_crash_resume_exact(reference: RunRecord, killed: RunRecord, resumed: RunRecord, kill_at: int) -> None:
    ranks = sorted({record.rank for record in reference.batches})
    for rank in ranks:  # killed exactly at the kill point, before it could finish
        assert [record.step for record in killed.batches if record.rank == rank] == list(range(kill_at))
    assert killed.weights is None

    resumed_from = max(killed.checkpoint_steps)
    assert resumed_from == max(step for step in reference.checkpoint_steps if step <= kill_at)
    assert 0 < resumed_from <= kill_at
    assert {record.step for record in resumed.batches if record.step <= resumed_from} == {resumed_from}

    expected = in_training_order(reference.batches)
    prefix = [record for record in killed.batches if record.step < resumed_from]
    assert in_training_order(prefix + resumed.batches) == expected
    # The steps the killed run trained on after its last checkpoint match too.
    assert in_training_order(killed.batches) == [record for record in expected if record.step < kill_at]
    assert all(record.indices is not None for record in expected)

    assert reference.weights is not None and resumed.weights is not None
    assert reference.weights.keys() == resumed.weights.keys()
    for name, tensor in reference.weights.items():
        assert torch.equal(resumed.weights[name], tensor), name


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> tuple[RunSettings, RunRecord]:
    directory = tmp_path_factory.mktemp("crash-single")
    settings = RunSettings(digits_config(directory), seed=1234, devices=None, timeout=TIMEOUT)
    (directory / "reference").mkdir()
    return settings, run_training(settings, directory / "reference", "reference")


@pytest.mark.parametrize("kill_at", [pytest.param(k, id=f"seed{SEED}-kill@{k}") for k in SINGLE_KILLS])
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(
    single_process: tuple[RunSettings, RunRecord], kill_at: int, tmp_path: Path
) -> None:
    settings, reference = single_process
    killed = run_and_kill(settings, tmp_path, "killed", kill_at)
    resumed = run_training(settings, tmp_path, "resumed", resume=True)
    assert_crash_resume_exact(reference, killed, resumed, kill_at)


@pytest.mark.parametrize("kill_at", [pytest.param(DDP_KILL, id=f"seed{SEED}-kill@{DDP_KILL}")])
def test_sigkill_of_every_ddp_rank_then_resume_equals_uninterrupted(
    kill_at: int, tmp_path: Path, one_thread: None
) -> None:
    settings = RunSettings(digits_config(tmp_path, num_workers=0), seed=1234, devices=2, timeout=TIMEOUT)
    (tmp_path / "reference").mkdir()
    reference = run_training(settings, tmp_path / "reference", "reference")
    assert sorted({record.rank for record in reference.batches}) == [0, 1]
    killed = run_and_kill(settings, tmp_path, "killed", kill_at)
    resumed = run_training(settings, tmp_path, "resumed", resume=True)
    assert_crash_resume_exact(reference, killed, resumed, kill_at)
