"""Lightning with ``SamplerCheckpoint`` over a ``ShardedStream`` in a ``LightningDataModule``: a fit stopped
by ``max_steps`` resumes exactly in-process, and 2 DDP processes with 2 workers each, SIGKILLed
mid-epoch, resume exactly on both ranks, each the stream's order for its rank
(tests/stream/stream_lightning_fit.py, the README's pattern)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def launch(root: Path, workers: int, devices: int, kill_at: int = 0) -> int:
    """The fit as its own process group (Lightning starts rank 1 in it), killed whole on a hang."""
    command = [
        sys.executable,
        "-m",
        "tests.stream.stream_lightning_run",
        str(root),
        str(workers),
        str(devices),
        str(kill_at),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)  # fmt: skip
    try:
        output = process.communicate(timeout=600)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == (-9 if kill_at else 0), output[-4000:]
    return process.returncode


def steps(root: Path, rank: int) -> list[dict]:
    """The steps of a run, a resumed run's records replacing the killed run's from the step it resumed at."""
    lines = [json.loads(line) for line in (root / f"rank{rank}.jsonl").read_text().splitlines()]
    restarts = [i for i in range(1, len(lines)) if lines[i]["step"] <= lines[i - 1]["step"]]
    if not restarts:
        return lines
    resumed = lines[restarts[0] :]
    return [line for line in lines[: restarts[0]] if line["step"] < resumed[0]["step"]] + resumed


def uninterrupted(rank: int, world_size: int) -> list[dict]:
    """The steps an uninterrupted fit records on ``rank``: the stream's epochs, iterated here."""
    from tests.stream.stream_lightning_run import EPOCHS, make_stream

    stream, lines = make_stream(num_replicas=world_size, rank=rank), []
    for epoch in range(EPOCHS):
        stream.set_epoch(epoch)
        for batch in stream.loader():
            lines.append({"step": len(lines), "epoch": epoch, "ids": batch[:, 0].int().tolist()})
    return lines


@pytest.mark.slow
def test_lightning_ddp_on_a_stream_killed_mid_epoch_resumes_exactly_with_2_workers(tmp_path: Path) -> None:
    launch(tmp_path, workers=2, devices=2, kill_at=13)  # epoch 1, step 3 of 10; last checkpoint at step 12
    assert (tmp_path / "last.ckpt").exists() and len((tmp_path / "rank0.jsonl").read_text().splitlines()) == 13
    launch(tmp_path, workers=2, devices=2)
    for rank in range(2):
        expected = uninterrupted(rank, world_size=2)
        assert [line["step"] for line in expected] == list(range(20))
        assert steps(tmp_path, rank) == expected
    ids = [i for rank in range(2) for line in uninterrupted(rank, 2) if line["epoch"] == 0 for i in line["ids"]]
    assert len(ids) == 40 and len(set(ids)) == 39  # every record once, one marked repeat evens out the ranks


def test_lightning_on_a_stream_stopped_by_max_steps_resumes_exactly_in_process(tmp_path: Path) -> None:
    from tests.stream.stream_lightning_fit import stopped_and_resumed

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    stopped_and_resumed(whole, cut)
    expected = steps(whole, 0)
    assert len(expected) == 40 and [line["step"] for line in expected] == list(range(40))
    assert [line for line in steps(cut, 0)] == expected


def test_lightning_on_a_plain_dataloader_over_a_stream_stops_with_the_streams_error(tmp_path: Path) -> None:
    """Refused at the first batch. Lightning's teardown then fails in turn ("Please call iter(combined_loader)
    first", its clean-up after any error inside iter(loader)), so the stream's error is the one it chains."""
    from lightning.pytorch import Trainer
    from torch.utils.data import DataLoader

    from stateful_sampler.lightning import SamplerCheckpoint
    from stateful_sampler.stream import StreamSetupError
    from tests.stream.stream_lightning_fit import Recording, StreamData

    class PlainLoader(StreamData):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(super().train_dataloader().dataset, batch_size=2)

    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, callbacks=[SamplerCheckpoint()],
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.raises(Exception) as raised:
        trainer.fit(Recording(tmp_path), PlainLoader(workers=0))
    error = raised.value if isinstance(raised.value, StreamSetupError) else raised.value.__context__
    assert isinstance(error, StreamSetupError) and "build it with stream.loader(" in str(error)


def test_lightning_resuming_a_stream_without_sampler_checkpoint_is_refused(tmp_path: Path) -> None:
    """Without the callback nothing would put the stream at the saved position (Lightning sets no epoch on an
    iterable dataset): the loader state Lightning saved refuses to load, naming SamplerCheckpoint."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from stateful_sampler.stream import StreamSetupError
    from tests.stream.stream_lightning_fit import Recording, StreamData

    def fit(max_steps: int, ckpt_path: str | None = None) -> None:
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, max_steps=max_steps, logger=False,
                          callbacks=[ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=1)],
                          enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(Recording(tmp_path), StreamData(workers=0), ckpt_path=ckpt_path)

    fit(max_steps=7)
    with pytest.raises(Exception) as raised:
        fit(max_steps=-1, ckpt_path=str(tmp_path / "last.ckpt"))
    error = raised.value if isinstance(raised.value, StreamSetupError) else raised.value.__context__
    assert isinstance(error, StreamSetupError) and "add SamplerCheckpoint() to the Trainer's callbacks" in str(error)
