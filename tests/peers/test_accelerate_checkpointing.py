"""Accelerate's own ``test_can_resume_training`` with a ``StatefulSampler`` as the train loader's sampler (issue 17,
item 1): its loop calls no ``set_epoch``, and the state is saved after whole epochs, outside the loop.

Ported from github:huggingface/accelerate, tests/test_state_checkpointing.py (``CheckpointTest.test_can_resume_training``)
at commit 16cb6eb80dd9aa8b4df1a63ef57863e455d53b83. One process, as upstream runs it in CI.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stateful_sampler import StatefulSampler
from tests.lightning.lightning_harness import WORKERS

accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import ProjectConfiguration, set_seed

from stateful_sampler.accelerate import prepare_loader

BATCH_SIZE = 16


def dummy_dataloaders(num_workers: int, a: int = 2, b: int = 3, n_train_batches: int = 10, n_valid_batches: int = 2):
    """Upstream's, but the train loader's ``shuffle=True`` is a ``StatefulSampler`` (adaptation: that is what is
    under test), and ``num_workers`` is 0 or 2 (upstream: 4)."""

    def get_dataset(n_batches: int) -> TensorDataset:
        x = torch.randn(BATCH_SIZE * n_batches, 1)
        return TensorDataset(x, a * x + b + 0.1 * torch.randn(BATCH_SIZE * n_batches, 1))

    train_dataset = get_dataset(n_train_batches)
    valid_dataset = get_dataset(n_valid_batches)
    sampler = StatefulSampler(train_dataset, seed=42, batch_size=BATCH_SIZE)
    train_dataloader = DataLoader(train_dataset, sampler=sampler, batch_size=BATCH_SIZE, num_workers=num_workers)
    valid_dataloader = DataLoader(valid_dataset, shuffle=False, batch_size=BATCH_SIZE, num_workers=num_workers)
    return train_dataloader, valid_dataloader


def train(num_epochs: int, model: nn.Module, dataloader: Any, optimizer: Any, accelerator: Accelerator) -> list[float]:
    """Upstream's loop, unchanged: no set_epoch. Adaptation: it also returns the first record of each batch."""
    rands = []
    for epoch in range(num_epochs):
        model.train()
        for batch in dataloader:
            x, y = batch
            outputs = model(x)
            loss = torch.nn.functional.mse_loss(outputs, y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            SEEN.append(x[0].item())
        rands.append(random.random())  # Introduce some randomness
    return rands


SEEN: list[float] = []


class DummyModel(nn.Module):
    "Simple model to do y=mx+b"

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(1))
        self.b = nn.Parameter(torch.randn(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Upstream's AccelerateTestCase resets Accelerate's singletons around each test."""
    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


def prepare(accelerator: Accelerator, num_workers: int) -> tuple[nn.Module, Any, Any, Any]:
    """Adaptation: upstream's ``accelerator.prepare(model, optimizer, train, valid)``, but the train loader goes
    through ``prepare_loader``, which registers it for ``save_state`` (Accelerate's own prepare does not save
    a custom sampler's position, and on several processes shards its batches a second time)."""
    model = DummyModel()
    optimizer = torch.optim.Adam(params=model.parameters(), lr=1e-3)
    train_dataloader, valid_dataloader = dummy_dataloaders(num_workers)
    model, optimizer, valid_dataloader = accelerator.prepare(model, optimizer, valid_dataloader)
    return model, optimizer, prepare_loader(accelerator, train_dataloader), valid_dataloader


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("use_safetensors", [True, False], ids=["use_safetensors", "use_pytorch"])
def test_can_resume_training(num_workers: int, use_safetensors: bool, tmp_path: Path) -> None:
    tmpdir = str(tmp_path)
    set_seed(42)
    project_config = ProjectConfiguration(automatic_checkpoint_naming=True)

    # Train baseline
    accelerator = Accelerator(project_dir=tmpdir, project_config=project_config, cpu=True)
    model, optimizer, train_dataloader, valid_dataloader = prepare(accelerator, num_workers)
    # Save initial
    accelerator.save_state(safe_serialization=use_safetensors)
    (a, b) = model.a.item(), model.b.item()
    opt_state = optimizer.state_dict()
    SEEN.clear()
    ground_truth_rands = train(3, model, train_dataloader, optimizer, accelerator)
    ground_truth_seen = list(SEEN)
    (a1, b1) = model.a.item(), model.b.item()
    opt_state1 = optimizer.state_dict()

    # Train partially
    AcceleratorState._reset_state(True)  # upstream's second Accelerator comes after the test case's own reset
    PartialState._reset_state()
    set_seed(42)
    project_config = ProjectConfiguration(iteration=1, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_dir=tmpdir, project_config=project_config, cpu=True)
    model, optimizer, train_dataloader, _valid_dataloader = prepare(accelerator, num_workers)
    accelerator.load_state(os.path.join(tmpdir, "checkpoints", "checkpoint_0"))
    (a2, b2) = model.a.item(), model.b.item()
    opt_state2 = optimizer.state_dict()
    assert a == a2
    assert b == b2
    assert opt_state == opt_state2

    SEEN.clear()
    test_rands = train(2, model, train_dataloader, optimizer, accelerator)
    # Save everything
    accelerator.save_state(safe_serialization=use_safetensors)

    # Load everything back in and make sure all states work
    accelerator.load_state(os.path.join(tmpdir, "checkpoints", "checkpoint_1"))
    test_rands += train(1, model, train_dataloader, optimizer, accelerator)
    (a3, b3) = model.a.item(), model.b.item()
    opt_state3 = optimizer.state_dict()
    assert SEEN == ground_truth_seen  # adaptation: every batch of the 3 epochs, in order, 10 an epoch
    assert len(SEEN) == 30
    assert a1 == a3
    assert b1 == b3
    assert opt_state1 == opt_state3
    assert ground_truth_rands == test_rands
