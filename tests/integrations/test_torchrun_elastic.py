"""TorchElastic (issue 20, item 6): ``examples/torchrun_elastic.py`` under real ``torchrun`` agents on
loopback, killed with SIGKILL mid-epoch. An agent lost with its workers: the other re-forms the group
alone and finishes the epoch at world size 2, each record once. A worker lost under
``--max-restarts``: the restarted group equals the uninterrupted run step by step."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from stateful_sampler.verify.process_tree import kill_tree
from tests.helpers import free_port
from tests.integrations.torchrun_elastic_run import PAUSE_AT_ENV, PAUSE_LOCAL_RANK_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="kills the agent's process tree, found in /proc"),
]

HELPER = str(Path(__file__).with_name("torchrun_elastic_run.py"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--monitor-interval=0.2"]
SIZE = 48  # examples/torchrun_elastic.py: 48 records, 2 a rank per step
# A restarted group under torch's shared rendezvous store reads the keys its predecessor left and gloo
# connects to a dead rank ("Connection refused"; pytorch/pytorch#167288): each restart gets a fresh store.
AGENT_ENV = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
WAIT_SECONDS = 240.0  # a bound on the polls, not a wait: each returns as soon as its file appears


def _start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **AGENT_ENV, **env})  # fmt: skip


def _poll(condition: Callable[[], Any], what: str, agents: dict[str, tuple[subprocess.Popen, Path]]) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (result := condition()):
        for name, (agent, log) in agents.items():
            if agent.poll() is not None:
                raise AssertionError(f"{name} agent exited ({agent.returncode}) before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_SECONDS:g} s: {what}")
        time.sleep(0.05)
    return result


def _finish(agent: subprocess.Popen, log: Path) -> None:
    try:
        code = agent.wait(timeout=WAIT_SECONDS)
    finally:
        if agent.poll() is None:
            kill_tree(agent.pid)
    assert code == 0, log.read_text()


def _steps(root: Path, restart: int) -> dict[int, list[dict[str, Any]]]:
    """Each rank's recorded steps in the given (re)start, by rank."""
    found = {}
    for path in sorted((root / "steps").glob(f"restart{restart}-rank*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        found[records[0]["rank"]] = records
    return found


def _participants(backend: C10dRendezvousBackend) -> int:
    state = backend.get_state()
    return 0 if state is None else len(pickle.loads(state[0]).participants)


def test_an_agent_killed_mid_epoch_leaves_the_other_to_finish_the_epoch_alone_at_world_size_2(
    tmp_path: Path,
) -> None:
    # The rendezvous store lives in this process, so either agent may die. The doomed agent needs both
    # nodes (--nnodes 2:2) and joins first, so the first round is exactly 2 nodes x 2 workers; the survivor
    # is elastic (1:2) and, once the dead node's keep-alive expires, re-forms the group alone.
    port = int(free_port())
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    rendezvous = [
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic-test", "--local-addr=127.0.0.1",
        "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=2,keep_alive_max_attempt=3",
        "--max-restarts=2",
    ]  # fmt: skip
    script = [HELPER, str(tmp_path), "1", "3"]  # 1 epoch, a checkpoint every 3 steps
    agents: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        doomed_log = tmp_path / "doomed.log"
        doomed = _start([*TORCHRUN, "--nnodes=2:2", *rendezvous, *script], doomed_log, **{PAUSE_AT_ENV: "4"})
        agents["doomed"] = (doomed, doomed_log)
        backend = C10dRendezvousBackend(store, "elastic-test")
        _poll(lambda: _participants(backend) == 1, "the doomed agent joins the rendezvous", agents)
        survivor_log = tmp_path / "survivor.log"
        survivor = _start([*TORCHRUN, "--nnodes=1:2", *rendezvous, *script], survivor_log)
        agents["survivor"] = (survivor, survivor_log)
        _poll(lambda: len(list(tmp_path.glob("paused-*"))) == 2, "the doomed agent's 2 workers finish step 4", agents)
        kill_tree(doomed.pid)  # SIGKILL to the agent and its workers at once
        doomed.wait()
        del agents["doomed"]
        _finish(survivor, survivor_log)
    finally:
        for agent, _ in agents.values():
            if agent.poll() is None:
                kill_tree(agent.pid)
                agent.wait()
    first, second = _steps(tmp_path, 0), _steps(tmp_path, 1)
    # World size 4: every rank took steps 1..4 (the survivor's workers died inside step 5's all-reduce).
    assert {rank: [r["step"] for r in records] for rank, records in first.items()} == {
        r: [1, 2, 3, 4] for r in range(4)
    }
    assert {r["world_size"] for records in first.values() for r in records} == {4}
    # World size 2, from the checkpoint at step 3: the 24 records left, 6 steps on each rank.
    assert {rank: [r["step"] for r in records] for rank, records in second.items()} == {
        r: list(range(4, 10)) for r in range(2)
    }
    assert {r["world_size"] for records in second.values() for r in records} == {2}
    assert "restart 1: resumed from step 3 at world size 2" in survivor_log.read_text()
    kept = [r for records in first.values() for r in records if r["step"] <= 3]
    seen = Counter(i for r in kept + [r for records in second.values() for r in records] for i in r["ids"])
    assert seen == Counter(range(SIZE))  # every record of the epoch exactly once
    assert json.loads((tmp_path / "final.json").read_text())["step"] == 9


def test_a_worker_killed_under_max_restarts_resumes_to_the_uninterrupted_run_step_by_step(tmp_path: Path) -> None:
    reference_root, crash_root = tmp_path / "reference", tmp_path / "crash"
    logs = {name: tmp_path / f"{name}.log" for name in ("reference", "crash")}

    def run(root: Path, **env: str) -> subprocess.Popen:  # 2 epochs of 12 steps, a checkpoint every 5
        return _start(
            [*TORCHRUN, "--standalone", "--max-restarts=1", HELPER, str(root), "2", "5"], logs[root.name], **env
        )

    reference = run(reference_root)
    crash = run(crash_root, **{PAUSE_AT_ENV: "7", PAUSE_LOCAL_RANK_ENV: "1"})
    try:
        paused = _poll(
            lambda: sorted(crash_root.glob("paused-*")), "rank 1 finishes step 7", {"crash": (crash, logs["crash"])}
        )
        assert [path.name for path in paused] == ["paused-1"]
        os.kill(int(paused[0].read_text()), signal.SIGKILL)  # one worker dies; the agent restarts the group
        _finish(crash, logs["crash"])
        _finish(reference, logs["reference"])
    finally:
        for agent in (reference, crash):
            if agent.poll() is None:
                kill_tree(agent.pid)
                agent.wait()
    want = _steps(reference_root, 0)
    before, after = _steps(crash_root, 0), _steps(crash_root, 1)
    assert [r["step"] for r in after[0]] == list(range(6, 25))  # resumed from step 5: steps 6 and 7 again
    for rank in (0, 1):
        resumed = [r for r in before[rank] if r["step"] <= 5] + after[rank]
        assert [_without_restart(r) for r in resumed] == [_without_restart(r) for r in want[rank]]  # ids, loss
    assert json.loads((crash_root / "final.json").read_text()) == json.loads(
        (reference_root / "final.json").read_text()
    )


def _without_restart(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "restart"}
