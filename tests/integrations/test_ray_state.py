"""``stateful_sampler.ray.restore`` from a checkpoint folder, in this process (no cluster): what it reads, what it
refuses. The reports under a real cluster are tests/integrations/test_ray.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

pytest.importorskip("ray.train")

from ray.train import Checkpoint  # after importorskip: needs ray

from stateful_sampler import IncompatibleStateError, ResumableLoader, StatefulSampler
from stateful_sampler.ray import STATE_FILE, restore


def loader(workers: int = 0) -> ResumableLoader:
    return ResumableLoader(DataLoader(range(30), sampler=StatefulSampler(30, seed=3, batch_size=4), batch_size=4,
                                      num_workers=workers))  # fmt: skip


def saved_after(batches: int, folder: Path) -> list[list[int]]:
    """A loader's state after ``batches`` batches, in ``folder`` as ``report`` writes it; the batches it has left."""
    live = loader()
    taken = iter(live)
    for _ in range(batches):
        next(taken)
    (folder / STATE_FILE).write_text(json.dumps(live.state_dict(every_rank=True)))
    return [batch.tolist() for batch in taken]


@pytest.mark.parametrize("as_checkpoint", [False, True])
def test_a_resumable_loader_restored_from_a_checkpoint_or_its_path_goes_on_with_the_saved_ones_batches(
    tmp_path: Path, as_checkpoint: bool
) -> None:
    rest = saved_after(3, tmp_path)
    resumed = loader(workers=2)
    assert restore(resumed, Checkpoint.from_directory(str(tmp_path)) if as_checkpoint else tmp_path) is True
    assert [batch.tolist() for batch in resumed] == rest
    assert len(rest) == 5  # 30 records, 8 batches of 4 (the last of 2): 3 consumed


def test_a_plain_dataloader_over_the_sampler_is_restored_too(tmp_path: Path) -> None:
    rest = saved_after(2, tmp_path)
    plain = DataLoader(range(30), sampler=StatefulSampler(30, seed=3, batch_size=4), batch_size=4)
    assert restore(plain, str(tmp_path)) is True
    assert [batch.tolist() for batch in plain] == rest


def test_a_checkpoint_without_the_loader_state_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"weights")
    with pytest.raises(IncompatibleStateError, match=r"'stateful_sampler.json': saved '<missing>'.*not reported by"):
        restore(loader(), tmp_path)


def test_a_state_of_another_order_is_refused_before_anything_changes(tmp_path: Path) -> None:
    saved_after(2, tmp_path)
    other = ResumableLoader(DataLoader(range(31), sampler=StatefulSampler(31, seed=3, batch_size=4), batch_size=4))
    with pytest.raises(IncompatibleStateError, match="size"):
        restore(other, tmp_path)
    assert len(other) == 8 and other.epoch == 0  # untouched: the whole of epoch 0 left
