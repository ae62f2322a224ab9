"""Lightning DDP on CPU: 2 processes (gloo), each drawing its shard from the same StatefulSampler.

    python examples/lightning_ddp.py --root runs/ddp-example   # run it again to resume from last.ckpt

``StatefulSampler`` subclasses ``DistributedSampler``, so with ``use_distributed_sampler`` left at
its default Lightning keeps it as it is, neither replaced nor wrapped; it reads rank and world
size from the process group. Rank r takes global positions r, r+2, r+4, ... of each epoch's order,
and ``tail="pad"`` pads the 1797 records to 1798 with one marked repeat, masked out of the loss.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

from stateful_sampler import StatefulSampler
from stateful_sampler.demo.datamodule import DigitsDataModule
from stateful_sampler.demo.model import DigitsClassifier
from stateful_sampler.lightning import SamplerCheckpoint


class ShowShard(Callback):
    """Prints, per rank, that the train loader still holds our sampler and which share it draws."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sampler = trainer.train_dataloader.sampler
        kept = "kept" if type(sampler) is StatefulSampler else f"REPLACED by {type(sampler).__name__}"
        print(
            f"rank {trainer.global_rank}: epoch {trainer.current_epoch}, StatefulSampler {kept}, "
            f"{len(sampler)} of {sampler.total_size} positions, first indices {sampler.indices()[:4].tolist()}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("runs/ddp-example"), help="checkpoints go here")
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args(argv)
    seed_everything(1234)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=args.max_epochs,
        deterministic=True,
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            SamplerCheckpoint(),
            ModelCheckpoint(dirpath=args.root / "checkpoints", every_n_train_steps=10, save_last=True, save_top_k=0),
            ShowShard(),
        ],
    )
    trainer.fit(DigitsClassifier(), DigitsDataModule(num_workers=args.num_workers), ckpt_path="last")


if __name__ == "__main__":
    main()
