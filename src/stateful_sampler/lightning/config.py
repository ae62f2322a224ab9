"""Load a user's LightningCLI YAML config without training, so tools can inspect what it builds.

The config is parsed by a plain ``LightningCLI`` (``run=False``) in subclass mode, so any
``model: {class_path: ...}`` and ``data: {class_path: ...}`` the user wrote is instantiated exactly
as ``fit --config`` would instantiate it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader


def load_cli(config_path: str | Path, overrides: Sequence[str] = ()) -> LightningCLI:
    """Instantiate the trainer, model and datamodule of a fresh-run config (one without ``ckpt_path``).

    ``overrides`` are extra command-line style arguments, e.g. ``["--data.init_args.num_workers=0"]``.
    """
    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"config_path: no LightningCLI YAML config at {str(path)!r}")
    return LightningCLI(
        args=["--config", str(path), *overrides],
        run=False,
        save_config_callback=None,
        parser_kwargs={"exit_on_error": False},
    )


def build_train_dataloader(config_path: str | Path, overrides: Sequence[str] = ()) -> DataLoader:
    """The train dataloader a config's ``fit`` would use, built the way Lightning builds it:
    ``prepare_data`` and ``setup("fit")`` on the datamodule, then ``train_dataloader()``."""
    cli = load_cli(config_path, overrides)
    source = cli.datamodule if cli.datamodule is not None else cli.model
    source.prepare_data()
    source.setup("fit")
    return source.train_dataloader()
