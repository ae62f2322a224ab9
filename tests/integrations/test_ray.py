"""Ray Train, for real: a local Ray cluster on 127.0.0.1 (4 logical CPUs), TorchTrainer with gloo, DataLoader workers.

One run of ``ray_train_run.py`` (one cluster) gives: a 2-worker run whose rank 1 is SIGKILLed mid-epoch and
restarted by ``FailureConfig``, the same over a ``ShardedStream``, and a new 1-worker ``TorchTrainer`` resumed
from the killed run's checkpoint by path. The reference is the same loop run uninterrupted in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("ray.train")

from tests.integrations import ray_train_run as runs  # after importorskip: needs ray

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600
CLUSTER_ENVIRONMENT = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # read at ray's import: the node (and gloo's master) on 127.0.0.1
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # each report waits for the controller's poll (2 s by default)
    "RAY_USAGE_STATS_ENABLED": "0",  # nothing leaves the machine
    "OMP_NUM_THREADS": "1",
}


def run_on_a_cluster(module: ModuleType, root: Path, **environment: str) -> None:
    """``python -m module root`` in its own session, with the cluster's environment; its output if it fails."""
    command = [sys.executable, "-m", module.__name__, str(root)]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **CLUSTER_ENVIRONMENT, **environment},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        output = process.communicate(timeout=TIMEOUT)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-6000:]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray")
    run_on_a_cluster(runs, root)
    return root


def lines(root: Path, run: str) -> list[list[dict[str, Any]]]:
    paths = sorted((root / run).glob("rank*.jsonl"))
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in paths]


def trained(rank_lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the final weights trained on: a step trained again after the resume supersedes the killed attempt's."""
    by_step = {line["step"]: line for line in rank_lines}  # in file order: the resumed attempt's come last
    return [{name: by_step[step][name] for name in ("step", "epoch", "ids", "rand")} for step in sorted(by_step)]


def test_the_cluster_runs_on_loopback(root: Path) -> None:
    assert json.loads((root / "addresses.json").read_text()) == {"node": "127.0.0.1", "master": "127.0.0.1"}


@pytest.mark.parametrize(("run", "config", "kill_after"), [
    ("killed", {}, runs.KILL_AFTER),
    ("stream_killed", {"stream": True}, runs.STREAM_KILL_AFTER),
])  # fmt: skip
def test_a_worker_sigkilled_mid_epoch_resumes_with_the_uninterrupted_runs_batches_and_randomness(
    root: Path, run: str, config: dict[str, Any], kill_after: int
) -> None:
    killed = lines(root, run)
    reference = runs.uninterrupted(config, world_size=2)
    assert int((root / run / "killed").read_text()) == kill_after
    for rank in range(2):
        resumed = [line for line in killed[rank] if line["attempt"] == 1]
        assert resumed[0]["restored"] and resumed[0]["step"] == kill_after + 1  # from the checkpoint of the kill step
        assert trained(killed[rank]) == reference[rank]  # every step: the same records and the same torch.rand draw
    assert [len(rank) for rank in reference] == [runs.EPOCHS * (10 if config else 12) // 2] * 2


def test_a_new_trainer_at_another_size_resumes_by_the_elastic_rule(root: Path) -> None:
    before = [[line for line in trained(rank) if line["step"] <= runs.KILL_AFTER] for rank in lines(root, "killed")]
    (after,) = lines(root, "resized")
    epoch = before[0][-1]["epoch"]
    consumed = [i for rank in before for line in rank if line["epoch"] == epoch for i in line["ids"]]
    rest = [i for line in after if line["epoch"] == epoch for i in line["ids"]]
    assert sorted(consumed + rest) == list(range(runs.SIZE))  # every record of the epoch once: none lost, none again
    assert len(consumed) == 16 and [line["step"] for line in after] == list(range(runs.KILL_AFTER + 1, 17))
    assert {line["epoch"] for line in after} == {epoch}  # the run ends with the epoch (epochs=2)
    assert after[0]["restored"]
