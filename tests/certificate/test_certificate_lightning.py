"""The certificate of a real Lightning ``Trainer`` with ``SamplerCheckpoint``, switched on by the environment
alone: a run SIGKILLed twice and resumed from ``last.ckpt`` trained on the data of the uninterrupted run; one
restarted without its checkpoint (the data position not restored) did not, and compare names where."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from stateful_sampler.certificate import compare, read_run
from stateful_sampler.certificate.cli import main
from stateful_sampler.certificate.format import rank_files

pytest.importorskip("lightning")

SCRIPT = Path(__file__).with_name("lightning_run.py")
ROOT = Path(__file__).resolve().parents[2]


def launch(certificate: Path, directory: Path, kill_at: int = 0, resume: bool = True) -> None:
    environment = {**os.environ, "STATEFUL_SAMPLER_CERTIFICATE": str(certificate), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(directory), str(kill_at), "1" if resume else "0"],
        env=environment, cwd=ROOT, capture_output=True, text=True, timeout=180, start_new_session=True, check=False,
    )  # fmt: skip
    expected = -signal.SIGKILL if kill_at else 0
    assert result.returncode == expected, result.stdout[-3000:] + result.stderr[-3000:]


def certificate_compare(first: Path, second: Path) -> tuple[int, str]:
    """``stateful-sampler certificate compare``'s exit code and output, in this process (test_certificate_kills.py
    runs the command in a process of its own)."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["compare", str(first), str(second)])
    return code, out.getvalue()


@pytest.mark.slow
def test_a_killed_and_resumed_fit_certifies_the_uninterrupted_data(tmp_path: Path) -> None:
    plain = tmp_path / "plain.cert"
    launch(plain, tmp_path / "plain")
    assert len(read_run(plain).steps) == 20  # 2 epochs of 10 train steps; no validation step

    killed, directory = tmp_path / "killed.cert", tmp_path / "killed"
    launch(killed, directory, kill_at=5)  # last.ckpt after step 3: steps 3 and 4 are trained again
    broken, broken_directory = tmp_path / "broken.cert", tmp_path / "broken"
    shutil.copytree(directory, broken_directory)
    for path in rank_files(killed):
        shutil.copy(path, broken.with_name(path.name.replace(killed.name, broken.name)))
    launch(killed, directory, kill_at=13)  # resumed at step 3; last.ckpt after step 12 (epoch 1, position 8)
    launch(killed, directory)  # resumed at step 12
    run = read_run(killed)
    assert [(start["start_step"], start["restored"]) for start in run.starts] == [(0, False), (3, True), (12, True)]
    comparison = compare(read_run(plain), run)
    assert (comparison.code, comparison.rule) == (0, "step by step"), comparison.report()
    code, out = certificate_compare(plain, killed)
    assert code == 0, out
    assert "EQUAL: the same data step by step (20 steps)" in out.splitlines(), out
    assert "2 resumes, world size 1" in out

    launch(broken, broken_directory, resume=False)  # the fit starts again; the data position is not restored
    code, out = certificate_compare(plain, broken)
    assert code == 1, out
    lines = out.splitlines()
    assert "DIFFERENT: first at step 3 (epoch 0)" in lines, out
    plain_records = read_run(plain).steps[3].records()
    broken_records = read_run(broken).steps[3].records()
    assert broken_records == read_run(plain).steps[0].records() != plain_records
    assert f"  plain.cert: step 3, epoch 0, positions [12, 16), world size 1: records {plain_records}" in lines
    assert f"  broken.cert: step 3, epoch 0, positions [0, 4), world size 1: records {broken_records}" in lines


@pytest.mark.slow
def test_a_fit_over_a_stream_stopped_and_resumed_certifies_the_uninterrupted_data(tmp_path: Path) -> None:
    """``SamplerCheckpoint`` over a ``ShardedStream`` (the README's ``LightningDataModule``), in this process: each
    step's records are the stream's global records the step trained on, and a fit stopped by ``max_steps`` mid-epoch
    and exactly at an epoch's end, then resumed from ``last.ckpt``, certifies the uninterrupted fit's data."""
    import json

    from stateful_sampler.certificate import record_certificate, stop_certificate
    from tests.stream.stream_lightning_fit import stopped_and_resumed
    from tests.stream.stream_lightning_run import COUNTS

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()

    def certify_the_cut_run() -> None:  # after the uninterrupted fit: the stopped fits and their resumes
        stop_certificate()
        record_certificate(cut / "run.cert")

    try:  # one certificate for each run, of the fits in this process
        record_certificate(whole / "run.cert")
        stopped_and_resumed(whole, cut, between=certify_the_cut_run)
    finally:
        stop_certificate()
    uninterrupted = read_run(whole / "run.cert")
    trained = [json.loads(line)["ids"] for line in (whole / "rank0.jsonl").read_text().splitlines()]
    # the certificate names a record by its place in the shards concatenated; the fit's ids are 100 * shard + row
    ids = [100 * shard + row for shard, count in enumerate(COUNTS) for row in range(count)]
    assert len(uninterrupted.steps) == len(trained) == 40
    assert [[ids[record] for record in step.records()] for step in uninterrupted.steps] == trained
    comparison = compare(uninterrupted, read_run(cut / "run.cert"))
    assert (comparison.code, comparison.rule) == (0, "step by step"), comparison.report()
