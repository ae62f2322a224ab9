"""examples/webdataset_stream.py for real: PNG tar shards on a moto S3 server on 127.0.0.1, a run SIGKILLed
mid-epoch at 2 workers and resumed at 0, equal to the uninterrupted run in record ids, augmented images
and final weights; every shard fetched through the node cache, not once per run or worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.s3_server import s3_server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "webdataset_stream.py"


def run(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        check=False, capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


@pytest.mark.slow
def test_webdataset_example_is_killed_at_two_workers_resumed_at_zero_and_identical() -> None:
    with s3_server() as server:
        out = run("--s3", server.endpoint, env=server.environment)
    assert f"on {server.endpoint} as s3://images/" in out
    assert "wrote 320 PNGs of 4 classes as 8 webdataset shards" in out
    assert (
        "killed with SIGKILL after step 28 (epoch 1, batch 8 of 20, 2 workers); "
        "resuming from the checkpoint at step 25 with 0 workers\n"
    ) in out
    assert "steps compared:          40 (2 epochs of 20 batches), 15 of them after the resume\n" in out
    assert "identical batches:       40 of 40\n" in out
    assert "identical images:        40 of 40\n" in out
    assert "identical final weights: yes, bitwise\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    fetched = re.search(r"fetched from S3: +(\d+) bytes in (\d+) transfers for (\d+) bytes of shards", out)
    assert fetched is not None, out
    transferred, transfers, size = map(int, fetched.groups())
    # 8 shards for 2 runs, 3 processes and 4 workers: at most a count's scan and a copy of each, for the node.
    assert transfers <= 2 * 8
    assert size <= transferred <= 2 * size
