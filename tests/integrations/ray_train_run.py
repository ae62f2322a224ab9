"""Ray Train runs for tests/integrations/test_ray.py, on one local Ray cluster (127.0.0.1, gloo).

``python ray_train_run.py ROOT`` runs, each in ROOT/<run>: "killed" (2 workers, 2 epochs; rank 1 SIGKILLs
itself after step KILL_AFTER's checkpoint is persisted, and FailureConfig restarts the group), "resized"
(a new TorchTrainer of 1 worker resumed from that step's checkpoint, given by path) and, beside those two,
"stream_killed" (as "killed", over a ShardedStream). Every worker appends one JSON line a step to
ROOT/<run>/rank<r>.jsonl: attempt, restored, step, epoch, the batch's records and one torch.rand draw (the RNGs
a model would use). ``uninterrupted`` runs the same loop in one process, never stopped: the reference. The test
sets the cluster's environment (loopback only, no usage report, the controller's 0.2 s poll).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader

import stateful_sampler.ray
from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.stream import ShardedStream

SIZE, BATCH, EPOCHS = 48, 4, 2
KILL_AFTER = 8  # rank 1 dies after step 8's checkpoint: mid-epoch 1 (6 steps an epoch on 2 ranks)
STREAM_KILL_AFTER = 3  # 40 records, 5 steps an epoch on 2 ranks: mid-epoch 0


class Rows:
    """``ShardedStream``'s reader: shard i holds records ``100 * i + row``."""

    names = tuple(f"shard-{i}" for i in range(4))

    def count(self, shard: str) -> int:
        return 10

    def read(self, shard: str, start: int, stop: int) -> list[int]:
        first = 100 * self.names.index(shard)
        return list(range(first + start, first + min(stop, 10)))


def make_loader(config: dict[str, Any], rank: int, world_size: int) -> ResumableLoader:
    torch.manual_seed(1000 + rank)  # each rank's own randomness, as a model's dropout draws it
    if config.get("stream"):
        stream = ShardedStream(
            Rows.names, Rows(), seed=5, batch_size=BATCH, window=8, num_replicas=world_size, rank=rank
        )
        return ResumableLoader(stream.loader(num_workers=1))
    sampler = StatefulSampler(SIZE, seed=7, batch_size=BATCH, num_replicas=world_size, rank=rank)
    return ResumableLoader(DataLoader(range(SIZE), sampler=sampler, batch_size=BATCH, num_workers=1))


def steps(loader: ResumableLoader, epochs: int, step: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The loop's steps to the end of ``epochs``: each step's count and record (epoch, records, one RNG draw)."""
    while loader.epoch < epochs:
        epoch = loader.epoch
        for batch in loader:
            step += 1
            yield step, {"step": step, "epoch": epoch, "ids": batch.tolist(), "rand": torch.rand(1).item()}


def uninterrupted(config: dict[str, Any], world_size: int) -> list[list[dict[str, Any]]]:
    """Each rank's records of the same loop, never interrupted, in this process."""
    return [
        [line for _, line in steps(make_loader(config, rank, world_size), config.get("epochs", EPOCHS), 0)]
        for rank in range(world_size)
    ]


def train_loop_per_worker(config: dict[str, Any]) -> None:
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    out = Path(config["out"])
    killed_marker = out / "killed"
    attempt = int(killed_marker.exists())
    loader = make_loader(config, rank, world_size)
    restored = stateful_sampler.ray.restore(loader, config.get("resume_from"))  # the one line a user adds
    log = out / f"rank{rank}.jsonl"
    if rank == 0:
        (out / "master").write_text(os.environ["MASTER_ADDR"])  # where gloo's ranks meet
    for step, line in steps(loader, config.get("epochs", EPOCHS), resumed_step(config) if restored else 0):
        if world_size > 1:
            dist.all_reduce(torch.ones(1))  # the group trains in step: unequal step counts would hang here
        with log.open("a") as file:
            file.write(json.dumps({"attempt": attempt, "restored": restored, **line}) + "\n")
        report_step(loader, rank, step)
        if config.get("kill_after") == step and rank == 1 and attempt == 0:
            ray.train.get_all_reported_checkpoints()  # this step's checkpoint is persisted
            killed_marker.write_text(str(step))
            os.kill(os.getpid(), signal.SIGKILL)


def report_step(loader: ResumableLoader, rank: int, step: int) -> None:
    """The step's checkpoint, reported on every rank: the loader's state, and rank 0's step count beside it."""
    with tempfile.TemporaryDirectory() as folder:
        if rank == 0:
            (Path(folder) / "step.json").write_text(json.dumps(step))
        stateful_sampler.ray.report({"step": step}, loader, checkpoint_dir=folder if rank == 0 else None)


def resumed_step(config: dict[str, Any]) -> int:
    """The step count rank 0 saved beside the loader's state (the user's own files in the same checkpoint)."""
    checkpoint = ray.train.get_checkpoint() if config.get("resume_from") is None else None
    with (checkpoint or ray.train.Checkpoint(config["resume_from"])).as_directory() as folder:
        return int(json.loads((Path(folder) / "step.json").read_text()))


def fit(
    root: Path,
    run: str,
    workers: int | ScalingConfig,
    *,
    loop: Callable[[dict[str, Any]], None] = train_loop_per_worker,
    max_failures: int = 1,
    **config: Any,
) -> ray.train.Result:
    """``loop`` trained by a ``TorchTrainer`` of ``workers`` (a fixed count, or an elastic ``ScalingConfig``)."""
    out = root / run
    out.mkdir()
    scaling = workers if isinstance(workers, ScalingConfig) else ScalingConfig(num_workers=workers, use_gpu=False)
    trainer = TorchTrainer(
        loop,
        train_loop_config={"out": str(out), "epochs": EPOCHS, **config},
        scaling_config=scaling,
        run_config=RunConfig(
            name=run, storage_path=str(root / "storage"), failure_config=FailureConfig(max_failures=max_failures)
        ),
    )
    started = time.monotonic()
    result = trainer.fit()
    with (root / "seconds.jsonl").open("a") as file:  # each fit's wall time, for the record
        file.write(json.dumps({run: round(time.monotonic() - started, 1)}) + "\n")
    return result


def main(root: Path) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import tests/
    # 4 logical CPUs on 2 cores: the stream's run goes on beside the other two. A worker group's start mostly
    # waits (actors, rendezvous, the controller's polls), so the three runs take far less together than in turn.
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream_killed = pool.submit(fit, root, "stream_killed", 2, stream=True, kill_after=STREAM_KILL_AFTER)
        killed = fit(root, "killed", 2, kill_after=KILL_AFTER)
        saved = {metrics["step"]: checkpoint.path for checkpoint, metrics in killed.best_checkpoints}
        fit(root, "resized", 1, resume_from=saved[KILL_AFTER])
        stream_killed.result()
    addresses = {"node": ray.nodes()[0]["NodeManagerAddress"], "master": (root / "killed" / "master").read_text()}
    (root / "addresses.json").write_text(json.dumps(addresses))
    ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
