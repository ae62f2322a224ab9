"""Lightning: exact mid-epoch resume takes one callback and a step-based checkpoint.

    python examples/lightning_train.py --root runs/example   # trains; stop it any time (Ctrl-C, kill -9)
    python examples/lightning_train.py --root runs/example   # resumes from last.ckpt, exactly

``SamplerCheckpoint`` saves the position training consumed in the ``StatefulSampler`` and restores
it before the resumed run draws its first batch; ``ModelCheckpoint(every_n_train_steps=...,
save_last=True)`` writes the ``last.ckpt`` that ``ckpt_path="last"`` resumes from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from stateful_sampler.demo.datamodule import DigitsDataModule
from stateful_sampler.demo.model import DigitsClassifier
from stateful_sampler.lightning import SamplerCheckpoint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("runs/lightning-example"), help="checkpoints go here")
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args(argv)
    seed_everything(1234)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.max_epochs,
        deterministic=True,
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        callbacks=[
            SamplerCheckpoint(),
            ModelCheckpoint(dirpath=args.root / "checkpoints", every_n_train_steps=20, save_last=True, save_top_k=0),
        ],
    )
    trainer.fit(DigitsClassifier(), DigitsDataModule(num_workers=args.num_workers), ckpt_path="last")
    print(f"trained to step {trainer.global_step}, epoch {trainer.current_epoch}; last checkpoint in {args.root}")


if __name__ == "__main__":
    main()
