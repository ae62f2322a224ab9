"""Real DDP: 2 processes, gloo on CPU, ``strategy="ddp"`` with ``use_distributed_sampler`` left on.

Lightning must leave the loader and its ``StatefulSampler`` in place, each rank's record must hold
its tail policy's coverage contract, and every rank resumed from a checkpoint must see exactly the
batches of the uninterrupted run (issue 3, "What must hold" 5 and 6 under DDP).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler import StatefulSampler
from tests.helpers import run_ranks
from tests.lightning.ddp_callback_run import CASES

SCRIPT = Path(__file__).with_name("ddp_callback_run.py")
RANKS = 2


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Runs both ranks once for every case; returns each tail's per-rank reports."""
    out = tmp_path_factory.mktemp("ddp")
    # Each rank's process group takes its DataLoader workers down with it on a hang.
    run_ranks([sys.executable, str(SCRIPT), str(out)], RANKS, SCRIPT.parents[2], timeout=300,
              rank_variable="LOCAL_RANK", env={"NODE_RANK": "0"})  # fmt: skip
    return {tail: [json.loads((out / f"{tail}_rank{r}.json").read_text()) for r in range(RANKS)] for tail in CASES}


def _epoch_occurrences(ranks: list[dict[str, Any]], epoch: int, field: str = "record") -> list[Any]:
    """Everything the ranks saw in ``epoch``, all ranks together."""
    return [
        item
        for report in ranks
        for step_epoch, batch in zip(report["epochs"], report[field])
        if step_epoch == epoch
        for item in batch
    ]


@pytest.mark.slow
@pytest.mark.parametrize("tail", CASES)
def test_lightning_keeps_the_loader_and_the_sampler_on_every_rank(tail: str, reports: dict) -> None:
    for rank, report in enumerate(reports[tail]):
        assert (report["rank"], report["world_size"]) == (rank, RANKS)
        assert report["loader_kept"] is True
        assert report["sampler_type"] == "StatefulSampler"
        assert report["sampler_replicas"] == [RANKS, rank]


@pytest.mark.slow
@pytest.mark.parametrize("tail", CASES)
def test_every_rank_resumes_to_exactly_the_uninterrupted_batches(tail: str, reports: dict) -> None:
    expected = {
        "pad": {"batch4", "epoch0"},
        "pad-workers2": {"batch4", "batch9"},
        "drop": {"batch7"},
        "carry": {"batch7", "batch12", "epoch0"},
    }[tail]
    for report in reports[tail]:
        assert set(report["resumed"]) == expected
        for name, record in report["resumed"].items():
            assert record == report["record"], f"rank {report['rank']} resumed from {name}"


@pytest.mark.slow
def test_pad_covers_every_record_each_epoch_and_marks_the_repeat(reports: dict) -> None:
    ranks = reports["pad"]
    for epoch in range(2):
        seen = _epoch_occurrences(ranks, epoch)
        padding = _epoch_occurrences(ranks, epoch, "padding")
        assert len(seen) == 22 and set(seen) == set(range(21))
        real = [index for index, pad in zip(seen, padding) if not pad]
        assert sorted(real) == list(range(21))  # each record once; the 22nd slot is marked
        assert padding.count(True) == 1


@pytest.mark.slow
def test_drop_leaves_out_exactly_the_reported_record_each_epoch(reports: dict) -> None:
    ranks = reports["drop"]
    assert ranks[0]["dropped"] == ranks[1]["dropped"]
    for epoch in range(2):
        seen = _epoch_occurrences(ranks, epoch)
        assert len(seen) == len(set(seen)) == 20
        assert sorted(seen + ranks[0]["dropped"][epoch]) == list(range(21))


@pytest.mark.slow
def test_carry_keeps_epochs_whole_and_sees_each_record_once_a_pass_minus_the_final_remainder(reports: dict) -> None:
    """3 epochs of 19 records in global batches of 4: 4, 5 and 5 steps, 56 = 3*19 - 1 occurrences;
    the one left over is the last record of the third pass's permutation."""
    setup = CASES["carry"][0]
    ranks = reports["carry"]
    for report in ranks:
        assert [report["epochs"].count(epoch) for epoch in range(3)] == [4, 5, 5]
    seen = [index for report in ranks for batch in report["record"] for index in batch]
    third_pass = StatefulSampler(setup.size, seed=setup.seed, tail="uneven").indices(epoch=2).tolist()
    assert Counter(seen) == Counter({index: 3 for index in range(19)}) - Counter(third_pass[-1:])


@pytest.mark.slow
def test_a_model_with_dropout_resumes_bitwise_on_every_rank_with_its_own_rng_states(reports: dict) -> None:
    """Issue 17, item 8, under DDP: "pad" has dropout and each rank its own torch RNG stream; SamplerCheckpoint
    gathers every rank's RNG states into the checkpoint rank 0 writes, and gives each rank its own back."""
    for report in reports["pad"]:
        assert set(report["resumed_weights"]) == {"batch4", "epoch0"}
        for name, weights in report["resumed_weights"].items():
            assert weights == report["weights"], f"rank {report['rank']} resumed from {name}"
