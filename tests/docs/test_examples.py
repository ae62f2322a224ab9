"""Every example runs, with small settings, as a user would run it: as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.harness import assert_each_epoch_is_split_without_overlap, read_records

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600


def run_example(name: str, *args: str) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # a 2.4K-parameter model: one thread is faster
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=environment, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


LAUNCH_2 = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
ACCELERATE_2 = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
VERIFY = [sys.executable, "-m", "stateful_sampler.cli", "verify", "--kill-at"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def example(name: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / name), *args]


IDENTICAL = "identical to the uninterrupted run's: "
# The four framework examples under verify: killed after step K, resumed from the checkpoint at K // 5 * 5.
# The launchers run at once (below), so each gets a rendezvous port of its own: they all default to 29500.
FRAMEWORKS = {
    "fabric": ([sys.executable, "examples/fabric_train.py"], 17, "52 (26 steps x 2 rank(s)), " + IDENTICAL + "52"),
    "accelerate": ([*ACCELERATE_2, "--main_process_port", str(free_port()), "examples/accelerate_train.py"], 17,
                   "52 (26 steps x 2 rank(s)), " + IDENTICAL + "52"),
    "hf_trainer": ([*LAUNCH_2, "--master-port", str(free_port()), "examples/hf_trainer.py"], 22,
                   "68 (34 steps x 2 rank(s)), " + IDENTICAL + "68"),
    "dcp": ([*LAUNCH_2, "--master-port", str(free_port()), "examples/dcp_train.py"], 17,
            "52 (26 steps x 2 rank(s)), " + IDENTICAL + "52"),
}  # fmt: skip
# The uninterrupted run of these records its batches in {dir}/reference/records (verify's --work-dir): the ranks'
# split of each epoch is asserted on it below, in the run verify makes anyway.
RECORDED = ("accelerate", "hf_trainer")
# Every run a test below asserts on, by name; {dir} is the run's own directory.
RUNS: dict[str, list[str]] = {
    **{name: [*VERIFY, str(kill_at), *(["--work-dir", "{dir}"] if name in RECORDED else []), "--", *command,
              "--root", "{run_dir}", *(["--record", "{run_dir}/records"] if name in RECORDED else [])]
       for name, (command, kill_at, _) in FRAMEWORKS.items()},
    "plain_loop": example("plain_loop.py", "--epochs", "2", "--stop-after", "40"),
    "lightning_ddp": example("lightning_ddp.py", "--root", "{dir}", "--max-epochs", "1"),
    "demo": example("demo.py"),
    "parquet_stream": example("parquet_stream.py"),
    "imbalanced": example("imbalanced.py", "--plot", "{dir}/composition.png"),
    "mixture": example("mixture.py", "--plot", "{dir}/mixture.png"),
    "pretrain_mixture": [*VERIFY, "12", "--", *example("pretrain_mixture.py", "--root", "{run_dir}")],
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], tuple[str, Path]]]:
    """Every run of ``RUNS`` started in the background, three at a time, when the first test asks: a run
    leaves cores idle while one rank waits for another to import its framework, or the parent for its
    child, so together they take far less than one after another. Each test waits for and asserts on
    its own run: ``runs(name)`` is its output (stdout then stderr) and its directory."""
    root = tmp_path_factory.mktemp("examples")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2.4K-parameter models: one thread is faster
    pool = ThreadPoolExecutor(max_workers=3)

    def launch(name: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        directory = root / name
        directory.mkdir()
        command = [part.replace("{dir}", str(directory)) for part in RUNS[name]]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=environment, check=False
        )
        return done, directory

    futures: dict[str, Future[tuple[subprocess.CompletedProcess[str], Path]]] = {
        name: pool.submit(launch, name) for name in RUNS
    }

    def result(name: str) -> tuple[str, Path]:
        done, directory = futures[name].result()
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr, directory

    yield result
    pool.shutdown(cancel_futures=True)


def test_plain_loop_resumes_exactly_with_two_workers(runs: Callable[[str], tuple[str, Path]]) -> None:
    out, _ = runs("plain_loop")
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


def test_ddp_script_keeps_the_sampler_on_both_ranks(runs: Callable[[str], tuple[str, Path]]) -> None:
    out, directory = runs("lightning_ddp")
    for rank in (0, 1):  # 1797 records padded to 1798 on 2 ranks
        assert f"rank {rank}: epoch 0, StatefulSampler kept, 899 of 1798 positions" in out
    assert (directory / "checkpoints" / "last.ckpt").is_file()


def test_demo_kills_resumes_and_reports_identical_runs(runs: Callable[[str], tuple[str, Path]]) -> None:
    out, _ = runs("demo")
    # configs/digits.yaml: 3 epochs of 57 steps, killed after step 85, resumed from the checkpoint at 80.
    assert "killed with SIGKILL after step 85, in epoch 1 after 28 of its 57 batches" in out
    assert "and resumed from last.ckpt (step 80).\n" in out
    assert "training steps  171                     85 before the kill + 91 after the resume (5 replayed)\n" in out
    assert "steps compared:                  171\n" in out
    assert "identical batches:               171 of 171\n" in out
    assert "identical final weights:         yes, bitwise\n" in out
    assert "verdict:                         IDENTICAL: the resumed run is the uninterrupted run\n" in out
    assert "DIFFERENT" not in out


def test_parquet_stream_is_killed_resumed_and_reports_identical_runs(runs: Callable[[str], tuple[str, Path]]) -> None:
    out, _ = runs("parquet_stream")
    assert "killed with SIGKILL after step 75 (epoch 1, batch 18 of 57); resuming from the checkpoint at step 60" in out
    assert "identical batches:       114 of 114 (record ids, in order)\n" in out
    assert "identical final weights: yes, bitwise\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    assert "\n       64          1797     0.04 TV" in out  # the table ends at a window of every shard


def test_imbalanced_trains_stratified_and_resumes_a_sigkilled_run_exactly(
    runs: Callable[[str], tuple[str, Path]],
) -> None:
    out, directory = runs("imbalanced")
    recall = {line.split(":")[0].strip(): float(line.split("recall ")[1][:4]) for line in out.splitlines()
              if "minority recall" in line}  # fmt: skip
    assert recall["stratified"] > recall["uniform"] + 0.3  # the balanced windows draw the 5% class as often as any
    assert "and resumed: 160 of 160 batches compared, final weights identical: True\n" in out
    assert "verdict: IDENTICAL\n" in out
    assert (directory / "composition.png").stat().st_size > 0


def test_mixture_is_killed_resumed_and_reports_its_source_shares(runs: Callable[[str], tuple[str, Path]]) -> None:
    out, directory = runs("mixture")
    assert "killed with SIGKILL after step 43 (exit -9); resuming from the checkpoint at step 40\n" in out
    assert "identical batches:       64 of 64\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    assert "source shares of the batches trained on: A 0.5000, B 0.3000, C 0.2000\n" in out
    assert "     2   0.2000    0.2000   0.2000       2\n" in out  # 400 draws of the 200-record source: 2 passes
    assert (directory / "mixture.png").stat().st_size > 10_000


def test_pretrain_mixture_is_verified_equal_after_a_sigkill_mid_epoch(runs: Callable[[str], tuple[str, Path]]) -> None:
    """Mixed corpora (two map-style, one parquet stream), packed rows: killed after step 12, the run resumes from step
    10, where it changes its mixture by hand (on_change="continue", a corpus appended), then crosses the schedule's
    change at 80%, with the uninterrupted run's rows and weights."""
    out, _ = runs("pretrain_mixture")
    assert "killed after step 12; resumed from the checkpoint at step 10\n" in out
    assert "batches compared: 37 (37 steps x 1 rank(s)), identical to the uninterrupted run's: 37\n" in out
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_framework_example_on_two_processes_is_verified_equal_after_a_sigkill_mid_epoch(
    framework: str, runs: Callable[[str], tuple[str, Path]]
) -> None:
    _, kill_at, compared = FRAMEWORKS[framework]
    out, _ = runs(framework)
    assert f"killed after step {kill_at}; resumed from the checkpoint at step {kill_at // 5 * 5}\n" in out
    assert f"batches compared: {compared}\n" in out
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in out


@pytest.mark.parametrize(("framework", "steps", "size"), [("hf_trainer", 34, 204), ("accelerate", 26, 203)])
def test_the_framework_s_sharding_is_a_pass_through_so_the_ranks_split_each_epoch_without_overlap(
    framework: str, steps: int, size: int, runs: Callable[[str], tuple[str, Path]]
) -> None:
    """Moved from tests/integrations/test_hf_trainer.py and test_accelerate.py: checked on verify's uninterrupted run of
    the example on 2 processes (the HF Trainer's Accelerate sharding, and our Accelerate integration's prepare)."""
    _, directory = runs(framework)
    records = read_records(directory / "reference" / "records")
    assert [len(batches) for batches in records.values()] == [steps, steps]
    assert_each_epoch_is_split_without_overlap(records, size=size, epochs=2)
