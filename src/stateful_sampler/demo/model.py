"""A tiny classifier for ``DigitsDataModule``: small enough to train in seconds on a CPU."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stateful_sampler.extras import missing_extra

try:
    from lightning.pytorch import LightningModule
except ModuleNotFoundError as error:
    raise missing_extra(error, "demo", __name__) from error

from stateful_sampler.demo.datamodule import PIXELS


class DigitsClassifier(LightningModule):
    """A two-layer MLP with SGD and a learning rate that decays linearly over the run.

    The schedule reads ``trainer.estimated_stepping_batches`` in ``configure_optimizers``, the
    common pattern that makes Lightning restore loader state too early (Lightning issue #20550);
    resuming must stay exact anyway. It floors at a tenth of the rate rather than failing like
    ``OneCycleLR`` when a resumed run trains longer. Padding records (``tail='pad'`` under DDP)
    are masked out of the loss.
    """

    def __init__(self, hidden: int = 32, learning_rate: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(PIXELS, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.learning_rate = learning_rate

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (images, labels), keys = batch
        losses = nn.functional.cross_entropy(self.net(images), labels, reduction="none")
        real = (~keys.is_padding).float()
        loss = (losses * real).sum() / real.sum().clamp(min=1.0)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.learning_rate, momentum=0.9)
        total_steps = max(int(self.trainer.estimated_stepping_batches), 1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.1, 1.0 - step / total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
