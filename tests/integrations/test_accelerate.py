"""HF Accelerate, 2 CPU processes launched by ``accelerate launch`` (torchrun, gloo): examples/accelerate_train.py.

The SIGKILL mid-epoch and resume, every batch and the final weights against an uninterrupted run, is
``stateful-sampler verify`` on the example in tests/test_examples.py."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.loader import DoubleShardingError
from tests.integrations.harness import Run, assert_each_epoch_is_split_without_overlap, run

accelerate = pytest.importorskip("accelerate")
from accelerate.data_loader import prepare_data_loader  # noqa: E402

from stateful_sampler.accelerate import prepare_loader  # noqa: E402

# `--cpu` alone runs one process unless MPI is installed; `--multi_gpu` picks Accelerate's torchrun launcher,
# and the script's Accelerator(cpu=True) keeps it on the CPU with gloo.
SCRIPT = ["python", "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "examples/accelerate_train.py"]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("accelerate-reference")
    return run([*SCRIPT, "--root", str(root)], root / "records")


@pytest.mark.slow
def test_prepared_by_the_integration_the_ranks_split_each_epoch_without_overlap(reference: Run) -> None:
    assert [len(batches) for batches in reference.records.values()] == [26, 26]
    assert_each_epoch_is_split_without_overlap(reference.records, size=203, epochs=2)


def test_accelerate_s_own_prepare_would_shard_the_sampler_twice_and_is_refused() -> None:
    sampler = StatefulSampler(20, batch_size=2, num_replicas=2, rank=0)
    shard = prepare_data_loader(DataLoader(range(20), sampler=sampler, batch_size=2), num_processes=2, process_index=0)
    share = sampler.indices().tolist()  # this rank's 10 records, in 5 batches
    assert [batch.tolist() for batch in shard] == [share[0:2], share[4:6], share[8:10]]  # every other one: 6 of 10
    with pytest.raises(DoubleShardingError, match=r"BatchSamplerShard \(num_processes=2\) shards the batches of a "
                       r"StatefulSampler that already shards over num_replicas=2"):  # fmt: skip
        ResumableLoader(shard)


def test_split_batches_is_refused_because_the_sampler_already_gives_each_process_its_own_batches() -> None:
    config = accelerate.DataLoaderConfiguration(split_batches=True)
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
    loader = DataLoader(range(8), sampler=StatefulSampler(8, batch_size=2), batch_size=2)
    with pytest.raises(ValueError, match=r"use split_batches=False and the per-process batch_size"):
        prepare_loader(accelerator, loader)
