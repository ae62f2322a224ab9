"""The streams users pick, side by side with ``ShardedStream`` on the same records: resume cost,
records repeated or lost by a stop and resume mid-epoch, shuffle quality, throughput.

litdata and mosaicml-streaming would replace this project's torch, so they live in their own
venv (``.bench-venv``, see docs/streaming.md); ``benchmarks.cases_stream_peers`` runs this file
there, once per system, as a subprocess:

    .bench-venv/bin/python benchmarks/stream_peers.py SYSTEM ROOT RECORDS

Records are ``{"id": i, "label": i * 10 // N}``: sorted by class, the worst case for a stream.
A stop is a process that reads half an epoch, saves the loader's state and exits; the resume is a
fresh process that only has that state, as after a SIGKILL (the kill itself is not repeated here:
tests/test_stream_loader.py and examples/parquet_stream.py kill -9 ours).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import pickle
import resource
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

BATCH, SHARDS, WINDOW, CLASSES = 256, 64, 8, 10


def shuffle_memory(records: int) -> int:
    """Records a shuffle may hold, for every system: one window of ours."""
    return WINDOW * records // SHARDS


def _stub_torchvision() -> None:
    """mosaicml-streaming imports torchvision for its vision datasets, which are not used here; the
    PyPI torchvision wheel does not load against the CPU torch, so stand in for the two names."""
    vision = types.ModuleType("torchvision")
    datasets, transforms, functional = (
        types.ModuleType(f"torchvision.{n}") for n in ("datasets", "transforms", "transforms.functional")
    )
    datasets.VisionDataset = object  # type: ignore[attr-defined]
    functional.to_tensor = lambda x: x  # type: ignore[attr-defined]
    for module in (vision, datasets, transforms, functional):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    sys.modules.update({"torchvision": vision, "torchvision.datasets": datasets, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})  # fmt: skip


# -- each system: write its shards from the same records, and build a (dataset, loader) pair


def parquet_paths(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "parquet").glob("*.parquet"))


def write(system: str, root: Path, records: int) -> None:
    ids = np.arange(records)
    labels = ids * CLASSES // records
    if system == "litdata":
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(str(root / "litdata"), chunk_size=records // SHARDS)
        for i in range(records):
            writer.add_item(i, {"id": int(ids[i]), "label": int(labels[i])})
        writer.done()
        writer.merge()
    elif system == "mosaic":
        _stub_torchvision()
        from streaming import MDSWriter

        with MDSWriter(out=str(root / "mosaic"), columns={"id": "int64", "label": "int64"},
                       size_limit=max(1 << 12, records // SHARDS * 40)) as writer:  # fmt: skip
            for i in range(records):
                writer.write({"id": int(ids[i]), "label": int(labels[i])})


def write_parquet(root: Path, records: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "parquet").mkdir(parents=True, exist_ok=True)
    for shard, ids in enumerate(np.array_split(np.arange(records), SHARDS)):
        table = pa.table({"id": ids, "label": ids * CLASSES // records})
        pq.write_table(table, root / "parquet" / f"part-{shard:03d}.parquet", row_group_size=1024)


def preload(system: str) -> None:
    import torch.utils.data  # noqa: F401

    if system == "mosaic":
        _stub_torchvision()
    module = {"ours": "stateful_sampler.stream", "litdata": "litdata", "mosaic": "streaming", "hf": "datasets"}[system]
    importlib.import_module(module)


def build(system: str, root: Path, records: int, workers: int, seed: int = 0) -> tuple[Any, Any]:
    if system == "ours":
        from stateful_sampler.stream import ParquetReader, ShardedStream

        counts = [len(ids) for ids in np.array_split(np.arange(records), SHARDS)]
        stream = ShardedStream(parquet_paths(root), ParquetReader(), batch_size=BATCH, window=WINDOW, seed=seed,
                               counts=counts)  # fmt: skip
        return stream, stream.loader(num_workers=workers)
    if system == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(str(root / "litdata"), shuffle=True, seed=seed)
        return dataset, StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    if system == "mosaic":
        _stub_torchvision()
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(local=str(root / "mosaic"), shuffle=True, shuffle_algo="py1e", shuffle_seed=seed,
                                   batch_size=BATCH, shuffle_block_size=shuffle_memory(records))  # fmt: skip
        return dataset, StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    if system == "hf":
        from datasets import load_dataset

        dataset = load_dataset("parquet", data_files=parquet_paths(root), split="train", streaming=True)
        dataset = dataset.shuffle(seed=seed, buffer_size=shuffle_memory(records))
        return dataset, None  # iterated directly: its state_dict is the dataset's (0 workers)
    raise ValueError(system)


def id_batches(dataset: Any, loader: Any) -> Any:
    """The record ids of each batch, as the loop sees them."""
    if loader is not None:
        for batch in loader:
            yield [int(v) for v in batch["id"]]
        return
    batch: list[int] = []
    for record in dataset:
        batch.append(int(record["id"]))
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def state_of(system: str, dataset: Any, loader: Any) -> Any:
    return dataset.state_dict() if loader is None else loader.state_dict()


def load(system: str, dataset: Any, loader: Any, state: Any) -> None:
    (dataset if loader is None else loader).load_state_dict(state)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(system: str, root: Path, records: int, task: str) -> dict[str, Any]:
    if task == "write":
        write_parquet(root, records) if system == "ours" else write(system, root, records)
        return {}
    if task == "epoch":  # uninterrupted epochs: the order at 0 workers, records/s at 0 and 4 workers
        result: dict[str, Any] = {}
        for workers in (0, 4):
            if system == "hf" and workers:
                continue  # HF's IterableDataset with workers needs torchdata's StatefulDataLoader to resume
            dataset, loader = build(system, root, records, workers)
            started = time.perf_counter()
            order = list(id_batches(dataset, loader))
            result[f"rate_{workers}"] = sum(map(len, order)) / (time.perf_counter() - started)
            if workers == 0:
                result["order"] = [i for batch in order for i in batch]
        return result
    if task == "stop":  # half an epoch at 0 workers, then the state is all that survives
        dataset, loader = build(system, root, records, 0)
        batches = id_batches(dataset, loader)
        before = [next(batches) for _ in range(records // BATCH // 2)]
        if system == "ours":
            state = dataset.state_dict(consumed_batches=len(before))
        else:
            state = dataset.state_dict() if loader is None else loader.state_dict()
        (root / f"{system}.state").write_bytes(pickle.dumps(state))
        np.save(root / f"{system}.before.npy", np.concatenate(before))
        return {"state_bytes": len(pickle.dumps(state))}
    # "resume-W": a fresh process loads the state, with W workers, and finishes the epoch
    workers = int(task.split("-")[1])
    if system == "hf" and workers:
        return {"skipped": "an IterableDataset's state with workers needs torchdata's StatefulDataLoader"}
    state = pickle.loads((root / f"{system}.state").read_bytes())
    preload(system)  # imports are not the resume's cost
    started = time.perf_counter()
    dataset, loader = build(system, root, records, workers)
    (dataset if loader is None or system == "ours" else loader).load_state_dict(state)
    batches = id_batches(dataset, loader)
    rest = [next(batches)]
    first = time.perf_counter() - started
    rss = rss_mib()
    rest += list(batches)
    seen = np.bincount(
        np.concatenate([np.load(root / f"{system}.before.npy"), *map(np.asarray, rest)]), minlength=records
    )
    return {"first_batch_s": first, "rss_mib": rss, "repeated": int(np.maximum(seen - 1, 0).sum()),
            "lost": int((seen == 0).sum())}  # fmt: skip


if __name__ == "__main__":
    system, root, records, task = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(main(system, root, records, task)))
