"""One process of a DDP training run (gloo) that knows nothing of the certificate: the test switches it on with
``STATEFUL_SAMPLER_CERTIFICATE`` in the environment.

``python certificate_run.py CHECKPOINT PAUSE_AT RESTORE_LOADER`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
set. 48 records in batches of 3 a rank, 2 epochs, one DataLoader worker; rank 0 saves the model, optimizer
and loader state every 3 of this process's steps. After PAUSE_AT steps (0: never) each rank writes
``CHECKPOINT.paused.rank{r}`` and waits for the test to SIGKILL it. A process that finds the checkpoint loads
the model from it, and the loader state unless RESTORE_LOADER is 0 (the bug the certificate catches).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import ResumableLoader, StatefulSampler

RECORDS, BATCH, EPOCHS, CHECKPOINT_EVERY = 48, 3, 2, 3


def main() -> None:
    checkpoint, pause_at, restore_loader = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    features = torch.arange(RECORDS, dtype=torch.float32).unsqueeze(1).repeat(1, 4) / RECORDS
    dataset = TensorDataset(features, features.sum(dim=1, keepdim=True))
    sampler = StatefulSampler(dataset, seed=11)
    loader = ResumableLoader(DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=1))
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if restore_loader:
            loader.load_state_dict(saved["loader"])
    steps = 0
    while loader.epoch < EPOCHS:
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()  # all-reduced: the ranks in lockstep
            optimizer.step()
            steps += 1
            if steps % CHECKPOINT_EVERY == 0:
                state = loader.state_dict()
                if rank == 0:
                    partial = checkpoint.with_name(checkpoint.name + ".partial")
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "loader": state}, partial)  # fmt: skip
                    os.replace(partial, checkpoint)
                dist.barrier()
            if steps == pause_at:
                checkpoint.with_name(f"{checkpoint.name}.paused.rank{rank}").write_text(str(os.getpid()))
                threading.Event().wait(120)  # the test kills this process with SIGKILL here
                raise SystemExit("paused and not killed within 120 s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can abort in interpreter teardown after destroy_process_group (exit -6, "terminate
    # called without an active exception"); everything is written by now, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
