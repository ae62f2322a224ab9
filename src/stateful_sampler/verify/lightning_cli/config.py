"""Load a user's LightningCLI YAML config without training, so tools can inspect what it builds.

The config is parsed by a plain ``LightningCLI`` (``run=False``) in subclass mode, so any
``model: {class_path: ...}`` and ``data: {class_path: ...}`` the user wrote is instantiated exactly
as ``fit --config`` would instantiate it. A config that cannot be read or parsed raises
``ConfigError`` with a one-line reason, so the command-line tools can say "could not run" in a line.
"""

from __future__ import annotations

import re
from argparse import ArgumentError
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader

from stateful_sampler.verify.errors import ConfigError

# jsonargparse words a class that cannot be imported as this line, followed by the reason.
_CLASS_PATH_PROBLEM = re.compile(r"Problem with given class_path '([^']*)':\s*\n\s*(\S[^\n]*)")
_PARSER_KEY = re.compile(r'^Parser key "([^"]*)"')


def read_config(config_path: str | Path) -> dict[str, Any]:
    """The config's YAML as a dict: ``FileNotFoundError`` when there is no file, ``ConfigError`` for
    invalid YAML or a top level that is not a mapping."""
    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no LightningCLI YAML config at {str(path)!r}")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"config: {str(path)!r} is not valid YAML: {_yaml_problem(error)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"config: {str(path)!r} must hold a mapping of LightningCLI keys, got {kind}")
    return loaded


def parse_problem(error: ArgumentError) -> str:
    """LightningCLI's (jsonargparse's) parse error as one line that names the key, without the usage text."""
    message = str(error)
    key = _PARSER_KEY.match(message)
    found = _CLASS_PATH_PROBLEM.search(message)
    if found:
        problem = f"class_path {found.group(1)!r} cannot be used: {found.group(2).strip()}"
    else:
        problem = " ".join(line.strip() for line in message.splitlines() if line.strip())
        problem = problem.removeprefix(f'Parser key "{key.group(1)}": ') if key else problem
    return f"{key.group(1)}: {problem}" if key else problem


def load_cli(config_path: str | Path, overrides: Sequence[str] = ()) -> LightningCLI:
    """Instantiate the trainer, model and datamodule of a fresh-run config (one without ``ckpt_path``).

    ``overrides`` are extra command-line style arguments, e.g. ``["--data.init_args.num_workers=0"]``.
    """
    read_config(config_path)
    try:
        return LightningCLI(
            args=["--config", str(config_path), *overrides],
            run=False,
            save_config_callback=None,
            parser_kwargs={"exit_on_error": False},
        )
    except ArgumentError as error:
        raise ConfigError(f"config {str(config_path)!r}: {parse_problem(error)}") from None


def build_train_dataloader(config_path: str | Path, overrides: Sequence[str] = ()) -> DataLoader:
    """The train dataloader a config's ``fit`` would use, built the way Lightning builds it:
    ``prepare_data`` and ``setup("fit")`` on the datamodule, then ``train_dataloader()``."""
    cli = load_cli(config_path, overrides)
    source = cli.datamodule if cli.datamodule is not None else cli.model
    source.prepare_data()
    source.setup("fit")
    return source.train_dataloader()


def _yaml_problem(error: yaml.YAMLError) -> str:
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
