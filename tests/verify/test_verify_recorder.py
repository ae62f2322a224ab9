"""verify's recorder, switched on from outside: one claim per process, so no batch is recorded twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_only_the_first_hook_to_claim_the_recorder_records(tmp_path: Path) -> None:
    program = (
        "from stateful_sampler.verify.recorder import claim_recorder\n"
        "print(claim_recorder() is not None, claim_recorder() is not None)\n"
    )
    env = {"PATH": "", "STATEFUL_SAMPLER_RECORD": str(tmp_path / "run")}
    claimed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True)
    assert claimed.stdout == "True False\n"
    unset = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env={}, check=True)
    assert unset.stdout == "False False\n"


@pytest.mark.slow  # subprocesses
def test_record_weights_outside_verify_does_nothing_and_refuses_what_is_no_model(tmp_path: Path) -> None:
    program = (
        "import torch\n"
        "from stateful_sampler.verify import record_weights\n"
        "record_weights(torch.nn.Linear(2, 1))\n"
        "try:\n"
        "    record_weights([1.0])\n"
        "except TypeError as error:\n"
        "    print(error)\n"
    )
    outside = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env={}, check=True)
    assert outside.stdout == ""  # outside verify even a wrong argument is not looked at
    env = {"STATEFUL_SAMPLER_RECORD": str(tmp_path / "run")}
    inside = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True)
    assert inside.stdout == "record_weights needs a torch.nn.Module or a state dict, got list\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.weights.pt"]
