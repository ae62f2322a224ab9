"""The shipped LightningCLI configs: what they build, and the fresh-run and resume commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from stateful_sampler import StatefulSampler
from stateful_sampler.lightning import SamplerCheckpoint
from stateful_sampler.verify.lightning_cli.config import build_train_dataloader, load_cli

ROOT = Path(__file__).resolve().parents[2]
FRESH, RESUME = ROOT / "configs" / "digits.yaml", ROOT / "configs" / "resume.yaml"


def test_fresh_config_wires_sampler_callback_and_step_checkpoint() -> None:
    cli = load_cli(FRESH)
    [_sampler_checkpoint] = [callback for callback in cli.trainer.callbacks if isinstance(callback, SamplerCheckpoint)]
    [checkpoint] = cli.trainer.checkpoint_callbacks
    assert isinstance(checkpoint, ModelCheckpoint)
    assert (checkpoint._every_n_train_steps, checkpoint.save_last) == (20, True)
    loader = build_train_dataloader(FRESH)
    assert type(loader.sampler) is StatefulSampler
    assert (loader.sampler.size, loader.sampler.batch_size, loader.batch_size, loader.num_workers) == (1797, 32, 32, 2)
    (images, labels), keys = next(iter(loader))
    assert images.shape == (32, 64) and labels.shape == (32,)
    assert keys.index.tolist() == loader.sampler.indices(0)[:32].tolist()


def test_resume_config_only_adds_ckpt_path_last() -> None:
    assert yaml.safe_load(RESUME.read_text()) == {"ckpt_path": "last"}


@pytest.mark.slow
def test_fit_then_resume_commands(tmp_path: Path) -> None:
    def fit(*configs: Path, max_steps: int) -> str:
        arguments = [argument for config in configs for argument in ("--config", str(config))]
        done = subprocess.run(
            [sys.executable, "-m", "stateful_sampler.demo", "fit", *arguments, f"--trainer.max_steps={max_steps}"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    last = tmp_path / "runs" / "digits" / "checkpoints" / "last.ckpt"  # the config's relative dirpath
    fit(FRESH, max_steps=40)  # a checkpoint every 20 steps
    assert torch.load(last, weights_only=False)["global_step"] == 40
    resumed = fit(FRESH, RESUME, max_steps=60)
    assert f"Restoring states from the checkpoint path at {last}" in resumed
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["global_step"] == 60
    assert "SamplerCheckpoint" in checkpoint["callbacks"]
