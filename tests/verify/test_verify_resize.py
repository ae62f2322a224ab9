"""``stateful-sampler verify --resize 4:2`` on real torchrun runs (gloo, 4 processes, then 2): the
TorchElastic example resumed at half the world size meets the elastic rules and keeps the global
order; a script that does not restore its loader at the resize is DIVERGED, naming the records it
trains twice and where its resume went wrong; the script that does is EQUAL after three kills."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stateful_sampler import StatefulSampler
from stateful_sampler.verify.cli import EXIT_DIVERGED, EXIT_EQUAL, main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{devices}"]


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six small gloo processes on 2 cores: one thread each."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def test_the_elastic_example_resumed_at_half_the_world_size_holds_the_global_order(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # examples/torchrun_elastic.py: 48 records, 2 a rank per step, 2 epochs, a checkpoint every 3 steps.
    # Killed after step 4 at world size 4 (16 batches), resumed from step 3 (record 24) at world size 2.
    example = [*TORCHRUN, str(ROOT / "examples" / "torchrun_elastic.py"), "--root", "{run_dir}"]
    arguments = ["--resize", "4:2", "--kill-at", "4", "--work-dir", str(tmp_path / "work"), "--", *example]
    assert main(arguments) == EXIT_EQUAL
    assert capsys.readouterr().out == (
        "killed after step 4 at world size 4; resumed at world size 2 from step 3 (epoch 0, record 24 of 48, "
        "world size 2)\n"
        "exact (the layout kept): 16 of the killed run's 16 batches at world size 4 identical to the "
        "uninterrupted run's\n"
        "records: 96 over 2 epoch(s); steps of each rank at world size 2: epoch 0: 6, epoch 1: 12\n"
        "global order: held: the epochs' records in the uninterrupted run's order\n"
        "final weights: not compared (at another world size each step averages other records)\n"
        "EQUAL (global order rule): resumed at world size 2, every epoch trained on the uninterrupted run's "
        "records, each once, with the same steps on every rank\n"
    )
    assert "restart 0: resumed from step 3 at world size 2" in (tmp_path / "work" / "crash" / "resumed.log").read_text()


def test_a_script_that_forgets_its_loader_at_the_resize_is_diverged_naming_the_records_trained_twice(
    one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # resize_script.py: 32 records, 2 a rank per step, a checkpoint every 2 steps. Killed after step 3
    # at world size 4; at world size 2 it restores the model and optimizer, not the loader.
    script = [*TORCHRUN, str(Path(__file__).with_name("resize_script.py")), "--root", "{run_dir}"]
    arguments = ["--resize", "4:2", "--kill-at", "3", "--", *script, "--forget-loader-at-resize"]
    assert main(arguments) == EXIT_DIVERGED
    out = capsys.readouterr().out
    assert "exact (the layout kept): 12 of the killed run's 12 batches at world size 4 identical" in out
    assert "global order: not held\n" in out
    # Rank 0's first batch at world size 2 starts the epoch over: records the killed run took at step 0.
    first_at_2 = list(StatefulSampler(range(32), seed=5, batch_size=2, num_replicas=2, rank=0))[:2]
    assert (
        f"DIVERGED: first divergence at step 2 (epoch 0, batch 0 at world size 2), rank 0: records {first_at_2} "
        "trained on a second time in epoch 0 (first at step 0)\n"
    ) in out
    assert (
        "DIVERGED: at step 2, where the run killed after step 3 resumes at world size 2: the resumed run started "
        "at epoch 0, record 0, not at the last checkpoint (epoch 0, record 16): the loader's state was not restored."
    ) in out


def test_three_kills_with_a_resize_resume_each_time_at_the_new_world_size(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # resize_script.py for 2 epochs, a checkpoint every 3 steps (its SGD imports no torch._dynamo: 14 ranks
    # start in half the CPU the example's take). --kill-seed 0 draws steps 4, 5 and 7 of epoch 1 (4..7 at
    # world size 4). The first kill is at world size 4; the runs after it, killed at the same records (epoch 1,
    # batches 2 and 6 at world size 2) and the last one, at 2. Each resumes from the last checkpoint.
    script = [*TORCHRUN, str(Path(__file__).with_name("resize_script.py")), "--root", "{run_dir}"]
    arguments = ["--resize", "4:2", "--kills", "3", "--work-dir", str(tmp_path / "work"), "--", *script]
    assert main([*arguments, "--epochs", "2", "--every", "3"]) == EXIT_EQUAL
    out = capsys.readouterr().out
    assert out.startswith(
        "killed after steps 4, 5, 7 (the first at world size 4, the others at 2); resumed at world size 2 from "
        "step 3 (epoch 0, record 24 of 32, world size 2); then from step 6 (epoch 1, record 4 of 32, world size 2); "
        "then from step 9 (epoch 1, record 16 of 32, world size 2)\n"
        "exact (the layout kept): 16 of the killed run's 16 batches at world size 4 identical to the uninterrupted "
        "run's; 6 batches at world size 2 retrained after a kill\n"
    )
    assert "records: 64 over 2 epoch(s); steps of each rank at world size 2: epoch 0: 2, epoch 1: 8\n" in out
    assert "EQUAL (global order rule)" in out
    for name in ("killed1", "killed2", "killed3", "resumed"):  # every kill a real SIGKILL of a run of its own
        assert (tmp_path / "work" / "crash" / f"{name}.log").is_file()
