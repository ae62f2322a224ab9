"""``stateful-sampler verify -- COMMAND``: any training script that meets the contract is verified
without an edit, killed for real (under torchrun, every rank in its own session too), and a
broken one is caught at its first divergent step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stateful_sampler.testing import assert_resume_equal
from stateful_sampler.verify.cli import EXIT_DIVERGED, EXIT_EQUAL, EXIT_RUN_FAILED, main
from stateful_sampler.verify.process_tree import descendants, kill_tree
from stateful_sampler.verify.recorder import BatchRecord, RunRecord, rank_path
from stateful_sampler.verify.resume_check import check_resume, draw_kill_steps
from stateful_sampler.verify.runner import StepWatch

SCRIPT = str(Path(__file__).with_name("verify_command_script.py"))
COMMAND = [sys.executable, SCRIPT, "--root", "{run_dir}"]
# verify_command_script.py: 2 epochs of 12 steps on one process, a checkpoint every 5 steps.
KILL_AT, RESUMED_FROM, STEPS = 8, 5, 24
GRACE_SECONDS = 60.0  # a bound on the polls, not a wait


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training subprocesses of a 5-parameter model run faster on one thread than two fighting."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _living_with(text: str) -> list[int]:
    """Processes, zombies excepted, whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            cmdline = (entry / "cmdline").read_bytes() if stat else b""
        except OSError:
            continue
        if stat and stat[stat.rindex(")") + 2] != "Z" and text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _poll_gone(text: str) -> None:
    deadline = time.monotonic() + GRACE_SECONDS
    while survivors := _living_with(text):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of the run still alive: {survivors}")
        time.sleep(0.05)


@pytest.mark.slow
def test_verify_of_a_command_passes_on_a_script_that_resumes_exactly_and_reports_its_phases_on_stderr(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stateful_sampler.verify.runner.PROGRESS_SECONDS", 0.0)  # every step seen is reported
    work = tmp_path / "work"
    arguments = ["--kill-at", str(KILL_AT), "--work-dir", str(work), "--", *COMMAND]
    assert main(arguments) == EXIT_EQUAL
    captured = capsys.readouterr()
    out = captured.out
    assert f"killed after step {KILL_AT}; resumed from the checkpoint at step {RESUMED_FROM}\n" in out
    assert (
        f"batches compared: {STEPS} ({STEPS} steps x 1 rank(s)), identical to the uninterrupted run's: {STEPS}\n" in out
    )
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in out
    for run in ("reference", "crash"):  # {run_dir} became each run's own directory
        assert (work / run / "last.pt").is_file()
    lines = captured.err.splitlines()
    phases = [line for line in lines if not line.startswith("  ")]
    assert phases == [
        f"work directory: {work}",
        "uninterrupted run ...",
        f"run killed with SIGKILL after step {KILL_AT} ...",
        f"run resumed from the last checkpoint (step {RESUMED_FROM}) ...",
    ]
    assert f"  reference run: finished, {STEPS} steps on rank 0" in lines
    assert f"  killed run: every rank paused after step {KILL_AT}, killed with SIGKILL" in lines
    # how many progress lines a run of a few seconds gets depends on the polls' timing (none is possible):
    # test_a_step_watch_reports_each_new_step_it_reads pins them down
    reached = [int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("  reference run: step ")]
    assert reached == sorted(reached) and set(reached) <= set(range(1, STEPS + 1))


def test_a_step_watch_reports_each_new_step_it_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress a run reports: the step its rank-0 record reached, read as the record grows (a line cut
    in two by a write is read whole at the next poll), and the count at the end."""
    monkeypatch.setattr("stateful_sampler.verify.runner.PROGRESS_SECONDS", 0.0)
    heard: list[str] = []
    watch = StepWatch(tmp_path / "reference", "reference", heard.append)
    watch.poll()  # no record yet
    path = rank_path(tmp_path / "reference", 0)
    lines = [json.dumps({"kind": "batch", "step": step}) + "\n" for step in range(3)]
    path.write_text(lines[0] + lines[1][:5])
    watch.poll()
    with path.open("a") as record:
        record.write(lines[1][5:] + lines[2])
    watch.poll()
    watch.poll()  # nothing new: the same step again
    watch.finished()
    assert heard == ["  reference run: step 1", "  reference run: step 3", "  reference run: step 3",
                     "  reference run: finished, 3 steps on rank 0"]  # fmt: skip


@pytest.mark.slow
def test_assert_resume_equal_catches_a_script_that_saves_the_drawn_position(tmp_path: Path, one_thread: None) -> None:
    # Two workers prefetch 4 batches: the saved drawn position skips batches the model never saw.
    with pytest.raises(AssertionError) as raised:
        assert_resume_equal([*COMMAND, "--drawn-position"], kill_at=KILL_AT)
    message = str(raised.value)
    assert (
        f"DIVERGED: first divergence at step {KILL_AT} (epoch 0, batch {KILL_AT}), rank 0: "
        f"neither the killed nor the resumed run trained on this batch\n"
    ) in message
    assert "DIVERGED: final weight 'weight' differs" in message


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the run's processes in /proc")
def test_verify_kills_every_torchrun_rank_and_worker_and_the_resumed_ddp_run_is_equal(
    tmp_path: Path, one_thread: None
) -> None:
    # torchrun starts each rank in a session of its own: a process-group kill would miss them.
    crash_dir = str(tmp_path / "crash")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{devices}"]
    command = [*torchrun, SCRIPT, "--root", "{run_dir}", "--ddp", "--every", "3"]

    def progress(message: str) -> None:
        if message.startswith("run resumed"):  # the killed run is dead, the resumed one not started
            _poll_gone(crash_dir)

    report = check_resume(command, kill_at=4, devices=2, work_dir=tmp_path, progress=progress)
    assert report.equal, report.first_divergence
    assert (report.kill_at, report.resumed_from, report.ranks, report.batches_compared) == (4, 3, 2, 24)


@pytest.mark.slow
def test_a_lightning_script_is_recorded_by_sampler_checkpoint_without_an_edit(tmp_path: Path, one_thread: None) -> None:
    # examples/lightning_train.py calls no record_weights: SamplerCheckpoint records batches,
    # checkpoints (every 20 steps) and the final weights when verify runs it.
    example = str(Path(__file__).parents[2] / "examples" / "lightning_train.py")
    command = [sys.executable, example, "--root", "{run_dir}", "--max-epochs", "1", "--num-workers", "0"]
    report = check_resume(command, kill_at=25, work_dir=tmp_path)
    assert report.equal, report.first_divergence
    # 1797 digits in batches of 32: 57 steps
    assert (report.kill_at, report.resumed_from, report.batches_compared) == (25, 20, 57)
    assert report.reference.checkpoint_steps == [20, 40]


def test_kill_tree_reaches_a_grandchild_in_a_session_of_its_own() -> None:
    program = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
    )
    root = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, start_new_session=True)
    grandchild = int(root.stdout.readline())
    assert descendants(root.pid) == {root.pid, grandchild}
    kill_tree(root.pid)
    assert root.wait(timeout=GRACE_SECONDS) == -9
    deadline = time.monotonic() + GRACE_SECONDS
    while _state(grandchild) not in ("gone", "Z"):
        assert time.monotonic() < deadline, f"grandchild {grandchild} survived"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def test_the_guard_kills_what_its_command_leaves_running() -> None:
    program = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
    )
    guard = [sys.executable, "-m", "stateful_sampler.verify.guard", sys.executable, "-c", program]
    finished = subprocess.run(guard, capture_output=True, text=True, timeout=GRACE_SECONDS, check=False)
    assert finished.returncode == 0
    orphan = int(finished.stdout)
    deadline = time.monotonic() + GRACE_SECONDS
    while _state(orphan) not in ("gone", "Z"):
        assert time.monotonic() < deadline, f"the command's orphan {orphan} survived the guard"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--", sys.executable, SCRIPT], None),
        (["--config", "x.yaml", "--", "python"], "give either --config CONFIG or -- COMMAND ..., not both or neither"),
        ([], "give either --config CONFIG or -- COMMAND ..., not both or neither"),
        (["--"], "no command after --"),
    ],
    ids=["devices-placeholder", "both", "neither", "empty"],
)
def test_verify_refuses_a_command_line_it_cannot_run(
    arguments: list[str], message: str | None, capsys: pytest.CaptureFixture
) -> None:
    if message is None:  # --devices with no {devices} in the command: a reason, exit code 2
        assert main(["--devices", "2", *arguments]) == EXIT_RUN_FAILED
        assert capsys.readouterr().err == (
            "verify could not complete: devices: the command has no {devices} to put 2 in; write it where the "
            "command takes its process count, e.g. torchrun --nproc-per-node {devices} ...\n"
        )
        return
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"stateful-sampler verify: error: {message}"


def test_assert_resume_equal_refuses_a_command_that_is_not_a_list_of_str() -> None:
    with pytest.raises(TypeError, match=r"^command must be a non-empty list of str, got \['python', 3\]$"):
        assert_resume_equal(["python", 3])  # type: ignore[list-item]


# --kills 3 with --kill-seed 0 on verify_command_script.py: steps drawn in epoch 1 (12 steps there, all
# after the first checkpoint), each resumed from the checkpoint every 5 steps left.
KILLS, KILL_STEPS, RESUMED_FROMS = 3, "12, 18, 23", "10, 15, 20"


@pytest.mark.slow
def test_verify_kills_three_times_and_each_resume_is_equal(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    arguments = ["--kills", str(KILLS), "--work-dir", str(tmp_path / "work"), "--", *COMMAND]
    assert main(arguments) == EXIT_EQUAL
    captured = capsys.readouterr()
    assert f"{KILLS} kills, at steps {KILL_STEPS} (--kill-seed 0)\n" in captured.err
    assert (
        f"killed {KILLS} times, after steps {KILL_STEPS}; resumed each time from the last checkpoint, "
        f"at steps {RESUMED_FROMS}\n"
    ) in captured.out
    assert f"identical to the uninterrupted run's: {STEPS}\n" in captured.out
    assert "EQUAL: " in captured.out
    for number in (1, 2, 3):  # every kill was a real SIGKILL of a run started for it
        assert (tmp_path / "work" / "crash" / f"killed{number}.log").is_file()


@pytest.mark.slow
def test_verify_kills_three_times_catches_a_resume_that_forgets_the_loader(
    one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--kills", str(KILLS), "--", *COMMAND, "--forget-loader"]) == EXIT_DIVERGED
    out = capsys.readouterr().out
    assert (
        "DIVERGED: first divergence at step 10, where the run killed after step 12 resumes: the resumed run "
        "started from the beginning (epoch 0, batch 0), not at the last checkpoint (step 10): the loader's "
        "state was not restored."
    ) in out
    assert "DIVERGED: final weight 'weight' differs" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--kills", "0"], "kills (--kills) must be at least 1, got 0"),
        (["--kills", "-2"], "kills (--kills) must be at least 1, got -2"),
        (
            ["--kills", "2", "--kill-at", "8"],
            "kill_at (--kill-at) is for one kill; with kills (--kills) 2 the steps are drawn",
        ),
        (["--kills", "2", "--kill-seed", "-1"], "kill_seed (--kill-seed) must be at least 0, got -1"),
    ],
    ids=["zero", "negative", "with-kill-at", "seed"],
)
def test_verify_refuses_a_kill_count_before_running(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main([*arguments, "--", sys.executable, SCRIPT]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err == f"verify could not complete: {message}\n"


def test_more_kills_than_steps_of_one_epoch_are_refused_naming_the_range() -> None:
    reference = RunRecord([BatchRecord(0, step // 4, step % 4, step, "f", None) for step in range(8)], [2], None)
    assert draw_kill_steps(reference, 8, 2, 4, seed=0) == [4, 5, 6, 7]  # epoch 1: all 4 steps after step 2
    assert draw_kill_steps(reference, 8, 2, 2, seed=5) == draw_kill_steps(reference, 8, 2, 2, seed=5)
    with pytest.raises(ValueError, match=r"^kills \(--kills\) must be between 1 and 4: the steps of one epoch "
                       r"at or after the first checkpoint \(step 2\) that the run reaches, got 5$"):  # fmt: skip
        draw_kill_steps(reference, 8, 2, 5, seed=0)
