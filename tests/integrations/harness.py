"""Run a framework example as a user would (a subprocess, its own launcher) and compare its recorded batches."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    records: dict[int, list[dict]]  # rank -> consumed batches, in order

    def resumed_from(self) -> int:
        return int(re.findall(r"resumed from step (\d+)", self.output)[-1])


def run(command: list[str], record: Path, expect_kill: bool = False) -> Run:
    """Run ``command`` (``python`` is this interpreter) in a session of its own, so that a hung run is killed with
    every process it started at ``TIMEOUT``. A killed run (``--kill-at``: rank 0 SIGKILLs its process group) fails:
    the launcher's exit code is -9, or non-zero when the other ranks lost rank 0 in a collective."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    argv = [sys.executable if part == "python" else part for part in command] + ["--record", str(record)]
    process = subprocess.Popen(argv, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)  # fmt: skip
    try:
        output = process.communicate(timeout=TIMEOUT)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    failed = process.returncode != 0
    assert failed == expect_kill, f"exit {process.returncode}\n{output[-6000:]}"
    return Run(process.returncode, output, read_records(record))


def read_records(directory: Path) -> dict[int, list[dict]]:
    return {
        int(path.stem.removeprefix("rank")): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(directory.glob("rank*.jsonl"))
    }


def assert_each_epoch_is_split_without_overlap(records: dict[int, list[dict]], size: int, epochs: int) -> None:
    """Per epoch, the ranks' non-padding records are disjoint and together every record once; padding repeats."""
    for epoch in range(epochs):
        taken: list[int] = []
        for rank_records in records.values():
            for batch in (batch for batch in rank_records if batch["epoch"] == epoch):
                taken += [index for index, padding in zip(batch["ids"], batch["padding"]) if not padding]
        assert sorted(taken) == list(range(size)), f"epoch {epoch}: not every record exactly once"
