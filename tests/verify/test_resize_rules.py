"""The rules of ``verify --resize`` on records made by hand (fast): the elastic rules decide, exact
batches are checked at the world size kept, the report says which rule held; and the command line
refuses a resize it cannot run, naming the flag."""

from __future__ import annotations

import re
import sys
from dataclasses import replace

import pytest

from stateful_sampler.verify.cli import EXIT_RUN_FAILED, format_resize, main, resize_json
from stateful_sampler.verify.errors import TrainingRunError
from stateful_sampler.verify.recorder import BatchRecord, RunRecord
from stateful_sampler.verify.resize import NO_KEYS, compare_resized

# One epoch of 16 records, 2 a rank per step: 2 steps at world size 4, 4 at world size 2. The global
# order is 0..15; rank r's j-th record of a step sits at the step's position j * W + r.
RECORDS, BATCH = 16, 2


def _run(world: int, start: int, stop: int, *, checkpoints: tuple[int, ...] = (), offset: int = 0) -> RunRecord:
    """Steps ``start``..``stop`` (batch places) of one epoch at ``world`` ranks, recorded from step
    ``offset`` as a process counts them, rank by rank."""
    batches = []
    for rank in range(world):
        for number, place in enumerate(range(start, stop)):
            indices = [place * world * BATCH + j * world + rank for j in range(BATCH)]
            batches.append(BatchRecord(rank, 0, place, offset + number, f"f{indices}", indices))
    return RunRecord(batches, list(checkpoints), None)


REFERENCE = _run(4, 0, 2, checkpoints=(1,))


def test_a_resume_at_another_world_size_from_the_checkpoint_holds_the_global_order() -> None:
    killed = _run(4, 0, 2, checkpoints=(1,))  # killed after step 2: retrains nothing at world size 4
    resumed = _run(2, 2, 4)  # from the checkpoint at step 1: records 8..15, 4 a step
    report = compare_resized(REFERENCE, [killed, resumed], (4, 2), [1])
    assert report.equal and report.global_order and report.rule == "global order"
    assert (report.exact_compared, report.exact_identical, report.records) == (8, 8, 16)
    assert report.steps_per_rank == ((0, 2),)
    assert report.resumed_froms == ("step 1 (epoch 0, record 8 of 16, world size 2)",)
    assert resize_json(report) == {
        "verdict": "equal", "exit_code": 0, "rule": "global order", "sizes": [4, 2], "kill_steps": [1],
        "resumed_froms": ["step 1 (epoch 0, record 8 of 16, world size 2)"], "exact_compared": 8,
        "exact_identical": 8, "retrained": 0, "records": 16, "epochs": 1, "steps_per_rank": {0: 2},
        "global_order": True, "first_divergence": None, "resume_problem": None,
    }  # fmt: skip
    assert format_resize(report).splitlines()[-1] == (
        "EQUAL (global order rule): resumed at world size 2, every epoch trained on the uninterrupted run's "
        "records, each once, with the same steps on every rank"
    )


def test_a_resume_at_a_larger_world_size_holds_the_global_order_too() -> None:
    reference = _run(2, 0, 4, checkpoints=(2,))  # 4 steps at world size 2
    killed = _run(2, 0, 3, checkpoints=(2,))  # killed after step 3; its checkpoint at step 2 is record 8
    report = compare_resized(reference, [killed, _run(4, 1, 2)], (2, 4), [3])
    assert report.equal and report.rule == "global order"
    assert report.resumed_froms == ("step 2 (epoch 0, record 8 of 16, world size 4)",)
    assert report.steps_per_rank == ((0, 1),)


def test_the_same_records_in_another_order_hold_the_multiset_rule_only() -> None:
    resumed = _run(2, 2, 4)
    swapped = [*resumed.batches[2:], *resumed.batches[:2]]  # rank 1's steps recorded as rank 0's
    swapped = [BatchRecord(1 - b.rank, b.epoch, b.batch_idx, b.step, b.fingerprint, b.indices) for b in swapped]
    report = compare_resized(REFERENCE, [_run(4, 0, 2, checkpoints=(1,)), RunRecord(swapped, [], None)], (4, 2), [1])
    assert report.equal and not report.global_order and report.rule == "multiset"


def test_a_resume_that_starts_the_epoch_over_names_the_records_trained_twice() -> None:
    killed = _run(4, 0, 2, checkpoints=(1,))
    resumed = _run(2, 0, 4)  # the loader state not restored: the whole epoch again
    report = compare_resized(REFERENCE, [killed, resumed], (4, 2), [1])
    assert not report.equal
    assert report.first_divergence == (
        "step 1 (epoch 0, batch 0 at world size 2), rank 0: records [0, 2] trained on a second time in "
        "epoch 0 (first at step 0)"
    )
    assert report.resume_problem == (
        "step 1, where the run killed after step 1 resumes at world size 2: the resumed run started at epoch 0, "
        "record 0, not at the last checkpoint (epoch 0, record 8): the run did not resume from it"
    )
    assert "DIVERGED: at step 1, where the run killed after step 1 resumes" in format_resize(report)


def test_records_lost_and_unequal_steps_are_named() -> None:
    killed = _run(4, 0, 2, checkpoints=(1,))
    resumed = _run(2, 2, 4)
    short = RunRecord([b for b in resumed.batches if not (b.rank == 1 and b.batch_idx == 3)], [], None)
    report = compare_resized(REFERENCE, [killed, short], (4, 2), [1])
    assert report.first_divergence == "epoch 0 at world size 2: the ranks trained unequal steps (rank 0: 2, rank 1: 1)"
    lost = compare_resized(REFERENCE, [killed, _run(2, 2, 3)], (4, 2), [1])
    assert lost.first_divergence == "epoch 0: records [12, 13, 14, 15] (4 of 16) never trained on"


def test_a_killed_batch_at_the_kept_world_size_must_be_the_uninterrupted_runs() -> None:
    killed = _run(4, 0, 2, checkpoints=(1,))
    wrong = BatchRecord(2, 0, 0, 0, "other", [2, 6])
    killed = RunRecord([wrong if b.key == wrong.key else b for b in killed.batches], [1], None)
    report = compare_resized(REFERENCE, [killed, _run(2, 2, 4)], (4, 2), [1])
    assert report.exact_identical == 7
    assert report.first_divergence is not None
    assert report.first_divergence.startswith(
        "step 0 (epoch 0, batch 0), rank 2: the killed run trained on another batch than the uninterrupted run\n"
    )


def test_batches_without_keys_are_compared_by_their_rows_fingerprints() -> None:
    def by_rows(run: RunRecord) -> RunRecord:
        batches = [replace(b, indices=None, rows=[f"row{index}" for index in b.indices or ()]) for b in run.batches]
        return replace(run, batches=batches)

    killed = by_rows(_run(4, 0, 2, checkpoints=(1,)))
    report = compare_resized(by_rows(REFERENCE), [killed, by_rows(_run(2, 2, 4))], (4, 2), [1])
    assert report.equal and report.rule == "global order"
    again = compare_resized(by_rows(REFERENCE), [killed, by_rows(_run(2, 0, 4))], (4, 2), [1])
    assert again.first_divergence == (
        "step 1 (epoch 0, batch 0 at world size 2), rank 0: records [row0, row2] trained on a second time in "
        "epoch 0 (first at step 0)"
    )


def test_batches_without_keys_cannot_be_compared() -> None:
    plain = RunRecord([BatchRecord(0, 0, 0, 0, "f", None)], [], None)
    with pytest.raises(TrainingRunError, match=f"^{re.escape(NO_KEYS)}$"):
        compare_resized(plain, [plain, plain], (2, 1), [1])


COMMAND = [sys.executable, "train.py", "--root", "{run_dir}"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--resize", "4"], "argument --resize: expected two world sizes above 0 as A:B, e.g. 4:2, got '4'"),
        (["--resize", "0:2"], "argument --resize: expected two world sizes above 0 as A:B, e.g. 4:2, got '0:2'"),
        (
            ["--resize", "4:2", "--config", "x.yaml"],
            "--resize resumes a command at another world size: give -- COMMAND with {devices} in it",
        ),
        (["--resize", "4:2", "--devices", "2", "--", *COMMAND], "--resize A:B sets the world sizes: drop --devices"),
    ],
    ids=["no-colon", "zero", "config", "devices"],
)
def test_verify_refuses_a_resize_it_cannot_run(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"stateful-sampler verify: error: {message}"


def test_verify_refuses_a_resize_of_a_command_without_devices(capsys: pytest.CaptureFixture) -> None:
    assert main(["--resize", "4:2", "--", *COMMAND]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err == (
        "verify could not complete: resize (--resize): the command has no {devices} to put the world sizes 4 and 2 "
        "in; write it where the command takes its process count, e.g. torchrun --nproc-per-node {devices} ...\n"
    )
