"""examples/packed_lm.py: a tiny causal LM on packed rows, SIGKILLed mid-epoch with 2 loader workers and
resumed through ResumableLoader; the rows of every batch and the final weights must match bitwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_packed_lm_resumes_a_sigkilled_run_exactly() -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "packed_lm.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=environment, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "killed with SIGKILL after step 97 (exit -9); resuming from the checkpoint at step 90\n" in out
    steps = int(out.split("identical batches (rows and loss): ")[1].split(" of ")[0])
    assert f"identical batches (rows and loss): {steps} of {steps} (resumed run: {steps})\n" in out
    assert steps > 97
    assert "final weights bitwise identical: True\n" in out
