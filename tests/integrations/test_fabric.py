"""Lightning Fabric, 2 CPU processes (DDP, gloo), 2 DataLoader workers each: examples/fabric_train.py.

The SIGKILL mid-epoch and resume, every batch and the final weights against an uninterrupted run, is
``stateful-sampler verify`` on the example in tests/test_examples.py."""

from __future__ import annotations

import pytest

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
