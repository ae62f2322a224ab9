"""One epoch of each named ``accelerator.prepare`` configuration on 2 processes, for test_accelerate.py (issue 25,
item 1). ``argv``: CONFIG[,CONFIG...] ``--record`` DIR. For each configuration every rank writes
DIR/<config>/rank{R}.json: the records it was handed, in order, or the error that ``prepare`` (stage "prepare") or
the epoch (stage "iter") raised.

A configuration in which only some ranks can raise ends the process with exit code 1 after writing the error: the
other ranks wait in one of Accelerate's collectives, and the launcher stops them (``LONE`` in the test).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import BatchSampler, DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from stateful_sampler import StatefulSampler, TokenBudgetBatches
from stateful_sampler.accelerate import prepare_loader
from stateful_sampler.stream import ShardedStream
from tests.integrations.accelerate_prepare_run import main as prepare_all
from tests.stream_helpers import Rows

# Not a configuration of prepare_data_loader: accelerator.prepare(model, optimizer, loader), written to
# DIR/<PREPARE_ALL>/ as accelerate_prepare_run.py writes it (test_accelerate.py launches both scripts once).
PREPARE_ALL = "prepare-model-optimizer-loader"

SIZE, BATCH = 40, 4
STREAM_COUNTS = [10, 10, 10, 10]  # records 0..9, 100..109, 200..209, 300..309


@dataclass(frozen=True)
class Config:
    """A loader shape, Accelerate's ``DataLoaderConfiguration`` and ``prepare`` options, and who prepares it."""

    loader: str  # "sampler", "batch_sampler" (TokenBudgetBatches), "batch_sampler_as_sampler", "stream"
    options: dict[str, Any] = field(default_factory=dict)  # DataLoaderConfiguration's
    workers: int = 0
    ours: bool = False  # stateful_sampler.accelerate.prepare_loader instead of accelerator.prepare
    device_placement: bool = True


# The branches of accelerate.data_loader.prepare_data_loader (accelerate 1.x) a loader can take on several
# processes: the sampler's generator set (the default) or not (use_seedable_sampler), BatchSamplerShard whole
# batches or split (split_batches), its last round evened out or not (even_batches), the torchdata base loader
# (use_stateful_dataloader), non-blocking transfers, and DataLoaderDispatcher (dispatch_batches; the default for
# an IterableDataset placed on a device); for each loader shape, with and without workers.
OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "seedable": {"use_seedable_sampler": True},
    "seedable-split": {"use_seedable_sampler": True, "split_batches": True},
    "seedable-uneven": {"use_seedable_sampler": True, "even_batches": False},
    "seedable-stateful": {"use_seedable_sampler": True, "use_stateful_dataloader": True},
    "seedable-nonblocking": {"use_seedable_sampler": True, "non_blocking": True},
    "dispatch": {"dispatch_batches": True},
    "dispatch-split": {"dispatch_batches": True, "split_batches": True},
}
STREAM_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},  # dispatch_batches=None: Accelerate dispatches an IterableDataset placed on a device
    "no-dispatch": {"dispatch_batches": False},
    "no-dispatch-split": {"dispatch_batches": False, "split_batches": True},
    "no-dispatch-stateful": {"dispatch_batches": False, "use_stateful_dataloader": True},
}
LOADERS = ("sampler", "batch_sampler", "batch_sampler_as_sampler")
CONFIGS: dict[str, Config] = {
    **{
        f"{loader}-{option}-w{workers}": Config(loader, options, workers)
        for loader in LOADERS
        for option, options in OPTIONS.items()
        for workers in (0, 2)
    },
    **{
        f"stream-{option}-w{workers}": Config("stream", options, workers)
        for option, options in STREAM_OPTIONS.items()
        for workers in (0, 2)
    },
    # stateful_sampler.accelerate.prepare_loader under the options that leave each process its own batches
    **{
        f"ours-{loader}-{option}-w{workers}": Config(loader, OPTIONS[option], workers, ours=True)
        for loader in (*LOADERS, "stream")
        for option in ("default", "seedable", "seedable-uneven", "seedable-stateful", "seedable-nonblocking")
        for workers in (0, 2)
    },
}


def records(config: Config) -> list[int]:
    """Every record of the epoch, for the test to compare with what the ranks were handed."""
    if config.loader == "stream":
        return [100 * shard + row for shard, count in enumerate(STREAM_COUNTS) for row in range(count)]
    return list(range(SIZE))


def make_loader(config: Config) -> Any:
    workers = {"num_workers": config.workers}
    dataset = torch.arange(SIZE)  # indexable by a list too: a BatchSampler as the sampler hands it whole batches
    if config.loader == "sampler":
        return DataLoader(dataset, sampler=StatefulSampler(SIZE, seed=0, batch_size=BATCH), batch_size=BATCH,
                          **workers)  # fmt: skip
    if config.loader == "batch_sampler":
        batches = TokenBudgetBatches([3] * SIZE, max_tokens=3 * BATCH, seed=0)  # batches of BATCH records
        return DataLoader(dataset, batch_sampler=batches, **workers)
    if config.loader == "batch_sampler_as_sampler":  # DataLoader(sampler=BatchSampler(...), batch_size=None)
        batch_sampler = BatchSampler(StatefulSampler(SIZE, seed=0, batch_size=BATCH), BATCH, drop_last=False)
        return DataLoader(dataset, sampler=batch_sampler, batch_size=None, **workers)
    if config.loader == "stream":
        shards = [str(index) for index in range(len(STREAM_COUNTS))]
        return ShardedStream(shards, Rows(STREAM_COUNTS), batch_size=BATCH, window=2, seed=0).loader(**workers)
    raise ValueError(f"unknown loader {config.loader!r}")


def flatten(batch: Any) -> list[int]:
    return [int(value) for value in torch.as_tensor(batch).flatten().tolist()]


def run(name: str, config: Config, out: Path, rank_of: Any) -> bool:
    """One configuration; returns whether it raised."""
    accelerator = Accelerator(cpu=True, device_placement=config.device_placement,
                              dataloader_config=DataLoaderConfiguration(**config.options))  # fmt: skip
    rank = rank_of(accelerator)
    stage, seen = "prepare", []
    try:
        loader = make_loader(config)
        prepared = prepare_loader(accelerator, loader) if config.ours else accelerator.prepare(loader)
        stage = "iter"
        for batch in prepared:
            seen += flatten(batch)
        error = None
    except Exception as raised:  # noqa: BLE001 - the test reads it
        error = f"{type(raised).__name__}: {raised}"
    (out / name).mkdir(parents=True, exist_ok=True)
    result = {"records": seen, "error": error, "stage": stage if error else None}
    (out / name / f"rank{rank}.json").write_text(json.dumps(result))
    return error is not None


def main(names: list[str], out: Path, lone: bool) -> None:
    for name in names:
        if name == PREPARE_ALL:  # accelerate_prepare_run.py's, in the same launch
            prepare_all(out / name)
        elif run(name, CONFIGS[name], out, lambda accelerator: accelerator.process_index) and lone:
            sys.stdout.flush()
            os._exit(1)  # the other ranks wait in a collective of Accelerate's: the launcher stops them


if __name__ == "__main__":
    arguments = sys.argv[1:]
    lone = "--lone" in arguments
    arguments = [argument for argument in arguments if argument != "--lone"]
    assert arguments[1] == "--record", arguments
    main(arguments[0].split(","), Path(arguments[2]), lone)
