"""Stratified (balanced) under real DDP: 2 gloo processes with 2 DataLoader workers each stop mid-epoch,
and 2 new processes resume from rank 0's state to exactly the batches of an uninterrupted run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_ranks

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("strategy_ddp_run.py")


def test_two_processes_resume_balanced_draws_mid_epoch_to_the_uninterrupted_batches(tmp_path: Path) -> None:
    """Balanced passes (70 draws of 45 records) repeat the minority's records: positions, not records, resume."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    run = lambda out, name, *stop: run_ranks([sys.executable, str(SCRIPT), "stratified", str(out), name, *stop],
                                             2, SCRIPT.parents[2], timeout=180)  # fmt: skip
    run(whole, "whole")
    run(cut, "before", "5")  # 5 of the first epoch's steps
    run(cut, "after")
    read = lambda out, name, rank: json.loads((out / f"{name}_rank{rank}.json").read_text())
    for rank in (0, 1):
        assert len(read(cut, "before", rank)) == 5
        assert read(cut, "before", rank) + read(cut, "after", rank) == read(whole, "whole", rank)
