"""The release as a user gets it (issue 20, "Done when"): ``python -m build`` makes a wheel and an
sdist that pass ``twine check``; the wheel, installed into a fresh virtualenv (torch first) in a
directory outside the checkout, runs there the README's quick start, the Lightning example,
``stateful-sampler audit --config`` on the shipped config, ``verify -- COMMAND`` and ``--version``.

The virtualenv is new (no ``--system-site-packages``), so nothing the checkout or the shared venv
holds can stand in for a file the wheel forgot. torch comes from the pinned CPU wheel, as in the
Makefile; everything else from what the wheel's metadata declares.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from stateful_sampler import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the Makefile's pin: the CPU build, so pip does not resolve a CUDA one
NAME = f"stateful_sampler-{__version__}"
TINY_TRAINING = '''
"""verify's contract for a command: batches through a ResumableLoader, checkpoints in --root, record_weights."""
import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.verify import record_weights

parser = argparse.ArgumentParser()
parser.add_argument("--root", type=Path, required=True)
root = parser.parse_args().root
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(48, 4, generator=generator), torch.randn(48, 1, generator=generator))
loader = ResumableLoader(DataLoader(data, sampler=StatefulSampler(data, seed=3, batch_size=8), batch_size=8))
torch.manual_seed(1)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
checkpoint = root / "last.pt"
if checkpoint.exists():
    saved = torch.load(checkpoint)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    loader.load_state_dict(saved["loader"])
for epoch in range(loader.epoch, 2):
    loader.set_epoch(epoch)
    for step, (inputs, targets) in enumerate(loader, 1):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        if step % 2 == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
            torch.save(state, checkpoint)
record_weights(model)
'''
QUICK_START_PRELUDE = """
import torch
dataset, epochs, path = list(range(3200)), 1, "quick_start.pt"   # 100 batches of 32: one save at step 100
model = torch.nn.Linear(1, 1)
consumed = []
def train_step(batch):
    consumed.extend(batch.tolist())
"""
QUICK_START_CHECK = """
assert sorted(consumed) == list(range(3200)), "the epoch fed every record once"
assert loader.state_dict() == torch.load(path)["loader"], "the restored position is the saved one"
print("quick start: ok")
"""


def run(*command: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command as the user runs it: nothing of the checkout's Python on the path, and the imports
    free to cache their bytecode (the venv was installed without it)."""
    unset = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")
    environment = {key: value for key, value in os.environ.items() if key not in unset}
    environment["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd,
                            env=environment, timeout=timeout, check=False)  # fmt: skip
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=ROOT)
    return out


@pytest.fixture(scope="module")
def user(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the venv's bin directory, an empty working directory): the wheel installed with the demo extra."""
    home = tmp_path_factory.mktemp("user")
    run(sys.executable, "-m", "venv", "--without-pip", home / "venv", cwd=home)
    python = home / "venv" / "bin" / "python"
    # This pip installs into the new venv (--python), which saves ensurepip; --no-compile saves
    # byte-compiling all of torch: each process compiles and caches what it imports (run() lets it
    # write the cache). Measured CPU time: install 27 s instead of 59 s; importing Lightning,
    # scikit-learn and verify then takes 6 s either way.
    install = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile"]
    run(*install, TORCH, cwd=home)
    run(*install, f"{dist / f'{NAME}-py3-none-any.whl'}[demo]", cwd=home)
    work = home / "work"
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    return python.parent, work


def test_the_wheel_and_sdist_pass_twine_check_and_carry_the_license_types_and_configs(dist):
    wheel, sdist = dist / f"{NAME}-py3-none-any.whl", dist / f"{NAME}.tar.gz"
    run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=dist)
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.lstrip().startswith("Apache License\n") and "END OF TERMS AND CONDITIONS" in license_text
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"{NAME}.dist-info/METADATA").decode()
        assert archive.read(f"{NAME}.dist-info/licenses/LICENSE").decode() == license_text
        assert archive.read("stateful_sampler/demo/digits.yaml").decode() == (ROOT / "configs/digits.yaml").read_text()
    assert {"stateful_sampler/py.typed", "stateful_sampler/demo/resume.yaml", "stateful_sampler/__main__.py"} <= names
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Typing :: Typed" in metadata
    assert 'Requires-Dist: jsonargparse[signatures]<5.0,>=4.27; extra == "lightning"' in metadata
    assert re.search(r"^Requires-Dist: pyyaml>=6; extra == \"lightning\"$", metadata, re.MULTILINE)
    assert "](docs/" not in metadata  # the README's links work on the package index page
    with tarfile.open(sdist) as archive:
        assert archive.extractfile(f"{NAME}/LICENSE").read().decode() == license_text  # type: ignore[union-attr]


def test_the_sdist_holds_every_file_its_tests_read(dist):
    """Every test module and helper, the configs and examples the tests run: pytest runs from the sdist."""
    with tarfile.open(dist / f"{NAME}.tar.gz") as archive:
        held = {name.removeprefix(f"{NAME}/") for name in archive.getnames()}
    needed = {
        str(path.relative_to(ROOT))
        for folder in ("tests", "configs", "examples", "benchmarks")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".yaml", ".txt")
    }
    assert needed - held == set()
    assert {"pyproject.toml", "README.md", "CONTRIBUTING.md", "CHANGELOG.md", "LICENSE", "Makefile"} <= held


def test_the_command_prints_its_version(user):
    """``python -m stateful_sampler``; the ``stateful-sampler`` entry point's is the README demo block's last command."""
    bin_dir, work = user
    assert run(bin_dir / "python", "-m", "stateful_sampler", "--version", cwd=work).stdout == (
        f"stateful-sampler {__version__}\n"
    )


def test_the_readme_quick_start_runs(user):
    bin_dir, work = user
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start: a plain PyTorch loop") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)  # type: ignore[union-attr]
    (work / "quick_start.py").write_text(QUICK_START_PRELUDE + code + QUICK_START_CHECK)
    assert run(bin_dir / "python", "quick_start.py", cwd=work).stdout.endswith("quick start: ok\n")


def test_the_lightning_example_trains(user):
    bin_dir, work = user
    shutil.copy(ROOT / "examples" / "lightning_train.py", work / "lightning_train.py")
    result = run(bin_dir / "python", "lightning_train.py", "--root", "runs/example", "--max-epochs", "1",
                 "--num-workers", "0", cwd=work)  # fmt: skip
    assert result.stdout.splitlines()[-1] == "trained to step 57, epoch 1; last checkpoint in runs/example"


def test_the_readme_demo_block_runs_as_written(user):
    """The README's demo commands, in order, in the user's venv (which has the demo extra the block's
    first line installs): the shipped configs, a fresh fit, the resume on top of it, ``stateful-sampler audit
    --config`` on the shipped config, the entry point's ``--version``."""
    bin_dir, work = user
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL) if "stateful_sampler.demo" in b)
    commands = block.splitlines()
    assert commands[0] == 'pip install "stateful-sampler[demo]"'
    demo = work / "demo"
    demo.mkdir()
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    outputs = {}
    for command in commands[1:]:
        done = outputs[command] = run("bash", "-c", f"export PATH={shlex.quote(path)}; {command}", cwd=demo)
    [audit] = [done for command, done in outputs.items() if command.startswith("stateful-sampler audit --config ")]
    assert audit.stdout.startswith("Coverage audit: 1797 records on 8 rank(s), strategy=uniform, tail=pad")
    assert audit.stderr == ""
    assert done.stdout == f"stateful-sampler {__version__}\n"  # the block's last command
    assert (demo / "runs" / "digits" / "checkpoints" / "last.ckpt").is_file()


def test_verify_proves_a_tiny_training_command_equal(user):
    bin_dir, work = user
    (work / "tiny_training.py").write_text(TINY_TRAINING)
    result = run(bin_dir / "stateful-sampler", "verify", "--", bin_dir / "python", "tiny_training.py",
                 "--root", "{run_dir}", cwd=work)  # fmt: skip
    assert "EQUAL" in result.stdout, result.stdout


def test_a_missing_extra_names_its_pip_command(user):
    bin_dir, work = user  # the demo extra brings Lightning, not Accelerate
    result = subprocess.run([str(bin_dir / "python"), "-c", "import stateful_sampler.accelerate"],
                            capture_output=True, text=True, cwd=work, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ModuleNotFoundError: stateful_sampler.accelerate needs accelerate, which is not installed: "
        "pip install 'stateful-sampler[accelerate]'"
    )
