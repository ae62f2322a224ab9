"""``ShardedStream`` under ResumableLoader, Fabric and Accelerate, as ``StatefulSampler`` is: one line each,
exact after a SIGKILL mid-epoch (with 2 workers, resumed in a new process), and refused where the
loader's batching contradicts the stream's. A ``MixedStream`` of two ``ShardedStream``s goes through Fabric and
Accelerate the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from stateful_sampler import BatchSizeError
from stateful_sampler.loader import ResumableLoader
from tests.stream_helpers import make_stream

ROOT = Path(__file__).resolve().parents[2]


def ids(batches) -> list[list[str]]:
    return [[f"{name}:{int(row)}" for name, row in zip(*batch)] for batch in batches]


@pytest.mark.parametrize("plain_dataloader", [False, True])
def test_resumable_loader_resumes_a_stream_mid_epoch_and_after_the_loop_exactly(plain_dataloader: bool) -> None:
    def loader() -> ResumableLoader:
        stream = make_stream([4, 7, 3], batch_size=2, window=2)
        return ResumableLoader(DataLoader(stream, batch_size=2) if plain_dataloader else stream.loader())

    live = loader()
    uninterrupted = [ids(live) for _ in range(2)]
    cut = loader()
    head = ids(batch for _, batch in zip(range(3), cut))
    resumed = loader()
    resumed.load_state_dict(json.loads(json.dumps(cut.state_dict())))
    assert (resumed.epoch, head + ids(resumed)) == (0, uninterrupted[0])
    assert resumed.epoch == 1 and ids(resumed) == uninterrupted[1]  # the finished pass moved on
    after_loop = loader()
    after_loop.load_state_dict(resumed.state_dict())
    assert after_loop.epoch == 2


def test_resumable_loader_refuses_a_dataloader_batch_size_that_contradicts_the_stream() -> None:
    stream = make_stream([4, 7, 3], batch_size=2)
    with pytest.raises(BatchSizeError, match=r"the loader's batch_size=4 contradicts the sampler's batch_size=2"):
        ResumableLoader(DataLoader(stream, batch_size=4))


def run(framework: str, root: Path, workers: int, kill_after: int | None = None, mixed: bool = False) -> int:
    # as a module from the repository root: run as a file, tests/ would shadow the lightning package
    command = [sys.executable, "-m", "tests.stream.stream_kill_run", framework, str(root), "--workers", str(workers)]
    if kill_after is not None:
        command += ["--kill-after", str(kill_after)]
    command += ["--mixed"] if mixed else []
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, env=environment, timeout=300, capture_output=True, check=False).returncode


def records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "record.jsonl").read_text().splitlines()]


def uninterrupted(root: Path, mixed: bool) -> list[dict]:
    """The loop's records at 0 workers through ResumableLoader, in this process: what every integration's
    run must deliver (each only wraps the stream's loader)."""
    from tests.stream.stream_kill_run import train

    train("plain", root, workers=0, mixed=mixed)
    return records(root)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "mixed"),
    [("plain", False), ("fabric", False), ("accelerate", False), ("fabric", True), ("accelerate", True)],
    ids=["plain", "fabric", "accelerate", "fabric-mixed", "accelerate-mixed"],
)
def test_a_stream_run_killed_mid_epoch_resumes_exactly_with_2_workers(
    framework: str, mixed: bool, tmp_path: Path
) -> None:
    if framework != "plain":
        pytest.importorskip({"fabric": "lightning.fabric", "accelerate": "accelerate"}[framework])
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    cut.mkdir(), whole.mkdir()
    assert run(framework, cut, workers=2, kill_after=15, mixed=mixed) == -9  # epoch 1, batch 4 of 11
    assert len(records(cut)) == 15
    assert run(framework, cut, workers=2, mixed=mixed) == 0
    expected = uninterrupted(whole, mixed)
    # each batch's first record with its augmentation: one draw per (epoch, record), a record the mixture draws twice
    # in an epoch augmented alike (SeededTransform seeds from the seed, the epoch and the record)
    firsts = {(record["epoch"], record["batch"][0][0], record["batch"][0][1]) for record in expected}
    assert len(expected) == 22 and len({noise for *_, noise in firsts}) == len({first[:2] for first in firsts})
    assert len(firsts) == (20 if mixed else 22)
    assert records(cut) == expected  # every batch, its records and their augmentation


@pytest.mark.slow
def test_verify_of_a_command_training_on_a_stream_says_equal(tmp_path: Path, monkeypatch, capsys) -> None:
    from stateful_sampler.verify.cli import EXIT_EQUAL, main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "tests.stream.stream_kill_run", "verify", "{run_dir}"]
    assert main(["--kill-at", "13", "--work-dir", str(tmp_path / "work"), "--", *command]) == EXIT_EQUAL
    out = capsys.readouterr().out
    assert "killed after step 13; resumed from the checkpoint at step 10\n" in out
    assert "batches compared: 22 (22 steps x 1 rank(s)), identical to the uninterrupted run's: 22\n" in out
