"""``stateful-sampler audit`` end to end, in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.audit.cli import main

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "stateful_sampler.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_the_table_names_the_figures_of_the_padded_epoch():
    result = run_cli(
        "--size",
        "10",
        "--world-size",
        "3",
        "--batch-size",
        "3",
        "--tail",
        "pad",
        "--epochs",
        "1",
        "--seed",
        "0",
        "--no-shuffle",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("epoch")))
    assert lines[header].split() == [
        "epoch",
        "fed",
        "distinct",
        "padding",
        "repeated",
        "cut:tail",
        "cut:batch",
        "unseen",
        "steps",
        "last",
        "batch",
    ]
    assert lines[header + 1].split() == ["0", "12", "10", "2", "2", "0", "0", "0", "2", "1", "1", "1", "(size", "1!)"]
    assert "  epoch 0: repeated: 0 x2 (1 padding), 1 x2 (1 padding)" in lines
    assert any("batch of 1 sample on rank(s) 0, 1, 2" in line and "BatchNorm" in line for line in lines)


@pytest.mark.slow  # a subprocess
def test_json_output_is_the_report_and_lightning_is_never_imported():
    code = (
        "import sys; from stateful_sampler.cli import main; "
        "code = main(['audit', '--size', '10', '--world-size', '3', '--batch-size', '3', '--tail', 'drop', "
        "'--drop-last', '--epochs', '2', '--seed', '4', '--json']); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')], 'lightning'; "
        "sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [epoch["occurrences"] for epoch in data["epochs"]] == [9, 9]
    assert [len(epoch["dropped_by_tail"]) for epoch in data["epochs"]] == [1, 1]
    assert data["settings"] == {
        "size": 10,
        "world_size": 3,
        "seed": 4,
        "shuffle": True,
        "tail": "drop",
        "order": "fast",
        "sampler_batch_size": 3,
        "batch_size": 3,
        "drop_last": True,
        "num_workers": 0,
        "start_epoch": 0,
        "epochs": 2,
        "strategy": "uniform",
    }


@pytest.mark.slow  # a subprocess imports matplotlib
def test_the_console_script_writes_a_png(tmp_path):
    script = Path(sys.executable).with_name("stateful-sampler")
    picture = tmp_path / "audit.png"
    result = subprocess.run(
        [
            str(script),
            "audit",
            "--size",
            "300",
            "--world-size",
            "2",
            "--batch-size",
            "8",
            "--tail",
            "pad",
            "--epochs",
            "4",
            "--seed",
            "1",
            "--plot",
            str(picture),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert picture.stat().st_size > 10_000 and picture.read_bytes()[:8] == PNG_SIGNATURE
    assert f"wrote {picture}" in result.stderr


def test_more_ranks_than_records_under_drop_exits_non_zero_with_the_message():
    result = run_cli("--size", "2", "--world-size", "3", "--batch-size", "1", "--tail", "drop")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(
        "stateful-sampler audit: error: tail='drop' with 2 records on num_replicas=3 ranks would drop every record"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "10", "--batch-size", "0"], "batch_size must be at least 1"),  # the limit is the sampler's
        (["--batch-size", "4"], "--size is required (or --labels FILE.npy, or --config CONFIG.yaml)"),
        (
            ["--size", "10", "--world-size", "0", "--batch-size", "1"],
            "world_size must be at least 1 and at most 65536, got 0",
        ),
        (["--size", "10", "--batch-size", "2", "--epochs", "0"], "epochs must be at least 1, got 0"),
        (["--size", "10", "--batch-size", "2", "--num-workers", "-1"], "num_workers must be at least 0, got -1"),
        (["--size", "10", "--batch-size", "2", "--config", "missing.yaml"], "--size cannot be combined with --config"),
    ],
)
def test_bad_input_returns_non_zero_with_the_message(args, message, capsys):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"stateful-sampler audit: error: {message}")


def test_a_million_ranks_exit_2_naming_world_size_and_the_limit(capsys):
    assert main(["--size", "10", "--batch-size", "1", "--world-size", str(10**6)]) == 2
    message = "stateful-sampler audit: error: world_size must be at least 1 and at most 65536, got 1000000\n"
    assert capsys.readouterr() == ("", message)


def test_epochs_beyond_the_rank_epoch_limit_exit_2_naming_the_limit(capsys):
    assert main(["--size", "0", "--batch-size", "1", "--epochs", str(10**9)]) == 2
    assert capsys.readouterr() == (
        "",
        (
            "stateful-sampler audit: error: epochs=1000000000 on world_size=1 ranks is 1000000000 rank-epochs, more than "
            "the 65536 the audit computes per call: audit fewer epochs per call (start_epoch picks them)\n"
        ),
    )


def test_an_unknown_tail_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--size", "10", "--batch-size", "2", "--tail", "wrap"])
    assert exited.value.code == 2 and "argument --tail: invalid choice: 'wrap'" in capsys.readouterr().err


# -- --config: the classes a LightningCLI config names (run_cli puts the repository on PYTHONPATH)


class AuditedData(LightningDataModule):
    def __init__(self, size: int = 10, batch_size: int = 3, seed: int = 0, tail: str = "pad", drop_last: bool = False):
        super().__init__()
        self.size, self.batch_size, self.seed, self.tail, self.drop_last = size, batch_size, seed, tail, drop_last

    def train_dataloader(self) -> DataLoader:
        sampler = StatefulSampler(self.size, seed=self.seed, tail=self.tail, batch_size=self.batch_size)
        return DataLoader(
            torch.arange(self.size), sampler=sampler, batch_size=self.batch_size, drop_last=self.drop_last
        )


class TinyModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)


CONFIG = """\
trainer:
  logger: false
  enable_checkpointing: false
model:
  class_path: tests.audit.test_audit_cli.TinyModel
data:
  class_path: tests.audit.test_audit_cli.AuditedData
  init_args:
    size: 9
    batch_size: 4
    seed: 3
"""


@pytest.mark.slow
def test_config_audits_the_train_loader_of_a_lightning_cli_config(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    result = run_cli("--config", str(config), "--world-size", "2", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["settings"] == {
        "size": 9,
        "world_size": 2,
        "seed": 3,
        "shuffle": True,
        "tail": "pad",
        "order": "fast",
        "sampler_batch_size": 4,
        "batch_size": 4,
        "drop_last": False,
        "num_workers": 0,
        "start_epoch": 0,
        "epochs": 1,
        "strategy": "uniform",
    }
    # 9 records on 2 ranks pad to 10: 5 per rank, batches of 4 and 1.
    assert [rank["last_batch_size"] for rank in data["epochs"][0]["ranks"]] == [1, 1]
    assert data["epochs"][0]["occurrences"] == 10 and data["epochs"][0]["distinct"] == 9
    clash = run_cli("--config", str(config), "--size", "5", cwd=tmp_path)
    assert clash.returncode == 2
    assert (
        clash.stderr
        == "stateful-sampler audit: error: --size cannot be combined with --config: the config defines the sampler\n"
    )


# -- a config that cannot be audited: exit 2 and a message, never a traceback (issue 9, item 10)


def _config_error(tmp_path: Path, capsys, text: str, *arguments: str) -> tuple[Path, str]:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert main(["--config", str(config), *arguments]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return config, err.splitlines()[-1]


def test_a_config_that_is_not_yaml_exits_2_naming_the_problem(tmp_path, capsys):
    config, message = _config_error(tmp_path, capsys, "trainer: [unclosed\n  logger: false\n")
    assert message == (
        f"stateful-sampler audit: error: config: '{config}' is not valid YAML: expected ',' or ']', but got ':' "
        "at line 2, column 9"
    )


def test_a_config_without_a_model_exits_2_naming_the_missing_key(tmp_path, capsys):
    without_model = CONFIG.replace("model:\n  class_path: tests.audit.test_audit_cli.TinyModel\n", "")
    config, message = _config_error(tmp_path, capsys, without_model)
    assert message == f"stateful-sampler audit: error: config '{config}': the following arguments are required: model"


def test_a_config_naming_a_missing_class_exits_2_with_one_line(tmp_path, capsys):
    config, message = _config_error(tmp_path, capsys, CONFIG.replace("TinyModel", "NoSuchModel"))
    assert message == (
        f"stateful-sampler audit: error: config '{config}': model: class_path 'tests.audit.test_audit_cli.NoSuchModel' "
        "cannot be used: module 'tests.audit.test_audit_cli' has no attribute 'NoSuchModel'"
    )


def test_a_start_epoch_of_10_to_the_20_exits_2_naming_the_last_epoch(tmp_path, capsys):
    _, message = _config_error(tmp_path, capsys, CONFIG, "--start-epoch", str(10**20))
    last = ((1 << 63) - 1 - 9 - 1) // 9  # the config's 9 records on 1 rank
    assert message == (
        f"stateful-sampler audit: error: start_epoch={10**20} with epochs=1 reaches epoch {10**20}, past the last "
        f"epoch {last} whose stream positions (epoch * size) fit in int64 for size=9"
    )
