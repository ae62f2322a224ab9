"""Shared test drivers: run simulated ranks of a StatefulSampler epoch by epoch."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from hypothesis import settings

from stateful_sampler import StatefulSampler


def scaled_examples(full: int) -> int:
    """A property's hypothesis budget: ``full`` examples under the default, ci and full profiles (``make test``),
    a tenth of them (at least one) under the fast profile of ``make test-fast``, which must run every test
    not marked slow in 3 minutes. The explicit examples (``@example``) run in both."""
    return max(1, full * settings.default.max_examples // 100)


def make_ranks(size: int, world_size: int, **kwargs: Any) -> list[StatefulSampler]:
    return [StatefulSampler(size, num_replicas=world_size, rank=rank, **kwargs) for rank in range(world_size)]


def run_epochs(samplers: list[StatefulSampler], epochs: range) -> list[list[list[Any]]]:
    """``out[rank][i]`` is what rank yields in the i-th epoch of ``epochs``."""
    out: list[list[list[Any]]] = [[] for _ in samplers]
    for epoch in epochs:
        for rank, sampler in enumerate(samplers):
            sampler.set_epoch(epoch)
            out[rank].append(list(sampler))
    return out


def json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def run_ranks(command: list[str], world_size: int, cwd: Path, timeout: float, rank_variable: str = "RANK",
              env: dict[str, str] | None = None) -> None:  # fmt: skip
    """Start ``world_size`` real processes of a gloo group on this machine and wait for them all.

    Each gets a process group of its own, so a rank left waiting in a collective (unequal step
    counts) is killed with its DataLoader workers when ``timeout`` passes, and the test fails
    with every rank's output instead of hanging CI."""
    shared = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port(),
              "OMP_NUM_THREADS": "1", **(env or {})}  # fmt: skip
    ranks = [
        subprocess.Popen(command, env={**shared, rank_variable: str(rank)}, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for rank in range(world_size)
    ]  # fmt: skip
    try:
        outputs = [rank.communicate(timeout=timeout)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                os.killpg(rank.pid, signal.SIGKILL)
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 0, output[-4000:]


def free_port() -> str:
    """A TCP port on loopback that nothing listens on now, for a gloo group's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])
