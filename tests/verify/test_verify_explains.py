"""verify explains its verdicts (issue 20, item 4; issue 17, item 8): a data-exact run whose weights
differ because the model's randomness was not restored says so; a script that breaks verify's
contract gets the real cause, in a plain script's terms; errors go to stderr, a failed run's log
outlives verify, a missing dependency exits 2, never 1; progress while it runs; ``--json``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stateful_sampler.verify.cli import EXIT_DIVERGED, EXIT_EQUAL, EXIT_RUN_FAILED, format_report, main, report_json
from stateful_sampler.verify.command import CommandLaunch
from stateful_sampler.verify.compare import compare_runs
from stateful_sampler.verify.recorder import BatchRecord, RunRecord
from stateful_sampler.verify.runner import raised_error

SCRIPT = str(Path(__file__).with_name("verify_command_script.py"))
COMMAND = [sys.executable, SCRIPT, "--root", "{run_dir}"]
# verify_command_script.py: 2 epochs of 12 steps on one process, a checkpoint every 5 steps.
KILL_AT, RESUMED_FROM, STEPS = 8, 5, 24
NOT_RESUMED = (
    "the loader's state was not restored. When the command runs again, it must load its last checkpoint from "
    "{run_dir} and pass the loader state saved there to loader.load_state_dict(...) of its ResumableLoader (not "
    "the sampler's drawn position), as it passes the model's and the optimizer's states to theirs"
)


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _verify(capsys: pytest.CaptureFixture, *arguments: str) -> tuple[int, str, str]:
    code = main(["--kill-at", str(KILL_AT), *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the model side: every batch identical, the weights not


@pytest.mark.slow
def test_verify_says_the_data_resumed_exactly_when_the_models_randomness_was_not_restored(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # A model with dropout; the resumed process reseeds torch after loading, as a fresh one would be.
    code, out, err = _verify(capsys, "--work-dir", str(tmp_path), "--", *COMMAND, "--dropout", "--forget-rng")
    assert code == EXIT_DIVERGED, err
    assert (
        f"batches compared: {STEPS} ({STEPS} steps x 1 rank(s)), identical to the uninterrupted run's: {STEPS}\n" in out
    )
    assert "first divergence" not in out
    assert (
        f"DIVERGED: the data resumed exactly; the model's randomness (dropout, ...) was not restored: from step "
        f"{RESUMED_FROM} (epoch 0, batch {RESUMED_FROM}), rank 0 the resumed run's RNG state (torch) is not "
        "the uninterrupted run's. Fix: restore the RNG states with the data: ResumableLoader and "
        "SamplerCheckpoint restore them by default (stateful_sampler.seeding.snapshot.restore_rng_states); a "
        "checkpoint of your own saves capture_rng_states() and calls restore_rng_states(saved) after loading it\n"
    ) in out
    assert re.search(r"\n  \(final weight '1\.weight' differs: max \|difference\| \S+\)$", out)


def _record(step: int, rng: str) -> BatchRecord:
    return BatchRecord(0, 0, step, step, f"f{step}", None, {"torch": rng, "random": f"unseeded-{rng}"})


def _run(steps: range, rngs: list[str], weight: float | None) -> RunRecord:
    weights = None if weight is None else {"w": torch.tensor([weight])}
    return RunRecord([_record(step, rngs[step]) for step in steps], [4], weights)


REFERENCE_RNG = [f"r{step}" for step in range(8)]


def test_compare_blames_the_optimizer_when_data_and_rng_states_resumed_exactly() -> None:
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), _run(range(6), REFERENCE_RNG, None),
                          _run(range(4, 8), REFERENCE_RNG, 2.0), kill_at=6)  # fmt: skip
    assert report.first_divergence is None
    assert report.weights_cause == (
        "the data and the RNG states resumed exactly, the weights did not: the model's or optimizer's state "
        "(momentum, an LR scheduler, a gradient scaler) was not restored from the checkpoint, or a kernel is "
        "not deterministic"
    )


def test_compare_leaves_out_an_rng_the_script_never_seeds() -> None:
    # Python's random differs between the two fresh runs: it says nothing about the resume.
    killed = _run(range(6), REFERENCE_RNG, None)
    killed.batches[:] = [replace(record, rng={**record.rng, "random": "other"}) for record in killed.batches]
    resumed = _run(range(4, 8), REFERENCE_RNG, 2.0)
    resumed.batches[:] = [replace(record, rng={**record.rng, "random": "third"}) for record in resumed.batches]
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), killed, resumed, kill_at=6)
    assert report.weights_cause is not None and report.weights_cause.startswith("the data and the RNG states resumed")
    resumed.batches[1] = replace(resumed.batches[1], rng={"torch": "not restored", "random": "third"})
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), killed, resumed, kill_at=6)
    assert report.weights_cause is not None and report.weights_cause.startswith(
        "the data resumed exactly; the model's randomness (dropout, ...) was not restored: from step 5 (epoch 0, "
        "batch 5), rank 0 the resumed run's RNG state (torch) is not the uninterrupted run's. Fix: "
    )


def test_compare_says_an_unseeded_training_differs_before_any_resume() -> None:
    unseeded = ["other", *REFERENCE_RNG[1:]]
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), _run(range(6), unseeded, None),
                          _run(range(4, 8), REFERENCE_RNG, 2.0), kill_at=6)  # fmt: skip
    assert report.weights_cause is not None
    assert report.weights_cause.startswith(
        "the data resumed exactly, but the runs do not start alike: at step 0 (epoch 0, batch 0), rank 0 the "
        "killed run's torch RNG state is not the uninterrupted run's, before any resume: seed the training"
    )


def test_the_json_of_an_equal_report_says_equal_with_exit_code_0() -> None:
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), _run(range(6), REFERENCE_RNG, None),
                          _run(range(4, 8), REFERENCE_RNG, 1.0), kill_at=6)  # fmt: skip
    assert report.equal, report.first_divergence
    found = json.loads(json.dumps(report_json(report)))
    assert (found["verdict"], found["exit_code"], found["kill_at"], found["resumed_from"]) == (
        "equal",
        EXIT_EQUAL,
        6,
        4,
    )


def test_compare_gives_no_model_cause_when_the_data_diverged() -> None:
    resumed = _run(range(4, 8), REFERENCE_RNG, 2.0)
    resumed.batches[0] = BatchRecord(0, 0, 4, 4, "other", None, "r4")
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), _run(range(6), REFERENCE_RNG, None), resumed, kill_at=6)
    assert report.first_divergence is not None and report.weights_cause is None


# -- a script that breaks verify's contract: the real cause


def test_a_command_that_does_not_restore_the_loader_is_told_so_in_whole_sentences() -> None:
    reference = _run(range(8), REFERENCE_RNG, 1.0)
    report = compare_runs(reference, _run(range(6), REFERENCE_RNG, None), _run(range(8), REFERENCE_RNG, 1.0),
                          kill_at=6, not_resumed=CommandLaunch.not_resumed)  # fmt: skip
    assert report.first_divergence == (
        "the resumed run started from the beginning (epoch 0, batch 0), not at the last checkpoint (step 4): "
        + NOT_RESUMED
    )


def test_the_report_says_what_the_identical_batches_are_identical_to() -> None:
    resumed = _run(range(4, 8), REFERENCE_RNG, 2.0)
    resumed.batches[1] = BatchRecord(0, 0, 5, 5, "other", None, {"torch": "r5"})
    report = compare_runs(_run(range(8), REFERENCE_RNG, 1.0), _run(range(6), REFERENCE_RNG, None), resumed, kill_at=6)
    lines = format_report(report).splitlines()
    assert lines[1] == (
        "batches compared: 8 (8 steps x 1 rank(s)), identical to the uninterrupted run's: 7, "
        "different or never trained on: 1"
    )
    assert lines[3].startswith("DIVERGED: first divergence at step 5 (epoch 0, batch 5), rank 0: the resumed run")


# A log as torchrun leaves it: each rank's traceback behind torch.distributed's "[rankN]:", then the
# launcher's own, which says only that a rank failed.
TORCHRUN_LOG = """\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "train.py", line 30, in <module>
[rank0]:   File "train.py", line 30, in <module>
[rank1]:     loader = accelerator.prepare(loader)
[rank0]:     loader = accelerator.prepare(loader)
[rank1]: stateful_sampler.errors.DoubleShardingError: accelerator.prepare(...) shards the sampler again
[rank0]: stateful_sampler.errors.DoubleShardingError: accelerator.prepare(...) shards the sampler again
E1202 07:40:10.508000 2832 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
"""


def test_the_error_a_rank_raised_is_found_behind_the_launchers_traceback() -> None:
    error = raised_error(TORCHRUN_LOG)
    assert error is not None
    assert error.exception == (
        "stateful_sampler.errors.DoubleShardingError: accelerator.prepare(...) shards the sampler again"
    )
    assert error.traceback == [
        "Traceback (most recent call last):",
        '  File "train.py", line 30, in <module>',
        "    loader = accelerator.prepare(loader)",
        "stateful_sampler.errors.DoubleShardingError: accelerator.prepare(...) shards the sampler again",
    ]


def test_of_a_chain_of_exceptions_the_last_raised_is_named_and_a_launchers_alone_is_not() -> None:
    chained = (
        "Traceback (most recent call last):\n  File 'a.py', line 1\nKeyError: 'seed'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  File 'a.py', line 3\nValueError: the config has no seed\n"
        "Traceback (most recent call last):\n  File 'accelerate/commands/launch.py', line 9\n"
        "subprocess.CalledProcessError: Command '['python', 'a.py']' returned non-zero exit status 1.\n"
    )
    error = raised_error(chained)
    assert error is not None and error.exception == "ValueError: the config has no seed"
    assert raised_error(chained[chained.index("Traceback (most recent call last):\n  File 'accelerate") :]) is None
    assert raised_error("no traceback here\n") is None


def test_verify_reports_the_error_a_launched_process_raised_not_the_launchers(capsys: pytest.CaptureFixture) -> None:
    # A launcher that prints its rank's traceback and fails with its own, as accelerate launch does.
    launcher = (
        "import subprocess, sys\n"
        f"sys.stderr.write({TORCHRUN_LOG.split('E1202')[0]!r})\n"
        "raise subprocess.CalledProcessError(1, ['python', 'train.py'])\n"
    )
    assert main(["--", sys.executable, "-c", launcher]) == EXIT_RUN_FAILED
    err = capsys.readouterr().err
    found = re.search(r"its traceback, from (\S+\.log):\n", err)
    assert found, err
    try:
        assert (
            "\nverify could not complete: the reference run exited with code 1: stateful_sampler.errors."
            "DoubleShardingError: accelerator.prepare(...) shards the sampler again\nits traceback, from "
        ) in err
        assert err.endswith(
            "its traceback, from " + found.group(1) + ":\nTraceback (most recent call last):\n"
            '  File "train.py", line 30, in <module>\n    loader = accelerator.prepare(loader)\n'
            "stateful_sampler.errors.DoubleShardingError: accelerator.prepare(...) shards the sampler again\n"
        )
        assert "CalledProcessError" in Path(found.group(1)).read_text()  # the log keeps it all
    finally:
        shutil.rmtree(Path(found.group(1)).parents[1])


@pytest.mark.slow
def test_verify_of_a_torchrun_command_reports_the_ranks_error(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from stateful_sampler.errors import DoubleShardingError\n"
        "dist.init_process_group('gloo')\n"
        "raise DoubleShardingError(f'rank {dist.get_rank()} of {dist.get_world_size()}: sharded twice')\n"
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{devices}"]
    code, out, err = _verify(capsys, "--devices", "2", "--work-dir", str(tmp_path / "work"), "--", *torchrun,
                             str(script))  # fmt: skip
    assert (code, out) == (EXIT_RUN_FAILED, "")
    first = next(line for line in err.splitlines() if line.startswith("verify could not complete"))
    assert re.fullmatch(
        r"verify could not complete: the reference run exited with code 1: stateful_sampler\.errors\."
        r"DoubleShardingError: rank [01] of 2: sharded twice",
        first,
    ), err
    assert "ChildFailedError" not in err


@pytest.mark.slow
def test_verify_names_a_script_whose_batches_pass_through_no_resumable_loader(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = _verify(capsys, "--work-dir", str(tmp_path), "--", *COMMAND, "--plain-loader")
    assert (code, out) == (EXIT_RUN_FAILED, "")
    assert err.splitlines()[-1] == (
        "verify could not complete: the uninterrupted run recorded no batch: verify records the batches a "
        "ResumableLoader hands to the training loop (or Lightning's, with SamplerCheckpoint in the Trainer's "
        "callbacks) and the command's batches passed through neither: iterate loader = ResumableLoader("
        "DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B)), in a process that inherits "
        f"verify's environment (its output: {tmp_path / 'reference' / 'reference.log'})"
    )
    assert not (tmp_path / "crash" / "killed.log").exists()  # refused after the first run


@pytest.mark.slow
def test_verify_names_a_script_that_records_no_weights(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = _verify(capsys, "--work-dir", str(tmp_path), "--", *COMMAND, "--no-record-weights")
    assert (code, out) == (EXIT_RUN_FAILED, "")
    assert err.splitlines()[-1] == (
        "verify could not complete: the uninterrupted run recorded no final weights: call "
        "stateful_sampler.verify.record_weights(model) once after training (on every rank or on rank 0; "
        f"Lightning with SamplerCheckpoint records them by itself) (its output: {tmp_path / 'reference' / 'reference.log'})"
    )


@pytest.mark.slow
def test_verify_json_names_a_script_that_does_not_restore_the_loader_state(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # The model is loaded, the loader not: the resumed run starts the data over.
    code, out, err = _verify(capsys, "--json", "--work-dir", str(tmp_path), "--", *COMMAND, "--forget-loader")
    assert code == EXIT_DIVERGED, err
    report = json.loads(out)
    assert (report["verdict"], report["exit_code"], report["kill_at"], report["resumed_from"]) == (
        "diverged", EXIT_DIVERGED, KILL_AT, RESUMED_FROM)  # fmt: skip
    assert report["first_divergence"] == (
        f"the resumed run started from the beginning (epoch 0, batch 0), not at the last checkpoint (step "
        f"{RESUMED_FROM}): {NOT_RESUMED}"
    )
    assert "ckpt_path" not in out


@pytest.mark.slow
def test_verify_names_a_script_that_checkpoints_into_a_fixed_path(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # Every run shares tmp_path/fixed: the killed run, a fresh start, resumes from the reference's last checkpoint.
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    command = [sys.executable, SCRIPT, "--root", str(fixed)]
    code, out, err = _verify(capsys, "--work-dir", str(tmp_path / "work"), "--", *command)
    assert (code, out) == (EXIT_RUN_FAILED, "")
    assert err.splitlines()[-1] == (
        "verify could not complete: the killed run, a fresh start, began at epoch 1, batch 8 on rank 0, where "
        "the uninterrupted run began at epoch 0, batch 0: it resumed from a checkpoint another run left. Each "
        "run must keep its checkpoints in the directory verify gives it: write {run_dir} in the command where "
        "it takes its checkpoint directory (verify also sets STATEFUL_SAMPLER_RUN_DIR), not a fixed path"
    )


# -- what verify leaves, prints and returns


def test_a_failed_runs_log_that_verify_names_exists_after_it_exits(capsys: pytest.CaptureFixture) -> None:
    failing = [sys.executable, "-c", "import sys; print('the training broke'); sys.exit(3)"]
    assert main(["--", *failing]) == EXIT_RUN_FAILED
    captured = capsys.readouterr()
    assert captured.out == ""
    found = re.search(
        r"the reference run exited with code 3; last lines of (\S+\.log):\nthe training broke\n", captured.err
    )
    assert found, captured.err
    log = Path(found.group(1))
    try:
        assert log.read_text() == "the training broke\n"
        assert f"work directory kept, with the runs' logs: {log.parents[1]}\n" in captured.err
    finally:
        shutil.rmtree(log.parents[1])


@pytest.mark.slow  # a subprocess: a module made missing stays missing
def test_a_missing_dependency_exits_2_with_the_extra_to_install(tmp_path: Path) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text("trainer: {max_epochs: 1}\n")
    # verify imports yaml, then lightning: lightning missing first, then yaml too (each the first one missing).
    program = (
        "import sys\n"
        "from stateful_sampler.verify.cli import main\n"
        "for module in ('lightning', 'yaml'):\n"
        "    sys.modules[module] = None  # as if it were not installed\n"
        f"    print(module, main(['--config', {str(config)!r}]), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=os.environ.copy(), check=False
    )
    assert (done.returncode, done.stdout) == (0, f"lightning {EXIT_RUN_FAILED}\nyaml {EXIT_RUN_FAILED}\n"), done.stderr
    reasons = done.stderr.splitlines()
    assert len(reasons) == 2, done.stderr
    for module, reason in zip(("lightning", "yaml"), reasons):
        assert reason.startswith("verify could not complete: a module verify needs is not installed ("), reason
        assert reason.endswith("): pip install 'stateful-sampler[lightning]'")
        assert module in reason.split("(", 1)[1].split(")")[0]  # the module that is missing, not the one before


def test_an_unexpected_error_inside_verify_exits_2_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr("stateful_sampler.verify.cli.check_resume", broken)
    assert main(["--", sys.executable, "-c", "pass"]) == EXIT_RUN_FAILED
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.splitlines()[-1] == "verify could not complete: unexpected KeyError: 'oops'"


def test_help_shows_the_per_run_timeout_and_json(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--timeout SECONDS seconds allowed for each of the three runs (default: 600)" in help_text
    assert "--json print the report as one JSON object on stdout" in help_text
    assert "exit codes: 0 equal, 1 diverged, 2 could not run" in help_text
