"""A real, tiny dataset and its datamodule for the configs, examples and demo.

scikit-learn's handwritten digits (1797 images of 8x8 pixels) ship inside the scikit-learn
package, so nothing is downloaded. Each sample gets noise from ``torch.rand`` in ``__getitem__``,
seeded from (seed, epoch, index): a resumed run must reproduce that noise exactly, and a
fingerprint of the batch shows it when it does not (``SeededDataset`` seeds it per sample).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from stateful_sampler.extras import missing_extra
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.seeding import SeededDataset

try:
    from lightning.pytorch import LightningDataModule
except ModuleNotFoundError as error:
    raise missing_extra(error, "demo", __name__) from error

PIXELS = 64


class NoisyDigits(Dataset):
    """Digit images as 64 floats in [0, 1], plus ``noise * torch.rand(64)``, and their labels."""

    def __init__(self, noise: float = 0.1) -> None:
        try:
            from sklearn.datasets import load_digits
        except ModuleNotFoundError as error:
            raise missing_extra(error, "demo", "the demo's digits") from error

        images, labels = load_digits(return_X_y=True)
        self.images = torch.tensor(images / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(labels, dtype=torch.int64)
        self.noise = noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index] + self.noise * torch.rand(PIXELS), self.labels[index]


class DigitsDataModule(LightningDataModule):
    """Train batches ``[(images, labels), keys]`` drawn by a ``StatefulSampler``."""

    def __init__(
        self,
        batch_size: int = 32,
        num_workers: int = 0,
        persistent_workers: bool = False,
        seed: int = 0,
        tail: str = "pad",
        noise: float = 0.1,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self.seed = seed
        self.tail = tail
        self.noise = noise
        self.dataset: SeededDataset | None = None

    def setup(self, stage: str) -> None:
        self.dataset = SeededDataset(NoisyDigits(self.noise))

    def train_dataloader(self) -> DataLoader:
        if self.dataset is None:
            raise RuntimeError("DigitsDataModule.train_dataloader() called before setup('fit')")
        sampler = StatefulSampler(
            self.dataset, seed=self.seed, tail=self.tail, batch_size=self.batch_size, yield_keys=True
        )
        return DataLoader(
            self.dataset,
            sampler=sampler,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )
