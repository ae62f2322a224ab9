"""HF Accelerate, 2 CPU processes launched by ``accelerate launch`` (torchrun, gloo): examples/accelerate_train.py.

The SIGKILL mid-epoch and resume, every batch and the final weights against an uninterrupted run, is
``stateful-sampler verify`` on the example in tests/test_examples.py."""

from __future__ import annotations

from pathlib import Path

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
    loader = DataLoader(range(20), sampler=sampler, batch_size=2)
    with pytest.raises(DoubleShardingError, match=r"accelerator.prepare shards the batches of a StatefulSampler that "
                       r"already shards over num_replicas=2: .* stateful_sampler.accelerate.prepare_loader\(accelerator, "
                       r"loader\)"):  # fmt: skip
        prepare_data_loader(loader, num_processes=2, process_index=0)


def test_a_seedable_sampler_prepare_shards_twice_and_resumable_loader_refuses_it() -> None:
    """With use_seedable_sampler Accelerate sets no generator on the sampler, so the refusal comes from the loader."""
    sampler = StatefulSampler(20, batch_size=2, num_replicas=2, rank=0)
    loader = DataLoader(range(20), sampler=sampler, batch_size=2)
    shard = prepare_data_loader(loader, num_processes=2, process_index=0, use_seedable_sampler=True)
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


PREPARE_RUN = ["python", "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
               "1", "--mixed_precision", "no", "--dynamo_backend", "no", "tests/integrations/accelerate_prepare_run.py"]  # fmt: skip


@pytest.mark.slow
def test_accelerate_s_own_prepare_of_a_stateful_sampler_loader_on_two_processes_is_refused_naming_prepare_loader(
    tmp_path: Path,
) -> None:
    """Issue 20, item 3: accelerator.prepare(model, optimizer, loader) sharded the sampler's share a second time
    (each of 2 ranks saw 10 of 40 records) without a word."""
    result = run(PREPARE_RUN, tmp_path / "records")
    errors = sorted((tmp_path / "records").glob("rank*.error"))
    assert result.records == {} or all(not batches for batches in result.records.values())
    assert [path.name for path in errors] == ["rank0.error", "rank1.error"]
    for path in errors:
        message = path.read_text().splitlines()[0]
        assert message.startswith("DoubleShardingError: "), message
        assert "stateful_sampler.accelerate.prepare_loader(accelerator, loader)" in message
