"""The command line as a user meets it: ``--version``, ``python -m stateful_sampler``, help written
for users, audit's required flags, ``audit --config`` run from the user's directory without noise
our own call causes, the estimate before a long audit, and the demo's shipped configs (issue 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stateful_sampler import __version__
from stateful_sampler.audit import AuditConfig, audit, cost
from stateful_sampler.audit import cli as audit_cli
from stateful_sampler.cli import main
from stateful_sampler.demo import shipped_config
from stateful_sampler.demo.__main__ import main as demo_main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_written_once_and_the_command_prints_it(capsys):
    project = (ROOT / "pyproject.toml").read_text()  # as text: tomllib is Python 3.11+
    assert '\nversion = "' not in project and '\ndynamic = ["version"]' in project
    assert '\nversion = { attr = "stateful_sampler.__version__" }\n' in project
    assert __version__ == "0.3.0"
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out == "stateful-sampler 0.3.0\n"


@pytest.mark.slow  # subprocesses
def test_python_m_stateful_sampler_is_the_command():
    result = subprocess.run([sys.executable, "-m", "stateful_sampler", "--version"],
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (0, f"stateful-sampler {__version__}\n", "")
    bare = subprocess.run(
        [sys.executable, "-m", "stateful_sampler"], capture_output=True, text=True, timeout=120, check=False
    )
    assert bare.returncode == 2 and bare.stderr.splitlines()[-1] == (
        "stateful-sampler: error: the following arguments are required: COMMAND"
    )


def test_help_says_what_each_command_does_not_how_the_module_is_built(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "imported only" not in text and "``" not in text  # not the module docstring
    words = " ".join(text.split())
    assert "audit report what each epoch really feeds the model: coverage, padding, cut records" in words
    assert "verify prove that a killed and resumed run trains on exactly the batches of an uninterrupted" in words
    assert "Run 'stateful-sampler COMMAND --help' for a command's options." in text


def test_audit_help_marks_the_required_flags(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    text = capsys.readouterr().out
    assert text.startswith(
        "usage: \n"
        "  stateful-sampler audit (--size N | --labels FILE.npy) --batch-size B [--world-size W] [options]\n"
        "  stateful-sampler audit --config CONFIG.yaml [--world-size W] [options]\n"
    )
    words = " ".join(text.split())  # the wrapping follows the terminal's width
    assert "--size N records in the dataset (required, unless --labels gives one entry per record)" in words
    assert "--batch-size B per-rank batch of the loader (required; with --config: the loader's)" in words
    assert "``" not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "10"], "--batch-size is required: the loader's per-rank batch (or --config CONFIG.yaml)"),
        (["--batch-size", "4"], "--size is required (or --labels FILE.npy, or --config CONFIG.yaml)"),
    ],
)
def test_a_missing_required_flag_is_named_as_the_flag(args, message, capsys):
    assert main(["audit", *args]) == 2
    assert capsys.readouterr().err == f"stateful-sampler audit: error: {message}\n"


USER_DATAMODULE = """
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from stateful_sampler import StatefulSampler

class SmallData(LightningDataModule):
    def train_dataloader(self):
        return DataLoader(list(range(37)), sampler=StatefulSampler(37, batch_size=5), batch_size=5)
"""
USER_CONFIG = """\
model:
  class_path: stateful_sampler.demo.model.DigitsClassifier
data:
  class_path: user_audit_datamodule.SmallData
trainer:
  logger: false
  enable_checkpointing: false
"""


def test_audit_config_imports_the_users_modules_from_the_current_directory(tmp_path, monkeypatch, capsys):
    """As ``python -m`` (and ``verify --config``) would; the console script's sys.path starts at its bin/."""
    (tmp_path / "user_audit_datamodule.py").write_text(USER_DATAMODULE)
    (tmp_path / "config.yaml").write_text(USER_CONFIG)
    monkeypatch.chdir(tmp_path)
    console_path = [entry for entry in sys.path if entry not in ("", str(tmp_path))]
    monkeypatch.setattr(sys, "path", console_path)
    monkeypatch.delitem(sys.modules, "user_audit_datamodule", raising=False)
    assert main(["audit", "--config", "config.yaml", "--world-size", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["size"] == 37 and report["settings"]["batch_size"] == 5
    assert [epoch["occurrences"] for epoch in report["epochs"]] == [38]  # 37 padded to 2 x 19
    assert sys.path == console_path  # the directory was on the path for the config only
    sys.modules.pop("user_audit_datamodule", None)


@pytest.mark.slow  # a subprocess audits the shipped config
def test_audit_of_the_shipped_config_prints_the_report_and_nothing_else(tmp_path):
    """No LightningCLI warning about our own ``args`` beside ``sys.argv``, no seed, GPU/TPU or logger
    banner from the Trainer the config builds: run as the console script runs (``-P``: no cwd on sys.path)."""
    (tmp_path / "digits.yaml").write_text(shipped_config())
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-P", "-m", "stateful_sampler", "audit", "--config", "digits.yaml", "--world-size", "2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("Coverage audit: 1797 records on 2 rank(s), strategy=uniform, tail=pad")


def test_the_estimate_of_the_largest_audit_names_its_measured_time_and_memory():
    assert cost.estimate(cost.ANNOUNCE_ABOVE) is None
    assert cost.estimate(10**8) == (
        "auditing 100,000,000 occurrences: about 96 s and 5.4 GiB of memory on 2 cores "
        "(fewer epochs per call, with --start-epoch, audit in parts)"
    )
    assert cost.estimate(10**9).startswith("auditing 1,000,000,000 occurrences: about 16 min and 54.0 GiB")


class Counted(Exception):
    pass


def test_audit_says_how_many_occurrences_it_will_feed_before_any_work():
    seen = []

    def before(occurrences: int) -> None:
        seen.append(occurrences)
        raise Counted

    with pytest.raises(Counted):
        audit(AuditConfig(size=10, world_size=3), batch_size=2, epochs=3, before=before)
    assert seen == [36]  # 3 epochs of 10 records padded to 12 slots


def test_a_long_audit_prints_its_estimate_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(cost, "ANNOUNCE_ABOVE", 20)
    assert audit_cli.main(["--size", "10", "--world-size", "3", "--batch-size", "2", "--epochs", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("stateful-sampler audit: auditing 24 occurrences: about 0 s and 0.0 GiB")
    assert captured.out.startswith("Coverage audit: 10 records on 3 rank(s)")


def test_the_demo_prints_its_shipped_configs(capsys):
    assert demo_main(["--shipped-config"]) == 0
    assert capsys.readouterr().out == (ROOT / "configs" / "digits.yaml").read_text()
    assert demo_main(["--shipped-config", "resume"]) == 0
    assert capsys.readouterr().out == (ROOT / "configs" / "resume.yaml").read_text()
    assert demo_main(["--shipped-config", "other"]) == 2
    assert capsys.readouterr().err == "usage: python -m stateful_sampler.demo --shipped-config [digits|resume]\n"


def test_the_demos_old_flag_still_prints_the_config_and_names_the_new_one(capsys):
    # --print-config read too much like LightningCLI's own --print_config (a run's resolved config).
    assert demo_main(["--print-config", "resume"]) == 0
    captured = capsys.readouterr()
    assert captured.out == (ROOT / "configs" / "resume.yaml").read_text()
    assert captured.err == (
        "note: --print-config is now --shipped-config (LightningCLI's own --print_config prints a run's resolved "
        "config: fit --config FILE --print_config)\n"
    )
