"""TorchElastic: a job that ``torchrun`` restarts after a failure, on as many nodes as are left.

torchrun's agent restarts every worker when one fails (up to ``--max-restarts`` times) and, with
``--nnodes=MIN:MAX``, re-forms the group with the nodes that are still there. Each start of this
script is therefore a resume: it loads the last checkpoint if there is one, whatever world size
wrote it, and carries on with the rest of the epoch, each record once.

    # one node, 2 processes; a failed worker restarts the group from the last checkpoint
    # (the variable gives each restart a fresh rendezvous store: on torch 2.13 a restarted gloo group
    # otherwise hung or failed to connect in our tests; pytorch/pytorch#167288 looks like the same bug)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 --max-restarts 3 examples/torchrun_elastic.py --root runs/elastic

    # elastic, 1 to 2 nodes (run on each node; ROOT on a filesystem every node sees)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:2 --nproc-per-node 2 --max-restarts 3 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id job1 examples/torchrun_elastic.py --root /shared/runs/elastic

The checkpoint is one file that rank 0 writes: the model, the optimizer and the ``ResumableLoader``
state, taken on every rank with ``state_dict(every_rank=True)``: a global position, which loads at any
world size, and every rank's RNG states, which each rank gets back at the same world size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import KeyedDataset, ResumableLoader, StatefulSampler

SIZE, BATCH = 48, 2  # per rank: 6 steps an epoch on 4 processes, 12 on 2

StepHook = Callable[[dict[str, Any]], None]


def make_dataset() -> KeyedDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SIZE, 4, generator=generator)
    return KeyedDataset(TensorDataset(inputs, inputs @ torch.randn(4, 1, generator=generator)))


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def save(path: Path, state: dict[str, Any]) -> None:
    """Write-then-rename: a worker killed while saving leaves the previous checkpoint whole."""
    torch.save(state, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def train(root: Path, epochs: int, every: int, on_step: StepHook | None = None) -> None:
    """Train from ROOT/last.pt if it exists (any world size wrote it), saving every ``every`` steps."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # torchrun's agent set the rendezvous
    rank, world_size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = make_dataset()
    sampler = StatefulSampler(dataset, seed=1, batch_size=BATCH, yield_keys=True)  # shards over the group
    loader = ResumableLoader(DataLoader(dataset, sampler=sampler, batch_size=BATCH))
    checkpoint, step = root / "last.pt", 0
    if checkpoint.exists():  # every (re)start resumes: the agent restarts the script itself
        saved = torch.load(checkpoint)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
        if rank == 0:
            print(f"restart {restart}: resumed from step {step} at world size {world_size}", flush=True)
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
        for (inputs, targets), keys in loader:
            loss = nn.functional.mse_loss(model(inputs)[~keys.is_padding], targets[~keys.is_padding])
            optimizer.zero_grad()
            loss.backward()  # DDP's all-reduce: a dead peer fails it here, and torchrun restarts the group
            optimizer.step()
            step += 1
            if step % every == 0:
                loader_state = loader.state_dict(every_rank=True)  # on every rank: each rank's RNG into rank 0's
                if rank == 0:
                    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                    save(checkpoint, {**state, "loader": loader_state, "step": step})
            if on_step is not None:
                ids = keys.index[~keys.is_padding].tolist()
                on_step({"restart": restart, "world_size": world_size, "rank": rank, "step": step,
                         "epoch": epoch, "ids": ids, "loss": loss.item()})  # fmt: skip
    if rank == 0:
        (root / "final.json").write_text(json.dumps({"step": step, "weights": weights_digest(model.module)}))
        print(f"trained to step {step}; final weights {weights_digest(model.module)}", flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="ROOT/last.pt: the checkpoint every restart loads")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=3, help="save every N steps")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    train(args.root, args.epochs, args.every)


if __name__ == "__main__":
    main()
    # torch 2.13: after destroy_process_group a gloo thread still joinable at interpreter teardown
    # sometimes aborts the process ("terminate called without an active exception", exit -6), which
    # torchrun reports as a failed run. Everything is saved and printed by now: leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
