"""One rank of a real 2-process DDP run (gloo, CPU), started by ``test_callback_ddp.py``.

The test starts this script once per rank with ``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_PORT`` set,
as torchrun would, so Lightning's ``strategy="ddp"`` joins them instead of launching its own
processes, and one process group serves several fits. For each tail policy the rank runs the
uninterrupted fit (saving checkpoints), then a fresh ``Trainer`` resumed from each checkpoint,
and writes what it saw to ``OUT_DIR/<tail>_rank<r>.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from tests.lightning.lightning_harness import Callback, SaveAt, Setup, fit

DDP = {"strategy": "ddp", "devices": 2}

# N=21 on 2 ranks with batch 2: pad gives 11 slots a rank (6 steps, one padded slot an epoch),
# drop 10 (5 steps, one record dropped an epoch). Carry takes whole global batches of 4 from
# N=19: epochs of 4, 5 and 5 steps.
CASES = {
    "pad": (
        Setup(size=21, batch_size=2, tail="pad", keys=True, max_epochs=2, dropout=0.5),
        {"after_batches": (4,), "after_epochs": (0,)},
    ),
    # Forking a worker from a rank whose gloo threads are running can hang the child in CPython's
    # after-fork clean-up (seen here once in a few runs): start workers from a fork server.
    "pad-workers2": (
        Setup(size=21, batch_size=2, tail="pad", num_workers=2, worker_start="forkserver", max_epochs=2),
        {"after_batches": (4, 9)},
    ),
    "drop": (Setup(size=21, batch_size=2, tail="drop", max_epochs=2), {"after_batches": (7,)}),
    "carry": (
        Setup(size=19, batch_size=2, tail="carry", max_epochs=3),
        {"after_batches": (7, 12), "after_epochs": (0,)},
    ),
}


class SeedPerRank(Callback):
    """Gives each rank its own torch RNG stream at the fit's start (seed_everything gives them one), so that
    a resume which put rank 0's RNG states on every rank would change rank 1's dropout."""

    def on_fit_start(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
        torch.manual_seed(1000 + trainer.global_rank)


def weights(model) -> list[float]:  # type: ignore[no-untyped-def]
    return [*model.layer.weight.flatten().tolist(), *model.layer.bias.tolist()]


def main(out_dir: Path) -> None:
    multiprocessing.set_forkserver_preload(["tests.lightning.lightning_harness"])  # workers start in ms, not s
    for tail, (setup, points) in CASES.items():
        save = SaveAt(out_dir / tail, **points)
        (out_dir / tail).mkdir(parents=True, exist_ok=True)
        full = fit(setup, [save, SeedPerRank()], **DDP)
        trainer = full.trainer
        loader = trainer.train_dataloader
        sampler = loader.sampler
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "loader_kept": loader is full.train_loaders[-1],
            "sampler_type": type(sampler).__name__,
            "sampler_replicas": [sampler.num_replicas, sampler.rank],
            "record": full.record,
            "padding": full.padding,
            "epochs": full.epochs,
            "dropped": [sampler.dropped_indices(epoch) for epoch in range(setup.max_epochs)],
            "weights": weights(full),
        }
        resumed = {
            name: fit(setup, [SeedPerRank()], ckpt_path=path, **DDP) for name, path in sorted(save.saved.items())
        }
        report["resumed"] = {name: model.record for name, model in resumed.items()}
        report["resumed_weights"] = {name: weights(model) for name, model in resumed.items()}
        (out_dir / f"{tail}_rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
