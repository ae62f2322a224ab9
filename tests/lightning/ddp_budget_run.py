"""One rank of a real 2-process DDP fit (gloo, CPU) over token-budget batches, started by
test_batch_sampler_resume.py as ``ddp_callback_run.py`` is: ``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_PORT`` set, so
Lightning's ``strategy="ddp"`` joins the ranks. ``argv`` = OUT_DIR. For each ``use_distributed_sampler`` (the
default, and off) the rank runs the uninterrupted fit (saving checkpoints), then a fresh ``Trainer``
resumed from each, and writes what it saw to OUT_DIR/<mode>_rank<r>.json, or the error to OUT_DIR/<mode>_rank<r>.error.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.lightning.ddp_callback_run import SeedPerRank, weights
from tests.lightning.lightning_harness import SaveAt, fit
from tests.lightning.test_batch_sampler_resume import BUDGET_SETUP, BudgetModel

SETUP = BUDGET_SETUP.with_(max_epochs=2)


MODES = ("default", "off")


def run(out_dir: Path, mode: str) -> None:
    ddp = {"strategy": "ddp", "devices": 2, "use_distributed_sampler": mode == "default"}
    rank = int(os.environ["LOCAL_RANK"])
    save = SaveAt(out_dir / mode, after_batches=(3,), after_epochs=(0,))
    (out_dir / mode).mkdir(parents=True, exist_ok=True)
    try:
        full = fit(SETUP, [save, SeedPerRank()], model_class=BudgetModel, **ddp)
    except Exception as error:  # noqa: BLE001 - the test reads it
        (out_dir / f"{mode}_rank{rank}.error").write_text(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return
    loader = full.trainer.train_dataloader
    report = {
        "loader_kept": loader is full.train_loaders[-1],
        "batch_sampler": [
            type(loader.batch_sampler).__name__,
            loader.batch_sampler.num_replicas,
            loader.batch_sampler.rank,
        ],
        "record": full.record,
        "epochs": full.epochs,
        "weights": weights(full),
        "resumed": {},
        "resumed_weights": {},
    }
    for name, path in sorted(save.saved.items()):
        resumed = fit(SETUP, [SeedPerRank()], ckpt_path=path, model_class=BudgetModel, **ddp)
        report["resumed"][name] = resumed.record
        report["resumed_weights"][name] = weights(resumed)
    (out_dir / f"{mode}_rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    for mode in MODES:
        run(Path(sys.argv[1]), mode)
