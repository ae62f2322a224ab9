"""An elastic Ray Train group resized by real node loss and node gain, for tests/integrations/test_ray_elastic.py.

``python -m tests.integrations.ray_elastic_run ROOT`` starts a local cluster on 127.0.0.1 (``ray.cluster_utils``):
a head node for the driver and Train's controller, and two nodes of one ``{"slot": 1}`` each, the only resource a
worker asks for. ``TorchTrainer`` runs ``ScalingConfig(num_workers=(1, 2))``, which Train V2 sizes from the
cluster's nodes at each (re)start:

- attempt 0, 2 workers: after step SHRINK_AT's checkpoint both ranks wait; the driver removes rank 1's node (its
  worker dies with it) and the controller restarts the group from ``ray.train.get_checkpoint()`` at the 1 slot
  left;
- attempt 1, 1 worker: after step GROW_AT's checkpoint it waits; the driver adds a slot node back and the
  controller, seeing room for 2 while the group runs, resizes it to 2 from the same checkpoint path;
- attempt 2, 2 workers: rank 1 SIGKILLs itself after step KILL_AT's checkpoint; the group comes back at the same
  size (both slots are there), attempt 3, and trains to the end of EPOCHS.

Each worker appends one JSON line a step to ROOT/elastic/attempt<a>-rank<r>.jsonl (as ray_train_run.py's, with its
node and, on the first, what ``restore`` warned). ROOT/summary.json names the lost and the added node, each
step's checkpoint path and the nodes' addresses. ``resumed`` runs the loop in one process from a checkpoint: the
reference.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from ray.cluster_utils import Cluster
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (  # Ray's internal: see_nodes
    get_or_create_autoscaling_coordinator,
)
from ray.train import ScalingConfig

import stateful_sampler.ray
from tests.integrations import ray_train_run as runs

SHRINK_AT = 2  # 2 steps of 2 ranks: 16 of epoch 0's 48 records, 32 left for 1 rank
GROW_AT = 4  # 2 steps of 1 rank: 24 left, 3 steps for 2 ranks (epoch 0 ends at step 7)
KILL_AT = 9  # mid-epoch 1 (steps 8 to 13)
WAIT_S = 120.0  # a resize takes seconds; past this bound the cluster did not resize the group
NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "include_dashboard": False}


def elastic_loop(config: dict[str, Any]) -> None:
    """ray_train_run.py's loop, which stops where the driver resizes the cluster (or rank 1 kills itself)."""
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    out = Path(config["out"])
    attempt = len({path.name.split("-")[1] for path in out.glob("paused-*")})  # the attempts stopped before this
    node = ray.get_runtime_context().get_node_id()
    loader = runs.make_loader(config, rank, world_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = stateful_sampler.ray.restore(loader)  # ray.train.get_checkpoint(), at whatever size came back
    log = out / f"attempt{attempt}-rank{rank}.jsonl"
    said = [str(warning.message) for warning in caught]
    for step, line in runs.steps(loader, config["epochs"], runs.resumed_step(config) if restored else 0):
        if world_size > 1:
            dist.all_reduce(torch.ones(1))  # the group trains in step: unequal step counts would hang here
        with log.open("a") as file:
            file.write(json.dumps({"restored": restored, "world_size": world_size, "node": node, "warnings": said,
                                   **line}) + "\n")  # fmt: skip
        said = []
        runs.report_step(loader, rank, step)
        if (attempt, step) in ((0, SHRINK_AT), (1, GROW_AT)) or (attempt, step, rank) == (2, KILL_AT, 1):
            ray.train.get_all_reported_checkpoints()  # this step's checkpoint is persisted
            (out / f"paused-{attempt}-rank{rank}").write_text(node)
            if attempt == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            wait_to_be_replaced()


def wait_to_be_replaced() -> None:
    """Ray ends this worker when it resizes the group; a worker still here after WAIT_S says it did not."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
    raise TimeoutError(f"the group was not resized within {WAIT_S} s of the cluster's change")


def wait_for(run: Future[Any], *paths: Path) -> None:
    """Poll for the markers the paused ranks write, within WAIT_S; a run that ended first raises its error."""
    deadline = time.monotonic() + WAIT_S
    while not all(path.exists() for path in paths):
        if run.done():
            run.result()
            raise RuntimeError(f"the run ended before {[path.name for path in paths]} were written")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{[path.name for path in paths]} not written within {WAIT_S} s")
        time.sleep(0.05)


def see_nodes(alive: Callable[[set[str]], bool]) -> None:
    """Wait (within WAIT_S) until the cluster's live nodes satisfy ``alive``, then have Train's view refreshed.

    Train V2's elastic policy counts workers from the reservations of Ray's AutoscalingCoordinator actor, which
    reads the nodes every 20 s (``TICK_INTERVAL_S``). ``get_reserved_resources(recompute=True)`` makes it read
    them now, so that the restart and the resize follow the node change in a second rather than up to 20 s
    (a restart decided on the old view times out its placement group and is retried: the same sizes, later).
    """
    deadline = time.monotonic() + WAIT_S
    while not alive({node["NodeID"] for node in ray.nodes() if node["Alive"]}):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster's nodes did not change within {WAIT_S} s")
        time.sleep(0.05)
    ray.get(get_or_create_autoscaling_coordinator().get_reserved_resources.remote("refresh", recompute=True))


def resumed(checkpoint: str, world_size: int, step: int) -> list[list[dict[str, Any]]]:
    """Each rank's records of the loop resumed in this process from ``checkpoint`` at another ``world_size``,
    never interrupted: the data position restored, the RNGs left as ``make_loader`` seeded them, as a restore at
    another size leaves them (this process has no process group: ``restore`` would see one rank of one)."""
    state = json.loads((Path(checkpoint) / stateful_sampler.ray.STATE_FILE).read_text())
    records = []
    for rank in range(world_size):
        loader = runs.make_loader({}, rank, world_size)
        loader.load_state_dict({**state, "rng_states": None})
        records.append([line for _, line in runs.steps(loader, runs.EPOCHS, step)])
    return records


def main(root: Path) -> None:
    for module in (runs, sys.modules[__name__]):
        ray.cloudpickle.register_pickle_by_value(module)  # the workers need not import tests/
    cluster = Cluster(initialize_head=True, head_node_args=NODE)
    slots = {node.node_id: node for node in (cluster.add_node(**NODE, resources={"slot": 1}) for _ in range(2))}
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
    out = root / "elastic"
    scaling = ScalingConfig(num_workers=(1, 2), resources_per_worker={"slot": 1}, elastic_resize_monitor_interval_s=1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(runs.fit, root, "elastic", scaling, loop=elastic_loop, max_failures=2)
        wait_for(run, out / "paused-0-rank0", out / "paused-0-rank1")
        lost = (out / "paused-0-rank1").read_text()
        cluster.remove_node(slots[lost])  # rank 1's node: its worker dies with it
        see_nodes(lambda alive: lost not in alive)
        wait_for(run, out / "paused-1-rank0")
        added = cluster.add_node(**NODE, resources={"slot": 1}).node_id
        see_nodes(lambda alive: added in alive)
        result = run.result()
    checkpoints = {metrics["step"]: checkpoint.path for checkpoint, metrics in result.best_checkpoints}
    addresses = sorted({node["NodeManagerAddress"] for node in ray.nodes()})  # the lost node's too
    summary = {"lost": lost, "added": added, "checkpoints": checkpoints, "addresses": addresses}
    (root / "summary.json").write_text(json.dumps(summary))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
