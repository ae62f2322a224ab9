"""Small variants of the shipped ``configs/digits.yaml`` for the verify, crash and config tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from stateful_sampler import KeyedDataset
from stateful_sampler.demo.datamodule import DigitsDataModule, NoisyDigits

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "configs" / "digits.yaml"
RECORDS = 1797  # scikit-learn's digits


def digits_config(
    directory: Path,
    name: str = "digits.yaml",
    *,
    max_epochs: int = 2,
    batch_size: int = 64,
    every_n_train_steps: int = 10,
    num_workers: int = 2,
    persistent_workers: bool = False,
    sampler_checkpoint: bool = True,
    data_class: str | None = None,
) -> Path:
    """The shipped config, made smaller: 2 epochs of ceil(1797 / 64) = 29 steps by default."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config["trainer"]["max_epochs"] = max_epochs
    callbacks = config["trainer"]["callbacks"]
    if not sampler_checkpoint:
        callbacks[:] = [callback for callback in callbacks if not callback["class_path"].endswith("SamplerCheckpoint")]
    for callback in callbacks:
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["every_n_train_steps"] = every_n_train_steps
    if data_class is not None:
        config["data"]["class_path"] = data_class
    data = config["data"]["init_args"]
    data.update(batch_size=batch_size, num_workers=num_workers, persistent_workers=persistent_workers)
    path = directory / name
    path.write_text(yaml.safe_dump(config))
    return path


class UnseededDigitsDataModule(DigitsDataModule):
    """A broken setup: keys (so batches carry indices) but no per-sample seeding, so augmentation
    comes from each worker's stream, which a resumed run restarts."""

    def setup(self, stage: str) -> None:
        self.dataset = KeyedDataset(NoisyDigits(self.noise))
