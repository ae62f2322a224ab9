"""Two of Lightning's own tests, run with the package installed: its resume guard, which Lightning's
``callbacks_factory`` entry point adds to every ``Trainer``, must leave them passing (issue 25, item 8: a guard
class made at call time could not be pickled, and both failed with ``PicklingError``).

Ported from github:Lightning-AI/pytorch-lightning at commit 7f0c3436cd3f6ad3753125672024fc415cbcb414:
tests/tests_pytorch/trainer/test_dataloaders.py (``test_dataloader_distributed_sampler_already_attached``, with
``DistribSamplerCallback`` and ``ModelWithDataLoaderDistributedSampler``) and tests/tests_pytorch/loops/test_loops.py
(``test_restart_from_last_with_val_parity``, with ``RangeDataset``, ``PredictableBoringModel`` and
``compare_state_dicts``). The code is upstream's but for the adaptations marked. Each test first checks that the
guard is among the Trainer's callbacks, so that it runs under it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from tests.lightning.lightning_harness import PACKAGE, Callback, ModelCheckpoint, Trainer, install_resume_guard

if PACKAGE == "pytorch_lightning":
    from pytorch_lightning import seed_everything
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.utilities.types import STEP_OUTPUT
else:
    from lightning.pytorch import seed_everything
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.utilities.types import STEP_OUTPUT


def guard_names(trainer: Trainer) -> list[str]:
    """Adaptation: the guard's class in the Trainer's callbacks, once for each distribution that declares the entry
    point (the package's install, and install_resume_guard's for a checkout that is not installed)."""
    return [
        type(callback).__name__ for callback in trainer.callbacks if "stateful_sampler" in type(callback).__module__
    ]  # type: ignore[attr-defined]


# --- tests/tests_pytorch/trainer/test_dataloaders.py


class DistribSamplerCallback(Callback):
    def __init__(self, expected_seeds=(0, 0, 0)):  # type: ignore[no-untyped-def]
        self.expected_seed = expected_seeds

    def on_train_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        train_sampler = trainer.train_dataloader.sampler
        assert isinstance(train_sampler, DistributedSampler)
        assert train_sampler.shuffle
        assert train_sampler.seed == self.expected_seed[0]

    def on_validation_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        val_sampler = trainer.val_dataloaders.sampler
        assert isinstance(val_sampler, DistributedSampler)
        assert not val_sampler.shuffle
        assert val_sampler.seed == self.expected_seed[1]

    def on_test_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        test_sampler = trainer.test_dataloaders.sampler
        assert isinstance(test_sampler, DistributedSampler)
        assert not test_sampler.shuffle
        assert test_sampler.seed == self.expected_seed[2]


class ModelWithDataLoaderDistributedSampler(BoringModel):
    def train_dataloader(self):  # type: ignore[no-untyped-def]
        dataloader = super().train_dataloader()
        dist_sampler = DistributedSampler(dataloader.dataset, shuffle=True, seed=11)
        return DataLoader(dataloader.dataset, batch_size=32, drop_last=False, sampler=dist_sampler, shuffle=False)


@pytest.mark.slow
def test_dataloader_distributed_sampler_already_attached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Test DistributedSampler and it's arguments for DDP backend when DistSampler already included on dataloader."""
    install_resume_guard(monkeypatch, tmp_path / "entry-points")  # adaptation: as pip installs it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # adaptation: the spawned processes share 2 cores
    seed_everything(123)
    model = ModelWithDataLoaderDistributedSampler()
    trainer = Trainer(
        accelerator="cpu",  # adaptation: upstream runs on 2 GPUs; here 2 CPU processes (gloo)
        devices=2,
        num_nodes=1,
        strategy="ddp_spawn",
        default_root_dir=tmp_path,
        max_steps=10,  # adaptation: upstream's 100 (each step is an epoch with a validation) take 2 min on 2 CPUs
        callbacks=[DistribSamplerCallback(expected_seeds=(11, 123, 0))],
        use_distributed_sampler=True,
    )
    assert set(guard_names(trainer)) == {"StatefulSamplerResumeGuard"}  # adaptation
    trainer.fit(model)
    assert trainer.state.finished, "DDP Training failed"


# --- tests/tests_pytorch/loops/test_loops.py


def compare_state_dicts(dict1, dict2):  # type: ignore[no-untyped-def]
    def compare_leaves(d1, d2):  # type: ignore[no-untyped-def]
        result = {}
        all_keys = set(d1.keys()).union(d2.keys())

        for key in all_keys:
            val1 = d1.get(key, None)
            val2 = d2.get(key, None)

            if isinstance(val1, dict) and isinstance(val2, dict):
                res = compare_leaves(val1, val2)
                if res:
                    result[key] = res
            elif isinstance(val1, dict) or isinstance(val2, dict):
                raise ValueError("dicts have different leaves")
            elif isinstance(val1, torch.Tensor) and isinstance(val2, torch.Tensor):
                diff = torch.norm(val1 - val2)
                if diff > 1e-8:
                    result[key] = f"{diff} > 1e-8"
            elif isinstance(val1, float) and isinstance(val2, float):
                if abs(val1 - val2) > 1e-8:
                    result[key] = f"{val1} != {val2}"
            elif val1 != val2:
                result[key] = f"{val1} != {val2}"
        return result

    return compare_leaves(dict1, dict2)


class RangeDataset(torch.utils.data.Dataset):
    def __init__(self, size: int, length: int):
        self.len = length
        data = torch.arange(0, size) / size
        self.data = data.unsqueeze(0).repeat(length, 1)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class PredictableBoringModel(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.last_loss = float("inf")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RangeDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RangeDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RangeDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RangeDataset(32, 64))

    def training_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        loss = self.step(batch)
        self.last_loss = loss
        return {"loss": loss}


def test_restart_from_last_with_val_parity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_resume_guard(monkeypatch, tmp_path / "entry-points")  # adaptation: as pip installs it
    model = PredictableBoringModel()
    checkpoint_callback = ModelCheckpoint(
        dirpath=tmp_path,
        save_last=True,
        save_top_k=-1,
    )

    trainer = Trainer(
        default_root_dir=tmp_path,
        limit_train_batches=2,
        max_epochs=4,
        callbacks=[checkpoint_callback],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        limit_val_batches=2,
        val_check_interval=2,
    )
    assert set(guard_names(trainer)) == {"StatefulSamplerResumeGuard"}  # adaptation
    trainer.fit(model)

    last_ckpt_1 = torch.load(str(tmp_path / "last.ckpt"), weights_only=True)

    trainer = Trainer(
        default_root_dir=tmp_path,
        limit_train_batches=2,
        max_epochs=2,
        callbacks=[checkpoint_callback],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        limit_val_batches=2,
        val_check_interval=2,
    )
    trainer.fit(model)

    trainer = Trainer(
        default_root_dir=tmp_path,
        limit_train_batches=2,
        max_epochs=4,
        callbacks=[checkpoint_callback],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        limit_val_batches=2,
        val_check_interval=2,
    )
    trainer.fit(model, ckpt_path=str(tmp_path / "last.ckpt"))

    last_ckpt_2 = torch.load(str(tmp_path / "last.ckpt"), weights_only=True)

    assert compare_state_dicts(last_ckpt_1["loops"], last_ckpt_2["loops"]) == {}
