"""examples/parquet_stream.py from s3:// on a real local S3 server: killed, resumed, identical, and
every shard downloaded once for both runs and their workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.s3_server import s3_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_parquet_stream_example_runs_from_s3_and_resumes_identically() -> None:
    with s3_server() as server:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "parquet_stream.py"), "--s3", server.endpoint],
            check=False, capture_output=True, text=True, timeout=600, cwd=ROOT,
            env={**os.environ, **server.environment, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"on {server.endpoint} as s3://digits/" in out
    assert "identical batches:       114 of 114 (record ids, in order)\n" in out
    assert "identical final weights: yes, bitwise\n" in out
    assert "verdict:                 IDENTICAL\n" in out
    fetched = re.search(r"fetched from S3: +(\d+) bytes in (\d+) transfers for (\d+) bytes of shards", out)
    assert fetched is not None, out
    transferred, transfers, size = map(int, fetched.groups())
    assert transfers == 2 * 64  # 64 footers, then 64 shards, once for the node
    assert size <= transferred <= 2 * size
