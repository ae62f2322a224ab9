"""The streams users pick, side by side with ``ShardedStream`` on the same records: resume cost,
records repeated or lost after a SIGKILL mid-epoch, shuffle quality, throughput.

litdata and mosaicml-streaming would replace this project's torch, so they live in their own
venv (``.bench-venv``, see docs/streaming.md); ``benchmarks.cases_stream_peers`` runs this file
there, once per system and task, as a subprocess:

    .bench-venv/bin/python benchmarks/stream_peers.py SYSTEM ROOT RECORDS TASK

Records are ``{"id": i, "label": i * 10 // N}``: sorted by class, the worst case for a stream.
``train-W`` is a training process with W workers that saves its loader's state every
``CHECKPOINT_EVERY`` batches, atomically, as a user's checkpoint would; the driver ``kill -9``s it
(its whole process group, workers included) once it has reported half an epoch. ``resume-W`` is a
fresh process that only has the last checkpoint, finishes the epoch with W workers and counts the
records repeated or lost against those delivered before the checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import inspect
import json
import os
import pickle
import resource
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

BATCH, SHARDS, WINDOW, CLASSES = 256, 64, 8, 10
CHECKPOINT_EVERY = 10  # batches between two checkpoints: a kill lands between two of them
STEP_SECONDS = 0.002  # the training step each batch stands for (a sleep: it costs no CPU)


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


# Our readers over the same records: parquet and Arrow (written here, 64 shards), JSON Lines and tar
# (throughput only), MDS and LitData (throughput only: Mosaic's and litdata's own shards, read by ours).
OUR_FORMATS = {"ours": "parquet", "ours-arrow": "arrow", "ours-jsonl": "jsonl", "ours-tar": "tar",
               "ours-mds": "mosaic", "ours-litdata": "litdata"}  # fmt: skip
SUFFIXES = {"parquet": ".parquet", "arrow": ".arrow", "jsonl": ".jsonl", "tar": ".tar"}


def write_ours(system: str, root: Path, records: int) -> None:
    """The 64 shards of ``system``'s format (parquet, Arrow IPC files, JSON Lines, WebDataset tar)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    form = OUR_FORMATS[system]
    (root / form).mkdir(parents=True, exist_ok=True)
    for shard, ids in enumerate(np.array_split(np.arange(records), SHARDS)):
        labels = ids * CLASSES // records
        path = root / form / f"part-{shard:03d}{SUFFIXES[form]}"
        table = pa.table({"id": ids, "label": labels})
        if form == "parquet":
            pq.write_table(table, path, row_group_size=1024)
        elif form == "arrow":  # the file format: an index of its record batches
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table, max_chunksize=1024)
        elif form == "jsonl":
            path.write_text("".join(f'{{"id": {i}, "label": {c}}}\n' for i, c in zip(ids.tolist(), labels.tolist())))
        else:
            _write_tar(path, ids.tolist(), labels.tolist())


def _write_tar(path: Path, ids: list[int], labels: list[int]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as archive:
        for ident, label in zip(ids, labels):
            for suffix, value in (("id", ident), ("label", label)):
                data = str(value).encode()
                info = tarfile.TarInfo(f"{ident:09d}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def tar_record(record: dict[str, Any]) -> dict[str, int]:
    """A tar record's files decoded, as a webdataset user's transform does."""
    return {"id": int(record["id"]), "label": int(record["label"])}


def our_stream(system: str, root: Path, batch_size: int, seed: int) -> Any:
    """``system``'s ``ShardedStream``, with a shard manifest beside the shards: a restart stats the shards."""
    from stateful_sampler.stream import (
        ArrowReader,
        JsonlReader,
        LitDataReader,
        MDSReader,
        ParquetReader,
        ShardedStream,
        TarReader,
    )

    form = OUR_FORMATS[system]
    reader: Any
    if form == "mosaic":
        reader = MDSReader(str(root / "mosaic"))
        shards = list(reader.shards)
    elif form == "litdata":
        reader = LitDataReader(str(root / "litdata"))
        shards = list(reader.shards)
    else:
        reader = {"parquet": ParquetReader, "arrow": ArrowReader, "jsonl": JsonlReader, "tar": TarReader}[form]()
        shards = sorted(str(p) for p in (root / form).glob(f"*{SUFFIXES[form]}"))
    return ShardedStream(shards, reader, batch_size=batch_size, window=WINDOW, seed=seed,
                         shard_manifest=root / f"{system}.manifest.json",
                         transform=tar_record if form == "tar" else None)  # fmt: skip


def preload(system: str) -> None:
    import torch.utils.data  # noqa: F401

    # What every system's first batch imports inside torch (a DataLoader's first __next__, its record_function):
    # without a .pyc (a venv made with PYTHONDONTWRITEBYTECODE) compiling it costs 20-35 ms, with one about 1.
    importlib.import_module("torch.profiler._cupti_monitor")

    if system.startswith("mosaic"):
        _stub_torchvision()
    module = {"litdata": "litdata", "mosaic": "streaming", "mosaic-py1br": "streaming",
              "hf": "datasets"}.get(system, "stateful_sampler.stream")  # fmt: skip
    importlib.import_module(module)
    if system.startswith("ours"):  # what our readers import at their first use, as litdata's import brings its own
        importlib.import_module("pyarrow.parquet")
        importlib.import_module("pyarrow.ipc")
        importlib.import_module("pyarrow.compute")
        importlib.import_module("numpy.ma")  # numpy 2.4's np.unique imports it at its first call
    if system == "hf":
        importlib.import_module("torchdata.stateful_dataloader")


def build(system: str, root: Path, records: int, workers: int, seed: int = 0) -> tuple[Any, Any]:
    if system.startswith("ours"):
        stream = our_stream(system, root, BATCH, seed)
        return stream, stream.loader(num_workers=workers)
    if system == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(str(root / "litdata"), shuffle=True, seed=seed)
        return dataset, StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    if system.startswith("mosaic"):
        _stub_torchvision()
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # a killed run leaves its shared memory behind
        algorithm = "py1br" if system == "mosaic-py1br" else "py1e"
        dataset = StreamingDataset(local=str(root / "mosaic"), shuffle=True, shuffle_algo=algorithm,
                                   shuffle_seed=seed, batch_size=BATCH,
                                   shuffle_block_size=shuffle_memory(records))  # fmt: skip
        return dataset, StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    if system == "hf":
        from datasets import load_dataset
        from torchdata.stateful_dataloader import StatefulDataLoader

        dataset = load_dataset("parquet", data_files=parquet_paths(root), split="train", streaming=True)
        dataset = dataset.shuffle(seed=seed, buffer_size=shuffle_memory(records))  # one buffer per worker
        return dataset, StatefulDataLoader(dataset, batch_size=BATCH, num_workers=workers)
    raise ValueError(system)


def id_batches(loader: Any) -> Any:
    """The record ids of each batch, as the loop sees them."""
    for batch in loader:
        yield [int(v) for v in batch["id"]]


def state_of(system: str, dataset: Any, loader: Any, consumed: int) -> Any:
    """What a user's checkpoint saves after the loop consumed ``consumed`` batches."""
    return dataset.state_dict(consumed_batches=consumed) if system.startswith("ours") else loader.state_dict()


def save_atomically(path: Path, payload: Any) -> None:
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as file:
        pickle.dump(payload, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(system: str, root: Path, records: int, workers: int) -> None:
    """Train until killed: report each batch on stdout, checkpoint every ``CHECKPOINT_EVERY`` batches."""
    dataset, loader = build(system, root, records, workers)
    delivered: list[list[int]] = []
    for consumed, batch in enumerate(id_batches(loader), 1):
        delivered.append(batch)
        time.sleep(STEP_SECONDS)
        if consumed % CHECKPOINT_EVERY == 0:
            save_atomically(root / f"{system}.w{workers}.ckpt", {
                "state": state_of(system, dataset, loader, consumed), "batches": consumed,
                "delivered": np.concatenate(delivered)})  # fmt: skip
        print(consumed, flush=True)
    print("epoch-end", flush=True)  # the kill came too late: the driver reports it


def half_state(system: str, root: Path, records: int) -> None:
    """A checkpoint at half an epoch for the resume-cost runs at 10^6 and more, through each system's
    public API without reading the half epoch where it has one: ours (``state_dict(consumed_batches=)``)
    and Mosaic (``StreamingDataset.state_dict(num_samples, from_beginning=True)``); litdata's state
    only comes from its loader, so it reads the half epoch at 0 workers."""
    half = records // BATCH // 2
    dataset, loader = build(system, root, records, 0)
    if system.startswith("ours"):
        state = dataset.state_dict(consumed_batches=half)
    elif system == "mosaic":
        state = dataset.state_dict(half * BATCH, True)
    else:
        batches = id_batches(loader)
        for _ in range(half):
            next(batches)
        state = loader.state_dict()
    save_atomically(root / f"{system}.half.ckpt", {"state": state, "batches": half, "delivered": None})


def resume(system: str, root: Path, records: int, checkpoint: str, workers: int) -> dict[str, Any]:
    saved = pickle.loads((root / f"{system}.{checkpoint}.ckpt").read_bytes())
    state_bytes = len(pickle.dumps(saved["state"]))  # before loading it: litdata's load adds to the dict
    preload(system)  # imports are not the resume's cost
    started, cpu = time.perf_counter(), time.process_time()
    dataset, loader = build(system, root, records, workers)
    try:
        (dataset if system.startswith("ours") else loader).load_state_dict(saved["state"])
        batches = id_batches(loader)
        rest = [next(batches)]
    except Exception as error:  # noqa: BLE001 (whatever a peer raises to refuse a resume is a result)
        message = (str(error).splitlines() or ["(no message)"])[0][:160]
        return {"refused": f"{type(error).__name__}: {message}"}
    result: dict[str, Any] = {"first_batch_s": time.perf_counter() - started, "rss_mib": rss_mib(),
                              "first_batch_cpu_s": time.process_time() - cpu,  # this process's: workers' apart
                              "state_bytes": state_bytes, "checkpoint_batch": saved["batches"]}  # fmt: skip
    if saved["delivered"] is None:
        return result
    rest += list(batches)
    seen = np.bincount(np.concatenate([saved["delivered"], *map(np.asarray, rest)]), minlength=records)
    return {**result, "repeated": int(np.maximum(seen - 1, 0).sum()), "lost": int((seen == 0).sum())}


# The systems that write shards, and the directory under ROOT each writes (the others read one of these).
WRITERS = {"ours": "parquet", "ours-arrow": "arrow", "ours-jsonl": "jsonl", "ours-tar": "tar",
           "litdata": "litdata", "mosaic": "mosaic"}  # fmt: skip
WRITER_PACKAGES = {"litdata": "litdata", "mosaic": "mosaicml-streaming"}  # the others: pyarrow


def _files(directory: Path) -> dict[str, int]:
    """Each file under ``directory`` and its size: what a reuse checks against the marker."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


def written(system: str, root: Path, records: int) -> dict[str, Any]:
    """``system``'s shards under ``root``, written unless a marker says these very shards are there: the marker is
    written last, after every shard, and names the records, the writer's code and package version and each file's
    size, so a killed write (no marker), another record count or writer, or a file changed since is written anew.
    The slow writers (litdata's takes about 431 s at 10^7) then run once for a ``--scratch`` directory."""
    if system not in WRITERS:
        raise ValueError(f"system must be one of {sorted(WRITERS)} to write shards, got {system!r}")
    directory = root / WRITERS[system]
    marker = root / f"{WRITERS[system]}.written.json"
    source = "".join(inspect.getsource(f) for f in (write, write_ours, _write_tar))
    expected = {"records": records, "shards": SHARDS, "classes": CLASSES,
                "package": f"{WRITER_PACKAGES.get(system, 'pyarrow')} "
                           f"{importlib.metadata.version(WRITER_PACKAGES.get(system, 'pyarrow'))}",
                "writer": hashlib.sha256(source.encode()).hexdigest()[:16]}  # fmt: skip
    if marker.exists() and directory.is_dir():
        saved = json.loads(marker.read_text())
        if {key: saved.get(key) for key in expected} == expected and saved.get("files") == _files(directory):
            return {"shards": WRITERS[system], "reused": True}
    marker.unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)  # a partial write's files: the writers do not overwrite them all
    started = time.perf_counter()
    write_ours(system, root, records) if system.startswith("ours") else write(system, root, records)
    seconds = time.perf_counter() - started
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps({**expected, "files": _files(directory), "write_s": round(seconds, 3)}))
    os.replace(partial, marker)
    return {"shards": WRITERS[system], "reused": False, "write_s": seconds}


def main(system: str, root: Path, records: int, task: str) -> dict[str, Any]:
    if task == "write":
        return written(system, root, records)
    if task == "epoch":  # uninterrupted epochs: the order at 0 workers, records/s at 0 and 4 workers
        result: dict[str, Any] = {}
        for workers in (0,) if system == "mosaic-py1br" else (0, 4):
            _, loader = build(system, root, records, workers)
            started, cpu = time.perf_counter(), time.process_time()
            order = list(id_batches(loader))
            result[f"rate_{workers}"] = sum(map(len, order)) / (time.perf_counter() - started)
            if workers == 0:  # records per CPU second: the figure a shared machine's load does not move
                result["cpu_rate_0"] = sum(map(len, order)) / (time.process_time() - cpu)
            if workers == 0:
                result["order"] = [i for batch in order for i in batch]
        return result
    if task.startswith("train-"):
        train(system, root, records, int(task.split("-")[1]))
        return {}
    if task == "half":
        half_state(system, root, records)
        return {}
    # "resume-CHECKPOINT-W": a fresh process loads the checkpoint (w0, w2: a kill's; half) with W workers
    _, checkpoint, workers = task.split("-")
    return resume(system, root, records, checkpoint, int(workers))


if __name__ == "__main__":
    system, root, records, task = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(main(system, root, records, task)))
