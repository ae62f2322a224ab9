"""Seeding across separate processes: fresh runs of ``seed_worker`` and a real 2-process DDP run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from stateful_sampler.order.mixing import worker_seed
from tests.seeding.test_seeding import first_draws
from tests.seeding.test_seeding_loader import SEED, SIZE, assert_same_values_per_global_position, uninterrupted

ROOT = Path(__file__).parents[2]  # the subprocesses import tests.seeding.test_seeding_loader from here
pytestmark = pytest.mark.slow

SEED_WORKER_RUN = r"""
import json, random, sys
import numpy as np, torch
from torch.utils.data import DataLoader
sys.path.insert(0, sys.argv[2])
from tests.seeding.test_seeding_loader import Augmented
from stateful_sampler import StatefulSampler
from stateful_sampler.seeding import seed_worker

noise = int(sys.argv[1])
torch.rand(noise), np.random.random(noise), [random.random() for _ in range(noise)]

def run(seeded, persistent):
    sampler = StatefulSampler(Augmented(), seed=5, batch_size=3)
    loader = DataLoader(Augmented(), sampler=sampler, batch_size=3, num_workers=2, persistent_workers=persistent,
                        worker_init_fn=seed_worker(sampler) if seeded else None)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([batch.tolist() for batch in loader])
    return epochs

print(json.dumps({"restarting": run(True, False), "persistent": run(True, True), "default": run(False, False)}))
"""


@cache
def fresh_run(noise: int) -> dict:
    """A new Python process that first draws ``noise`` numbers from each global RNG, then loads."""
    result = subprocess.run(
        [sys.executable, "-c", SEED_WORKER_RUN, str(noise), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_pytorchs_own_worker_seeds_follow_the_main_processs_rng():
    assert fresh_run(0)["default"] != fresh_run(5)["default"]


@pytest.mark.parametrize("workers", ["restarting", "persistent"])
def test_seed_worker_gives_two_fresh_runs_the_same_augmentation(workers):
    first, second = fresh_run(0)[workers], fresh_run(5)[workers]
    assert first == second
    draws = [tuple(row[1:]) for epoch in first for batch in epoch for row in batch]
    assert len(set(draws)) == len(draws) == 2 * SIZE  # every sample of both epochs draws anew
    # Batch b goes to worker b mod 2, so worker w's first draws open batch w of each epoch its
    # workers start in (persistent workers start once, and continue their streams in epoch 1).
    for epoch in [0, 1] if workers == "restarting" else [0]:
        for worker in (0, 1):
            np.testing.assert_array_equal(first[epoch][worker][0][1:], first_draws(worker_seed(5, epoch, 0, worker)))


DDP_RANK = r"""
import json, multiprocessing, os, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
sys.path.insert(0, sys.argv[1])
multiprocessing.set_forkserver_preload(["tests.seeding.test_seeding_loader"])  # workers unpickle its dataset: import it once
from tests.seeding.test_seeding_loader import Augmented, EPOCHS, SEED, BATCH, rows_of
from stateful_sampler import StatefulSampler
from stateful_sampler.seeding import SeededDataset, seed_worker

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
batch = BATCH // 2
sampler = StatefulSampler(Augmented(), seed=SEED, batch_size=batch, yield_keys=True)  # ranks from the group
# Workers come from a forkserver: forking a rank whose gloo threads are running can hang the child.
loader = DataLoader(SeededDataset(Augmented()), sampler=sampler, batch_size=batch, num_workers=1,
                    multiprocessing_context="forkserver")
rows = []
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    rows += [row for step in loader for row in rows_of(step)]
plain = StatefulSampler(Augmented(), seed=SEED, batch_size=batch)
worker_loader = DataLoader(Augmented(), sampler=plain, batch_size=batch, num_workers=1,
                           worker_init_fn=seed_worker(plain), multiprocessing_context="forkserver")
first = next(iter(worker_loader))[0].tolist()
dist.barrier()
dist.destroy_process_group()
print(json.dumps({"rows": rows, "first_worker_draws": first[1:]}), flush=True)
os._exit(0)  # no interpreter teardown: a native thread sometimes aborts there (exit -6)
"""


def test_a_real_two_process_ddp_run_draws_the_values_of_one_process_per_global_position(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", DDP_RANK, str(ROOT), str(tmp_path / "rendezvous")],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=300) for process in ranks]
    for process, (_, stderr) in zip(ranks, outputs):
        assert process.returncode == 0, stderr
    results = [json.loads(stdout.splitlines()[-1]) for stdout, _ in outputs]
    world_rows = [tuple(row) for result in results for row in result["rows"]]
    assert_same_values_per_global_position(world_rows, uninterrupted(0))
    for rank, result in enumerate(results):  # each rank's worker got its own rank's stream
        np.testing.assert_array_equal(result["first_worker_draws"], first_draws(worker_seed(SEED, 0, rank, 0)))
