"""Lightning Fabric, 2 CPU processes (DDP, gloo), 2 DataLoader workers each: examples/fabric_train.py.

The SIGKILL mid-epoch and resume, every batch and the final weights against an uninterrupted run, is
``stateful-sampler verify`` on the example in tests/docs/test_examples.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.harness import Run, assert_each_epoch_is_split_without_overlap, run

pytest.importorskip("lightning.fabric")

SCRIPT = ["python", "examples/fabric_train.py"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("fabric-reference")
    return run([*SCRIPT, "--root", str(root)], root / "records")


@pytest.mark.slow
def test_fabric_keeps_the_sampler_so_the_ranks_split_each_epoch_without_overlap(reference: Run) -> None:
    assert [len(batches) for batches in reference.records.values()] == [26, 26]
    assert_each_epoch_is_split_without_overlap(reference.records, size=203, epochs=2)
    padded = [batch for batches in reference.records.values() for batch in batches if any(batch["padding"])]
    assert [sum(batch["padding"]) for batch in padded] == [1, 1]  # 203 records on 2 ranks: one marked repeat an epoch


def test_a_sampler_built_for_another_world_size_is_refused_by_setup_dataloader() -> None:
    from lightning.fabric import Fabric
    from torch.utils.data import DataLoader

    from stateful_sampler import StatefulSampler
    from stateful_sampler.fabric import setup_dataloader

    fabric = Fabric(accelerator="cpu", devices=1)
    sampler = StatefulSampler(10, batch_size=2, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"shards over num_replicas=2 but Fabric runs world_size=1 processes"):
        setup_dataloader(fabric, DataLoader(range(10), sampler=sampler, batch_size=2))


def test_fabric_s_own_pass_count_does_not_rewind_a_restored_epoch() -> None:
    from lightning.fabric import Fabric
    from torch.utils.data import DataLoader

    from stateful_sampler import StatefulSampler
    from stateful_sampler.fabric import setup_dataloader

    fabric = Fabric(accelerator="cpu", devices=1)
    saved = StatefulSampler(12, batch_size=4)
    saved.set_epoch(3)
    expected = saved.indices().reshape(3, 4).tolist()
    restored = setup_dataloader(fabric, DataLoader(range(12), sampler=StatefulSampler(12, batch_size=4), batch_size=4))
    restored.load_state_dict({"version": 1, "sampler": saved.state_dict()})
    assert [batch.tolist() for batch in restored] == expected  # Fabric alone sets epoch 0 on its first pass


def _fabric_run(tmp_path: Path, rng_states: bool, stop_at: int | None, resume: bool) -> tuple[list[list[int]], Any]:
    """3 epochs of 5 batches through a model with dropout; save after step ``stop_at`` and stop there, or
    resume from that save; returns the batches trained in this run and the model."""
    from lightning.fabric import Fabric
    from torch.utils.data import DataLoader

    from stateful_sampler import StatefulSampler
    from stateful_sampler.fabric import setup_dataloader

    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(7)
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.arange(20, dtype=torch.float32).unsqueeze(1) / 20
    loader = setup_dataloader(
        fabric, DataLoader(data, sampler=StatefulSampler(20, batch_size=4, seed=1), batch_size=4), rng_states=rng_states
    )
    state = {"model": model, "optimizer": optimizer, "loader": loader}
    step, seen = 0, []
    if resume:
        remainder = fabric.load(tmp_path / "checkpoint.pt", state)
        step = remainder["step"]
    for epoch in range(loader.epoch, 3):
        loader.set_epoch(epoch)
        for batch in loader:
            loss = model(batch).pow(2).mean()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            seen.append((batch * 20).round().int().flatten().tolist())
            if step == stop_at:
                fabric.save(tmp_path / "checkpoint.pt", {**state, "step": step})
                return seen, model
    return seen, model


@pytest.mark.parametrize("stop_at", [7, 10], ids=["mid-epoch", "epoch-end"])
def test_fabric_resumes_a_model_with_dropout_bitwise_through_the_loader_state(stop_at: int, tmp_path: Path) -> None:
    """Issue 17, item 8: fabric.save holds no RNG states; the loader's state carries them (on by default)."""
    uninterrupted, reference = _fabric_run(tmp_path / "a", True, None, False)
    (tmp_path / "b").mkdir()
    before, _ = _fabric_run(tmp_path / "b", True, stop_at, False)
    after, resumed = _fabric_run(tmp_path / "b", True, None, True)
    assert before + after == uninterrupted
    for mine, theirs in zip(resumed.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)


def test_without_rng_states_the_same_batches_give_other_weights(tmp_path: Path) -> None:
    """Control: the data resumes exactly either way; only the RNG states make the dropout the same."""
    uninterrupted, reference = _fabric_run(tmp_path / "a", False, None, False)
    (tmp_path / "b").mkdir()
    before, _ = _fabric_run(tmp_path / "b", False, 7, False)
    after, resumed = _fabric_run(tmp_path / "b", False, None, True)
    assert before + after == uninterrupted
    assert not all(torch.equal(mine, theirs) for mine, theirs in zip(resumed.parameters(), reference.parameters()))
