"""Every example runs, with small settings, as a user would run it: as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600


def run_example(name: str, *args: str) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # a 2.4K-parameter model: one thread is faster
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=environment,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_plain_loop_resumes_exactly_with_two_workers() -> None:
    out = run_example("plain_loop.py", "--epochs", "2", "--stop-after", "40")
    assert "steps: 40 before the stop, 74 after the resume, 114 uninterrupted\n" in out
    assert "identical batches, in the same order: True\n" in out
    assert "final weights bitwise identical: True\n" in out
    assert "verdict: IDENTICAL\n" in out


def test_lightning_script_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    first = run_example("lightning_train.py", "--root", str(tmp_path), "--max-epochs", "1")
    assert "trained to step 57, epoch 1;" in first  # ceil(1797 / 32) steps
    second = run_example("lightning_train.py", "--root", str(tmp_path), "--max-epochs", "2")
    assert f"Restoring states from the checkpoint path at {tmp_path / 'checkpoints' / 'last.ckpt'}" in second
    assert "trained to step 114, epoch 2;" in second


def test_ddp_script_keeps_the_sampler_on_both_ranks(tmp_path: Path) -> None:
    out = run_example("lightning_ddp.py", "--root", str(tmp_path), "--max-epochs", "1")
    for rank in (0, 1):  # 1797 records padded to 1798 on 2 ranks
        assert f"rank {rank}: epoch 0, StatefulSampler kept, 899 of 1798 positions" in out
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_demo_kills_resumes_and_reports_identical_runs() -> None:
    out = run_example("demo.py")
    # configs/digits.yaml: 3 epochs of 57 steps, killed after step 85, resumed from the checkpoint at 80.
    assert "killed with SIGKILL after step 85, in epoch 1 after 28 of its 57 batches" in out
    assert "and resumed from last.ckpt (step 80).\n" in out
    assert "training steps  171                     85 before the kill + 91 after the resume (5 replayed)\n" in out
    assert "steps compared:                  171\n" in out
    assert "identical batches:               171 of 171\n" in out
    assert "identical final weights:         yes, bitwise\n" in out
    assert "verdict:                         IDENTICAL: the resumed run is the uninterrupted run\n" in out
    assert "DIFFERENT" not in out


def test_parquet_stream_is_killed_resumed_and_reports_identical_runs() -> None:
    out = run_example("parquet_stream.py")
    assert "killed with SIGKILL after step 75 (epoch 1, batch 18 of 57); resuming from the checkpoint at step 60" in out
    assert "identical batches:       114 of 114 (record ids, in order)\n" in out
    assert "identical final weights: yes, bitwise\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    assert "\n       64          1797     0.06 TV" in out  # the table ends at a window of every shard


def test_imbalanced_trains_stratified_and_resumes_a_sigkilled_run_exactly(tmp_path: Path) -> None:
    out = run_example("imbalanced.py", "--plot", str(tmp_path / "composition.png"))
    recall = {line.split(":")[0].strip(): float(line.split("recall ")[1][:4]) for line in out.splitlines()
              if "minority recall" in line}  # fmt: skip
    assert recall["stratified"] > recall["uniform"] + 0.3  # the balanced windows draw the 5% class as often as any
    assert "and resumed: 160 of 160 batches compared, final weights identical: True\n" in out
    assert "verdict: IDENTICAL\n" in out
    assert (tmp_path / "composition.png").stat().st_size > 0


def test_mixture_is_killed_resumed_and_reports_its_source_shares(tmp_path: Path) -> None:
    out = run_example("mixture.py", "--plot", str(tmp_path / "mixture.png"))
    assert "killed with SIGKILL after step 43 (exit -9); resuming from the checkpoint at step 40\n" in out
    assert "identical batches:       64 of 64\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    assert "source shares of the batches trained on: A 0.5000, B 0.3000, C 0.2000\n" in out
    assert "     2   0.2000    0.2000   0.2000       2\n" in out  # 400 draws of the 200-record source: 2 passes
    assert (tmp_path / "mixture.png").stat().st_size > 10_000


LAUNCH_2 = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
ACCELERATE_2 = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# The launchers run at once (below), so each gets a rendezvous port of its own: they all default to 29500.
FRAMEWORK_RUNS = {
    "fabric": ([sys.executable, "examples/fabric_train.py"], 17, "52 (26 steps x 2 rank(s)), identical: 52"),
    "accelerate": ([*ACCELERATE_2, "--main_process_port", str(free_port()), "examples/accelerate_train.py"], 17,
                   "52 (26 steps x 2 rank(s)), identical: 52"),
    "hf_trainer": ([*LAUNCH_2, "--master-port", str(free_port()), "examples/hf_trainer.py"], 22,
                   "68 (34 steps x 2 rank(s)), identical: 68"),
    "dcp": ([*LAUNCH_2, "--master-port", str(free_port()), "examples/dcp_train.py"], 17,
            "52 (26 steps x 2 rank(s)), identical: 52"),
}  # fmt: skip


@pytest.fixture(scope="module")
def framework_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """``verify --kill-at K -- EXAMPLE`` for every framework example, all started at once: each run spends
    half its time with one rank waiting for the other to import its framework, so together they take
    about the time of two. Each test below asserts its own run's verdict."""
    logs, runs = tmp_path_factory.mktemp("framework_runs"), {}
    verify = [sys.executable, "-m", "stateful_sampler.cli", "verify", "--kill-at"]
    for name, (command, kill_at, _) in FRAMEWORK_RUNS.items():
        out = (logs / f"{name}.log").open("w")
        runs[name] = (out, subprocess.Popen([*verify, str(kill_at), "--", *command, "--root", "{run_dir}"], text=True,
                                            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"}))  # fmt: skip
    verdicts = {}
    for name, (out, process) in runs.items():
        try:
            process.wait(timeout=TIMEOUT)
        finally:
            process.kill()
            out.close()
        verdicts[name] = (process.returncode, (logs / f"{name}.log").read_text())
    return verdicts


@pytest.mark.parametrize("framework", FRAMEWORK_RUNS)
def test_framework_example_on_two_processes_is_verified_equal_after_a_sigkill_mid_epoch(
    framework: str, framework_verdicts: dict[str, tuple[int, str]]
) -> None:
    _, kill_at, compared = FRAMEWORK_RUNS[framework]
    returncode, out = framework_verdicts[framework]
    assert returncode == 0, out
    assert f"killed after step {kill_at}; resumed from the checkpoint at step {kill_at // 5 * 5}\n" in out
    assert f"batches compared: {compared}\n" in out
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in out
