"""How verify runs a LightningCLI config: ``recorded_fit`` under ``fit``, resumed with ``ckpt_path=last``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from stateful_sampler.verify.lightning_cli.config import read_config
from stateful_sampler.verify.recorder import RunRecord

DEFAULT_SEED = 0  # used when the config leaves seed_everything random or off


@dataclass(frozen=True)
class LightningCLILaunch:
    config: Path  # a LightningCLI config for fit; the runner sets ckpt_path itself
    seed: int  # passed as seed_everything, so every run starts from the same weights
    devices: int | None  # overrides trainer.devices when set
    timeout: float  # seconds per run
    needs_checkpoint_records: bool = True  # the recorder sees every checkpoint Lightning saves
    no_batches: ClassVar[str] = "check trainer.max_steps, max_epochs and limit_train_batches in the config"
    no_weights: ClassVar[str] = "the fit did not reach on_train_end"
    not_resumed: ClassVar[str] = (
        "Lightning did not resume from last.ckpt in the run's directory (verify passes ckpt_path='last' and "
        "redirects every ModelCheckpoint there)"
    )
    shared_checkpoints: ClassVar[str] = "it resumed from a checkpoint verify did not give it (ckpt_path in the config?)"

    @classmethod
    def checked(
        cls, config: Path, devices: int | None, timeout: float, progress: Callable[[str], None]
    ) -> LightningCLILaunch:
        return cls(config.resolve(), config_seed(config, progress), devices, timeout)

    def describe(self) -> str:
        return str(self.config)

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        command = [
            sys.executable, "-m", "stateful_sampler.verify.lightning_cli.recorded_fit", "fit",
            "--config", str(self.config),
            f"--seed_everything={self.seed}",
            f"--trainer.default_root_dir={run_dir}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.deterministic=true",
        ]  # fmt: skip
        if self.devices is not None:
            command.append(f"--trainer.devices={self.devices}")
        command.append("--ckpt_path=last" if resume else "--ckpt_path=null")  # a fresh run starts fresh
        return command

    def settle(self, reference: RunRecord, killed: RunRecord, resumed: RunRecord) -> tuple[RunRecord, RunRecord]:
        return killed, resumed  # Lightning's global_step already counts from the checkpoint


def config_seed(config: str | Path, progress: Callable[[str], None]) -> int:
    """The config's ``seed_everything`` when it is an int: both runs must start from the same weights."""
    seed = read_config(config).get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    progress(f"seed_everything is {seed!r} in the config; every run uses seed_everything={DEFAULT_SEED}")
    return DEFAULT_SEED
