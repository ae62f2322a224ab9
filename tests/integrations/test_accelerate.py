"""HF Accelerate, 2 CPU processes launched by ``accelerate launch`` (torchrun, gloo): examples/accelerate_train.py.

The SIGKILL mid-epoch and resume, every batch and the final weights against an uninterrupted run, is
``stateful-sampler verify`` on the example in tests/docs/test_examples.py; so is the ranks' split of each epoch without
overlap, asserted on the uninterrupted run verify makes there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler, TokenBudgetBatches
from stateful_sampler.loader import DoubleShardingError
from stateful_sampler.stream import ShardedStream
from tests.integrations.harness import read_records, run
from tests.stream_helpers import Rows

accelerate = pytest.importorskip("accelerate")
from accelerate.data_loader import prepare_data_loader

from stateful_sampler.accelerate import prepare_loader
from tests.integrations.accelerate_configs_run import CONFIGS, PREPARE_ALL, records


def test_accelerate_s_own_prepare_would_shard_the_sampler_twice_and_is_refused() -> None:
    sampler = StatefulSampler(20, batch_size=2, num_replicas=2, rank=0)
    loader = DataLoader(range(20), sampler=sampler, batch_size=2)
    with pytest.raises(DoubleShardingError, match=r"accelerator.prepare shards the batches of a StatefulSampler that "
                       r"already shards over num_replicas=2: .* stateful_sampler.accelerate.prepare_loader\(accelerator, "
                       r"loader\)"):  # fmt: skip
        prepare_data_loader(loader, num_processes=2, process_index=0)


def test_a_seedable_sampler_prepare_is_refused_at_the_first_batch_and_resumable_loader_refuses_it() -> None:
    """Issue 25, item 1: with use_seedable_sampler Accelerate sets no generator on the sampler, and each rank got
    every other batch of its share without an error. The BatchSamplerShard is refused when the pass starts."""
    sampler = StatefulSampler(20, batch_size=2, num_replicas=2, rank=0)
    loader = DataLoader(range(20), sampler=sampler, batch_size=2)
    shard = prepare_data_loader(loader, num_processes=2, process_index=0, use_seedable_sampler=True)
    with pytest.raises(DoubleShardingError, match=r"^BatchSamplerShard \(num_processes=2\) deals to the processes what "
                       r"it takes from a StatefulSampler that already shards over num_replicas=2: each rank would see "
                       r"1/2 of its share; prepare the loader with stateful_sampler.accelerate.prepare_loader"
                       r"\(accelerator, loader\)$"):  # fmt: skip
        next(iter(shard))
    with pytest.raises(DoubleShardingError, match=r"BatchSamplerShard \(num_processes=2\) shards the batches of a "
                       r"StatefulSampler that already shards over num_replicas=2"):  # fmt: skip
        ResumableLoader(shard)


def test_a_token_budget_batch_sampler_prepared_by_accelerate_is_refused() -> None:
    """A batch sampler has no .sampler, so Accelerate set no generator on it even by default; each rank saw 9
    records and 1 of its share of 20 (BatchSamplerShard keeps only batches of its batch_size, 1)."""
    batches = TokenBudgetBatches([3] * 40, max_tokens=12, num_replicas=2, rank=0)
    shard = prepare_data_loader(DataLoader(range(40), batch_sampler=batches), num_processes=2, process_index=0)
    with pytest.raises(DoubleShardingError, match=r"^BatchSamplerShard \(num_processes=2\) .* TokenBudgetBatches"):
        next(iter(shard))


def test_a_stream_sharded_again_by_iterable_dataset_shard_is_refused() -> None:
    stream = ShardedStream(["0", "1"], Rows([10, 10]), batch_size=2, num_replicas=2, rank=0)
    shard = prepare_data_loader(stream.loader(), num_processes=2, process_index=0, dispatch_batches=False)
    with pytest.raises(DoubleShardingError, match=r"^IterableDatasetShard \(num_processes=2\) .* ShardedStream"):
        next(iter(shard))


def test_a_sampler_on_one_replica_is_sharded_by_accelerate_alone_and_not_refused() -> None:
    """Built before the process group (num_replicas=1), the sampler's order is dealt once, by Accelerate."""
    sampler = StatefulSampler(20, batch_size=2, num_replicas=1, rank=0)
    order = sampler.indices().tolist()
    loader = DataLoader(range(20), sampler=sampler, batch_size=2)
    shard = prepare_data_loader(loader, num_processes=2, process_index=1, use_seedable_sampler=True)
    assert [batch.tolist() for batch in shard] == [order[start : start + 2] for start in range(2, 20, 4)]


def test_prepare_loader_refuses_a_batch_sampler_as_the_sampler_naming_batch_sampler() -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    batch_sampler = BatchSampler(StatefulSampler(8, batch_size=2), 2, drop_last=False)
    with pytest.raises(TypeError, match=r"pass it as DataLoader\(dataset, batch_sampler=...\)$"):
        prepare_loader(accelerator, DataLoader(torch.arange(8), sampler=batch_sampler, batch_size=None))


def test_prepare_loader_refuses_a_stream_under_use_stateful_dataloader() -> None:
    config = accelerate.DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
    stream = ShardedStream(["0", "1"], Rows([10, 10]), batch_size=2)
    with pytest.raises(ValueError, match=r"use DataLoaderConfiguration\(use_stateful_dataloader=False\)$"):
        prepare_loader(accelerator, stream.loader())


def test_split_batches_is_refused_because_the_sampler_already_gives_each_process_its_own_batches() -> None:
    config = accelerate.DataLoaderConfiguration(split_batches=True)
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
    loader = DataLoader(range(8), sampler=StatefulSampler(8, batch_size=2), batch_size=2)
    with pytest.raises(ValueError, match=r"use split_batches=False and the per-process batch_size"):
        prepare_loader(accelerator, loader)


# `--cpu` alone runs one process unless MPI is installed; `--multi_gpu` picks Accelerate's torchrun launcher,
# and the scripts' Accelerator(cpu=True) keeps them on the CPU with gloo.
CONFIGS_RUN = ["python", "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
               "1", "--mixed_precision", "no", "--dynamo_backend", "no", "tests/integrations/accelerate_configs_run.py"]  # fmt: skip


@pytest.fixture(scope="module")
def configurations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch on 2 processes of every configuration below that all ranks reach (not ``LONE``), then
    accelerate_prepare_run.py's ``accelerator.prepare(model, optimizer, loader)``: each its own directory."""
    out = tmp_path_factory.mktemp("accelerate-configurations")
    run([*CONFIGS_RUN, ",".join([*(name for name in CONFIGS if name not in LONE), PREPARE_ALL])], out)
    return out


@pytest.mark.slow
def test_accelerate_s_own_prepare_of_a_stateful_sampler_loader_on_two_processes_is_refused_naming_prepare_loader(
    configurations: Path,
) -> None:
    """Issue 20, item 3: accelerator.prepare(model, optimizer, loader) sharded the sampler's share a second time
    (each of 2 ranks saw 10 of 40 records) without a word."""
    records = read_records(configurations / PREPARE_ALL)
    errors = sorted((configurations / PREPARE_ALL).glob("rank*.error"))
    assert records == {} or all(not batches for batches in records.values())
    assert [path.name for path in errors] == ["rank0.error", "rank1.error"]
    for path in errors:
        message = path.read_text().splitlines()[0]
        assert message.startswith("DoubleShardingError: "), message
        assert "stateful_sampler.accelerate.prepare_loader(accelerator, loader)" in message


# Configurations in which some ranks never reach the sampler before one of Accelerate's collectives: with
# dispatch_batches and no workers only process 0 draws, and a batch sampler gets no set_epoch from the dispatcher.
# Process 0 refuses and exits; the launcher stops the rest. With a BatchSampler as the sampler the dispatcher drops
# it (Accelerate builds its loader without it), and fails on its own.
LONE = {
    "batch_sampler-dispatch-w0": "DoubleShardingError: DataLoaderDispatcher (num_processes=2) ",
    "batch_sampler-dispatch-split-w0": "DoubleShardingError: DataLoaderDispatcher (num_processes=2) ",
    "batch_sampler_as_sampler-dispatch-w0": "RuntimeError: You can't use batches of different size",
    "batch_sampler_as_sampler-dispatch-w2": "RuntimeError: You can't use batches of different size",
}
# Refused by Accelerate itself before anything reaches the sampler (on every rank, at prepare).
ACCELERATE_REFUSES = {
    "batch_sampler-seedable-split": "ValueError: To use `BatchSamplerShard` in `split_batches` mode",
    "batch_sampler_as_sampler-seedable-split": "ValueError: In order to use `split_batches==True`",
    "batch_sampler_as_sampler-dispatch-split": "ValueError: In order to use `split_batches==True`",
}
OURS_REFUSES = {
    "ours-batch_sampler_as_sampler": "TypeError: DataLoader(sampler=BatchSampler(...), batch_size=None)",
    "ours-stream-seedable-stateful": "ValueError: use_stateful_dataloader=True builds torchdata's",
}


def configs_outcome(directory: Path, name: str) -> dict[int, dict]:
    return {
        int(path.stem.removeprefix("rank")): json.loads(path.read_text())
        for path in sorted((directory / name).glob("rank*.json"))
    }


@pytest.mark.slow
def test_every_configuration_of_prepare_is_refused_on_every_rank_and_prepare_loader_splits_each_epoch(
    configurations: Path,
) -> None:
    """Issue 25, item 1: every branch of Accelerate's prepare_data_loader that a loader over a StatefulSampler,
    a batch sampler of ours or a ShardedStream can take on 2 processes (accelerate_configs_run.py): refused with
    DoubleShardingError on each rank, before the first batch, naming prepare_loader; or refused by Accelerate
    itself. prepare_loader under the options it accepts: each rank its own half, together every record once."""
    names = [name for name in CONFIGS if name not in LONE]
    assert read_records(configurations) == {}
    for name in names:
        outcome = configs_outcome(configurations, name)
        assert sorted(outcome) == [0, 1], name
        family = name.rsplit("-w", 1)[0]
        refusal = next((text for prefix, text in {**ACCELERATE_REFUSES, **OURS_REFUSES}.items()
                        if family.startswith(prefix)), None)  # fmt: skip
        if refusal is not None:
            for rank in outcome.values():
                assert rank["records"] == [] and rank["stage"] == "prepare", name
                assert rank["error"].startswith(refusal), (name, rank["error"])
        elif name.startswith("ours-"):
            assert [rank["error"] for rank in outcome.values()] == [None, None], name
            taken = [record for rank in outcome.values() for record in rank["records"]]
            assert sorted(taken) == records(CONFIGS[name]), name
            assert [len(rank["records"]) for rank in outcome.values()] == [20, 20], name
        else:
            for rank in outcome.values():
                assert rank["records"] == [], name
                assert rank["error"].startswith("DoubleShardingError: "), (name, rank["error"])
                assert rank["error"].endswith(
                    "prepare the loader with stateful_sampler.accelerate.prepare_loader(accelerator, loader)"
                ), name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LONE))
def test_a_configuration_only_process_0_draws_is_refused_there_and_the_launch_fails(name: str, tmp_path: Path) -> None:
    run([*CONFIGS_RUN, name, "--lone"], tmp_path, expect_kill=True)
    outcome = configs_outcome(tmp_path, name)
    assert outcome[0]["records"] == [] and outcome[0]["error"].startswith(LONE[name]), outcome[0]["error"]
    assert all(rank["records"] == [] for rank in outcome.values())
