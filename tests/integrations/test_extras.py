"""A missing optional framework is named with the command that installs it (issue 20, item 1):
each integration, imported in a process where its framework cannot be imported, says
``pip install 'stateful-sampler[EXTRA]'``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stateful_sampler.demo.datamodule import NoisyDigits

# module -> (the framework it imports, the extra that installs it)
INTEGRATIONS = {
    "stateful_sampler.accelerate": ("accelerate", "accelerate"),
    "stateful_sampler.fabric": ("lightning", "fabric"),
    "stateful_sampler.hf_trainer": ("transformers", "transformers"),
    "stateful_sampler.pytorch_lightning": ("pytorch_lightning", "pytorch-lightning"),
    "stateful_sampler.ray": ("ray", "ray"),
    "stateful_sampler.demo.datamodule": ("lightning", "demo"),
    "stateful_sampler.demo.model": ("lightning", "demo"),
}
# Every framework blocked at once, before anything imports it: `None` in sys.modules makes its import fail.
IMPORT_EACH = """
import importlib, json, sys
for name in ("lightning", "pytorch_lightning", "accelerate", "transformers", "sklearn", "ray"):
    sys.modules[name] = None
errors = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        errors[module] = [str(error), error.name]
print(json.dumps(errors))
"""


def test_each_integration_without_its_framework_names_the_extra_to_install():
    result = subprocess.run([sys.executable, "-c", IMPORT_EACH, *INTEGRATIONS],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout)
    assert errors == {
        module: [f"{module} needs {framework}, which is not installed: pip install 'stateful-sampler[{extra}]'",
                 framework]
        for module, (framework, extra) in INTEGRATIONS.items()
    }  # fmt: skip


def test_the_demo_data_without_scikit_learn_names_the_demo_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ModuleNotFoundError) as raised:
        NoisyDigits()
    assert str(raised.value) == (
        "the demo's digits needs sklearn, which is not installed: pip install 'stateful-sampler[demo]'"
    )
