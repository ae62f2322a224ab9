"""``stateful-sampler verify -- COMMAND``: any training script that meets the contract is verified
without an edit, killed for real (under torchrun, every rank in its own session too), and a
broken one is caught at its first divergent step."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stateful_sampler.testing import assert_resume_equal
from stateful_sampler.verify.cli import EXIT_EQUAL, EXIT_RUN_FAILED, main
from stateful_sampler.verify.process_tree import descendants, kill_tree
from stateful_sampler.verify.resume_check import check_resume

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
def test_verify_of_a_command_passes_on_a_script_that_resumes_exactly(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    arguments = ["--kill-at", str(KILL_AT), "--work-dir", str(tmp_path / "work"), "--", *COMMAND]
    assert main(arguments) == EXIT_EQUAL
    out = capsys.readouterr().out
    assert f"killed after step {KILL_AT}; resumed from the checkpoint at step {RESUMED_FROM}\n" in out
    assert (
        f"batches compared: {STEPS} ({STEPS} steps x 1 rank(s)), identical to the uninterrupted run's: {STEPS}\n" in out
    )
    assert "EQUAL: the killed and resumed run trained on exactly the batches" in out
    for run in ("reference", "crash"):  # {run_dir} became each run's own directory
        assert (tmp_path / "work" / run / "last.pt").is_file()


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
    example = str(Path(__file__).parents[1] / "examples" / "lightning_train.py")
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
