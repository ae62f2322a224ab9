"""A tiny, deterministic Lightning run whose record is the dataset indices each training step saw.

The run saves checkpoints at chosen points. Each checkpoint carries every rank's record up to
that point, so a ``Trainer`` resumed from it continues the record, and the resumed record must
equal, exactly, the record of the run that went on uninterrupted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from stateful_sampler import KeyedDataset, StatefulSampler

# The package under test: lightning.pytorch, or the classic pytorch_lightning when this variable says
# so (.ci/run runs the callback tests under both). Tests take Lightning's classes from here.
PACKAGE_ENV = "STATEFUL_SAMPLER_TEST_PACKAGE"
PACKAGE = os.environ.get(PACKAGE_ENV, "lightning")
if PACKAGE == "pytorch_lightning":
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
    from pytorch_lightning import Callback, LightningModule, Trainer, seed_everything
    from pytorch_lightning import __version__ as VERSION
    from pytorch_lightning.callbacks import ModelCheckpoint, OnExceptionCheckpoint
    from pytorch_lightning.strategies import SingleDeviceStrategy

    from stateful_sampler.pytorch_lightning import SamplerCheckpoint
elif PACKAGE == "lightning":
    from lightning import __version__ as VERSION
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
    from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from stateful_sampler.lightning import SamplerCheckpoint
else:
    raise ValueError(f"{PACKAGE_ENV} must be 'lightning' or 'pytorch_lightning', got {PACKAGE!r}")
RELEASE = tuple(int(part) for part in VERSION.split(".")[:2])  # Lightning < 2.5 restarts loops otherwise

__all__ = [
    "RELEASE",
    "Callback",
    "DistributedSamplerWrapper",
    "LightningModule",
    "ModelCheckpoint",
    "OnExceptionCheckpoint",
    "SamplerCheckpoint",
    "SingleDeviceStrategy",
    "Trainer",
    "seed_everything",
]  # fmt: skip


class IndexDataset(Dataset):
    """Item i is (i, a feature derived from i): the batch tells which records it holds."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, torch.tensor([index / self.size], dtype=torch.float32)


@dataclass(frozen=True)
class Setup:
    """One training configuration; every field changes what the run does, nothing is random."""

    size: int = 22
    batch_size: int = 4
    tail: str = "pad"
    seed: int = 3
    keys: bool = False  # yield SampleKeys, to record which occurrences are padding
    num_workers: int = 0
    persistent_workers: bool = False
    worker_start: str | None = None  # multiprocessing context of the workers; None: the platform's default
    drop_last: bool = False
    max_epochs: int = 3
    accumulate_grad_batches: int = 1
    val_check_interval: float | int = 1.0
    validate: bool = False
    read_stepping_batches: bool = False
    callback: bool = True
    second_loader_size: int = 0  # > 0: train on {"first": ..., "second": ...}, the second one cycled
    stateful_loader: bool = False  # torchdata's StatefulDataLoader instead of a DataLoader
    dropout: float = 0.0  # > 0: nn.Dropout on the input, so training draws from torch's RNG

    def with_(self, **changes: Any) -> Setup:
        return replace(self, **changes)

    def loader(self, dataset: Dataset, sampler: Any) -> DataLoader:
        return (StatefulDataLoader if self.stateful_loader else DataLoader)(
            dataset,
            sampler=sampler,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
            multiprocessing_context=self.worker_start,
        )


# Worker processes make a test multi-process: such cases are marked slow (they still run in CI).
WORKERS = [0, pytest.param(2, marks=pytest.mark.slow, id="2")]


def setups(cases: dict[str, Setup]) -> list[Any]:
    """``cases`` as pytest parameters named by their keys, the ones with workers marked slow."""
    return [
        pytest.param(setup, id=name, marks=[pytest.mark.slow] if setup.num_workers else [])
        for name, setup in cases.items()
    ]


class RecordingModel(LightningModule):
    """Records the indices of every training step (and validation step), with their epoch."""

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        self.setup_ = setup
        self.layer = nn.Linear(1, 1)
        self.dropout = nn.Dropout(setup.dropout) if setup.dropout else nn.Identity()
        self.record: list[list[int]] = []
        self.padding: list[list[bool]] = []  # with keys: which occurrences of each step are padding
        self.epochs: list[int] = []  # the epoch of each step this process ran
        self.val_record: list[list[int]] = []
        self.train_loaders: list[DataLoader] = []

    def train_dataloader(self) -> DataLoader | dict[str, DataLoader]:
        loader = self._train_loader(self.setup_.size, self.setup_.seed)
        if not self.setup_.second_loader_size:
            return loader
        return {"first": loader, "second": self._train_loader(self.setup_.second_loader_size, self.setup_.seed + 1)}

    def _train_loader(self, size: int, seed: int) -> DataLoader:
        setup = self.setup_
        dataset: Dataset = IndexDataset(size)
        sampler = StatefulSampler(
            dataset, seed=seed, tail=setup.tail, batch_size=setup.batch_size, yield_keys=setup.keys
        )
        loader = setup.loader(KeyedDataset(dataset) if setup.keys else dataset, sampler)
        self.train_loaders.append(loader)
        return loader

    def val_dataloader(self) -> DataLoader:
        dataset = IndexDataset(10)
        loader = self.setup_.loader(dataset, StatefulSampler(dataset, shuffle=False, tail="uneven", batch_size=4))
        # Its own generator: its iter() then draws no base seed from torch's RNG, so a fit that
        # validates trains (dropout included) exactly as one that does not.
        loader.generator = torch.Generator().manual_seed(0)
        return loader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):  # the second loader's records are told apart by a minus sign
            (first, _), (second, x) = batch["first"], batch["second"]
            self.record.append(first.tolist() + [-1 - index for index in second.tolist()])
            self.epochs.append(self.current_epoch)
            return self.layer(self.dropout(x)).pow(2).mean()
        if self.setup_.keys:
            batch, keys = batch
            self.padding.append(keys.is_padding.tolist())
        index, x = batch
        self.record.append(index.tolist())
        self.epochs.append(self.current_epoch)
        return self.layer(self.dropout(x)).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        index, _ = batch
        self.val_record.append(index.tolist())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.setup_.read_stepping_batches:
            # Lightning #20550: reading this here builds the train loader before the checkpoint's
            # loops are restored (a OneCycleLR needs it).
            self.stepping_batches = self.trainer.estimated_stepping_batches
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["records"] = _gather([list(batch) for batch in self.record])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.record = checkpoint["records"][self.global_rank]


def model_with(loader: DataLoader) -> type[RecordingModel]:
    """A ``RecordingModel`` that trains on ``loader`` itself, whatever it is."""

    class Model(RecordingModel):
        def train_dataloader(self) -> DataLoader:
            return loader

    return Model


def _gather(record: list[list[int]]) -> list[list[list[int]]]:
    """Every rank's record (only rank 0 writes the checkpoint)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [record]
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


@dataclass
class SaveAt(Callback):
    """Saves ``directory/<name>.ckpt`` at chosen points of the run: after its n-th training batch
    (``batch<n>``), at the end of epoch e (``epoch<e>``), after its n-th validation
    (``validation<n>``)."""

    directory: Path
    after_batches: Sequence[int] = ()
    after_epochs: Sequence[int] = ()
    after_validations: Sequence[int] = ()
    batches: int = 0
    validations: int = 0
    saved: dict[str, Path] = field(default_factory=dict)

    def _save(self, trainer: Trainer, name: str) -> None:
        path = Path(self.directory) / f"{name}.ckpt"
        trainer.save_checkpoint(path)
        self.saved[name] = path

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.batches += 1
        if self.batches in self.after_batches:
            self._save(trainer, f"batch{self.batches}")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch in self.after_epochs:
            self._save(trainer, f"epoch{trainer.current_epoch}")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.validations += 1
        if self.validations in self.after_validations:
            self._save(trainer, f"validation{self.validations}")


def fit(
    setup: Setup,
    callbacks: Sequence[Callback] = (),
    ckpt_path: Path | str | None = None,
    *,
    model_class: type[RecordingModel] = RecordingModel,
    **trainer_args: Any,
) -> RecordingModel:
    """One ``Trainer.fit`` of ``setup`` on CPU, from scratch or from ``ckpt_path``; returns the model."""
    seed_everything(setup.seed, verbose=False)
    model = model_class(setup)
    make_trainer(setup, callbacks, **trainer_args).fit(model, ckpt_path=ckpt_path)
    return model


def make_trainer(setup: Setup, callbacks: Sequence[Callback] = (), **trainer_args: Any) -> Trainer:
    """A CPU ``Trainer`` for ``setup`` (with ``SamplerCheckpoint`` if ``setup.callback``)."""
    args: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": setup.max_epochs,
        "accumulate_grad_batches": setup.accumulate_grad_batches,
        "val_check_interval": setup.val_check_interval,
        "limit_val_batches": 1.0 if setup.validate else 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "deterministic": True,
        "callbacks": [*callbacks, *([SamplerCheckpoint()] if setup.callback else [])],
    }
    return Trainer(**{**args, **trainer_args})


def resumed_record(setup: Setup, checkpoint: Path | str, **trainer_args: Any) -> list[list[int]]:
    """The record before ``checkpoint`` followed by what a new Trainer resumed from it sees."""
    return fit(setup, ckpt_path=checkpoint, **trainer_args).record


# SamplerCheckpoint's resume guard reaches every Trainer through an entry point (pyproject.toml), which
# exists once the package is installed. Tests install it themselves, and take it away for controls
# that show what Lightning does alone.
_GUARD_FACTORY = {"lightning": "lightning_guard", "pytorch_lightning": "pytorch_lightning_guard"}[PACKAGE]
_REGISTRY = {
    "lightning": "lightning.fabric.utilities.registry",
    "pytorch_lightning": "lightning_fabric.utilities.registry",
}


def install_resume_guard(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Register the guard's entry point as pyproject.toml does, through a distribution on ``sys.path``."""
    info = directory / "stateful_sampler_guard_test-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stateful-sampler-guard-test\nVersion: 0\n")
    group = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}[PACKAGE] + ".callbacks_factory"
    entry = f"stateful_sampler = stateful_sampler.lightning.guard:{_GUARD_FACTORY}"
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    monkeypatch.syspath_prepend(str(directory))


def without_resume_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning alone: no callback factory of ours, even when the package's entry point is installed."""
    import importlib
    from importlib.metadata import entry_points

    def others(group: str) -> list[Any]:
        return [point for point in entry_points(group=group) if not point.value.startswith("stateful_sampler.")]

    monkeypatch.setattr(importlib.import_module(_REGISTRY[PACKAGE]), "entry_points", others)
