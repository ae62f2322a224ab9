"""The core never imports a product (issue 20, item 8): verify plugs into the core's seam
(``stateful_sampler.plugins``) through the environment of the runs it starts."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stateful_sampler"
PRODUCTS = ("verify", "audit", "demo", "certificate")
# The products themselves, the command line that dispatches to them, and the pytest helper over verify.
NOT_CORE = {PACKAGE / "cli.py", PACKAGE / "testing.py", *(PACKAGE / product for product in PRODUCTS)}


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_core_module_imports_verify_audit_or_demo() -> None:
    core = [path for path in PACKAGE.rglob("*.py") if not any(path == n or n in path.parents for n in NOT_CORE)]
    assert PACKAGE / "loader.py" in core and PACKAGE / "lightning" / "callback.py" in core
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(name for name in _imported_modules(path) if name.split(".")[:2] in (
            ["stateful_sampler", product] for product in PRODUCTS))
        for path in core
    }  # fmt: skip
    assert {path: names for path, names in offenders.items() if names} == {}


_TRAIN = (
    "import json, sys\n"
    "from torch.utils.data import DataLoader\n"
    "from stateful_sampler import ResumableLoader, StatefulSampler\n"
    "loader = ResumableLoader(DataLoader(range(8), sampler=StatefulSampler(8, batch_size=4), batch_size=4))\n"
    "batches = [batch.tolist() for batch in loader]\n"
    "loader.state_dict()\n"
    "print(json.dumps(sorted(name for name in sys.modules if name.startswith('stateful_sampler.verify'))))\n"
)


def _train(variables: dict[str, str]) -> list[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("STATEFUL_SAMPLER_")}
    env.update(variables)
    done = subprocess.run([sys.executable, "-c", _TRAIN], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # a subprocess
def test_a_loader_records_nothing_and_imports_no_verify_without_the_plugin(tmp_path: Path) -> None:
    # STATEFUL_SAMPLER_RECORD alone (inherited by a process verify does not run) switches nothing on.
    assert _train({"STATEFUL_SAMPLER_RECORD": str(tmp_path / "run")}) == []
    assert list(tmp_path.iterdir()) == []


def test_the_plugin_named_in_the_environment_records_the_loader_batches(tmp_path: Path) -> None:
    env = {
        "STATEFUL_SAMPLER_RECORD": str(tmp_path / "run"),
        "STATEFUL_SAMPLER_PLUGINS": "stateful_sampler.verify.plugin",
    }
    assert "stateful_sampler.verify.plugin" in _train(env)
    lines = [json.loads(line) for line in (tmp_path / "run.rank0.jsonl").read_text().splitlines()]
    assert [(line["kind"], line.get("batch_idx"), line["step"]) for line in lines] == [
        ("batch", 0, 0), ("batch", 1, 1), ("checkpoint", None, 2)]  # fmt: skip


def test_a_plugin_that_cannot_be_imported_is_named_with_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from stateful_sampler import plugins

    monkeypatch.setenv(plugins.PLUGINS_ENV, "no_such_plugin_module")
    monkeypatch.setattr(plugins, "_loaded", set())
    with pytest.raises(
        ImportError,
        match=r"^STATEFUL_SAMPLER_PLUGINS: cannot import the plugin module 'no_such_plugin_module': No module named 'no_such_plugin_module'$",
    ):
        plugins.load_plugins()
