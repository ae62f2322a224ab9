"""Issue case 7, a real crash: a training subprocess is killed with SIGKILL (the whole process
group: every DDP rank and DataLoader worker) after a checkpoint was written, then resumed with
``ckpt_path="last"``. The pre-crash prefix plus the resumed record must equal the uninterrupted
record, per rank and step (dataset indices and a hash of the batch tensors, so augmentation
counts too), and the final weights must be bitwise equal.

Kill points are drawn from a seeded RNG; the seed and the point are in each test id. The first
single-process kill is ``stateful-sampler verify``'s (seed 1234 from the config): its runs serve the
crash test there and the test of verify's report on a correct setup.
"""

from __future__ import annotations

import io
import random
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from stateful_sampler.verify.cli import EXIT_EQUAL, main
from stateful_sampler.verify.lightning_cli.launch import LightningCLILaunch as RunSettings
from stateful_sampler.verify.recorder import BatchRecord, RunRecord, read_run
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


@dataclass(frozen=True)
class Verified:
    """One ``stateful-sampler verify`` of the single-process config, killed at the first kill point: its
    uninterrupted, killed and resumed runs serve the crash test at that point, its report the verify test."""

    config: Path
    work_dir: Path
    code: int
    out: str
    err: str

    def run(self, name: str) -> RunRecord:
        return read_run(self.work_dir / ("reference" if name == "reference" else "crash") / name)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> Verified:
    directory = tmp_path_factory.mktemp("crash-single")
    config = digits_config(directory)
    arguments = ["--config", str(config), "--kill-at", str(SINGLE_KILLS[0]), "--work-dir", str(directory / "work")]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(arguments)
    return Verified(config, directory / "work", code, out.getvalue(), err.getvalue())


def test_verify_passes_on_a_correct_setup(verified: Verified) -> None:
    kill_at, resumed_from, steps = 19, 10, 58  # killed after 19 steps, resumed from the checkpoint at 10
    assert SINGLE_KILLS[0] == kill_at
    assert verified.code == EXIT_EQUAL, verified.out + verified.err
    assert f"killed after step {kill_at}; resumed from the checkpoint at step {resumed_from}\n" in verified.out
    assert (
        f"batches compared: {steps} ({steps} steps x 1 rank(s)), identical to the uninterrupted run's: {steps}\n"
        in verified.out
    )
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in verified.out
    assert "DIVERGED" not in verified.out


@pytest.mark.parametrize("kill_at", [pytest.param(k, id=f"seed{SEED}-kill@{k}") for k in SINGLE_KILLS])
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(verified: Verified, kill_at: int, tmp_path: Path) -> None:
    reference = verified.run("reference")
    if kill_at == SINGLE_KILLS[0]:  # verify killed and resumed the run there
        killed, resumed = verified.run("killed"), verified.run("resumed")
    else:
        settings = RunSettings(verified.config, seed=1234, devices=None, timeout=TIMEOUT)
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
