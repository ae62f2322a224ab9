"""Streamed parquet shards: kill -9 a training run mid-epoch, resume it, and prove it equal.

Writes scikit-learn's digits (1797 images) as 64 small parquet shards **sorted by class** (the
worst case for a streamed shuffle: each shard holds one or two digits), trains an MLP on them
through ``ShardedStream`` with 2 DataLoader workers and a window of k=8 shards, kills the
training process with SIGKILL mid-epoch, resumes it from its last checkpoint, and compares it
with a run never interrupted: the record ids of every batch and the final weights, bit for bit.
Then it prints how well each window size k mixes the classes, against a classic buffer shuffle
holding the same number of records.

With ``--s3 ENDPOINT`` the shards are uploaded to an S3-compatible server (``s3://digits/``) and
both runs read them from there through one node-local ``ShardCache``: every shard is downloaded
once for both runs and their 4 workers, whatever reads it.

    python examples/parquet_stream.py                             # about 17 s on 2 cores
    python examples/parquet_stream.py --s3 http://127.0.0.1:5000  # e.g. `moto_server -p 5000`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from sklearn.datasets import load_digits
from torch import nn

from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream

SHARDS, WINDOW, BATCH, EPOCHS, SAVE_EVERY, SEED = 64, 8, 32, 2, 20, 7
KILL_AFTER = 75  # epoch 1, batch 18 of 57: the last checkpoint is step 60


def write_shards(root: Path) -> list[str]:
    """64 parquet shards of the digits sorted by label, two row groups each."""
    images, labels = load_digits(return_X_y=True)
    order = np.argsort(labels, kind="stable")
    paths = []
    for index, rows in enumerate(np.array_split(order, SHARDS)):
        table = pa.table({"id": rows, "pixels": list(images[rows].astype(np.float32) / 16), "label": labels[rows]})
        path = root / f"digits-{index:02d}.parquet"
        pq.write_table(table, path, row_group_size=16)
        paths.append(str(path))
    return paths


def to_example(record: dict) -> tuple[torch.Tensor, int, int]:
    return torch.tensor(record["pixels"]), record["label"], record["id"]


def upload(paths: list[str], endpoint: str) -> list[str]:
    """The shards on the S3 server, as ``s3://digits/...`` URLs."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.mkdir("digits")
    for path in paths:
        fs.put(path, f"digits/{Path(path).name}")
    return [f"s3://digits/{Path(path).name}" for path in paths]


def reader_for(root: Path) -> tuple[list[str], object]:
    """The shards and their reader: local paths, or S3 URLs read through the node-local cache."""
    source = json.loads((root / "source.json").read_text())
    reader = ParquetReader(columns=["id", "pixels", "label"], storage_options=source["storage_options"])
    if source["storage_options"] is None:
        return source["shards"], reader
    return source["shards"], ShardCache(reader, root / "cache", max_bytes=64 << 20)


def train(root: Path, run: str, stop_after: int | None) -> None:
    """One training process; with ``stop_after`` it blocks after that step, waiting for SIGKILL."""
    shards, reader = reader_for(root)
    stream = ShardedStream(shards, reader, batch_size=BATCH, window=WINDOW, seed=SEED, transform=to_example)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    checkpoint, log = root / f"{run}.pt", root / f"{run}.log"
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        stream.load_state_dict(saved["stream"])
        step = saved["step"]
    loader = stream.loader(num_workers=2)  # a DataLoader of the stream's batch size
    with log.open("a") as out:
        for epoch in range(stream.epoch, EPOCHS):
            stream.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
            for consumed, (pixels, labels, ids) in enumerate(loader, 1):
                loss = nn.functional.cross_entropy(model(pixels), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                print(json.dumps({"step": step, "epoch": epoch, "ids": ids.tolist()}), file=out, flush=True)
                if step % SAVE_EVERY == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "stream": stream.state_dict(consumed_batches=consumed), "step": step}  # fmt: skip
                    torch.save(state, checkpoint)
                if step == stop_after:
                    print("ready to be killed", flush=True)
                    signal.pause()  # the parent kills this process, and its workers, with SIGKILL
    torch.save(model.state_dict(), root / f"{run}.weights")


def start(root: Path, run: str, stop_after: int | None = None) -> subprocess.Popen:
    args = [sys.executable, __file__, "--train", str(root), run] + ([str(stop_after)] if stop_after else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)


def steps(root: Path, run: str) -> dict[int, dict]:
    return {entry["step"]: entry for entry in map(json.loads, (root / f"{run}.log").read_text().splitlines())}


def compare(root: Path) -> bool:
    """The killed run's steps up to its checkpoint, then the resumed ones, against the reference."""
    reference, killed = steps(root, "reference"), steps(root, "killed")
    merged = dict(killed)  # later lines of the log (the resumed process) overwrite replayed steps
    divergence = next((step for step in reference if merged.get(step, {}).get("ids") != reference[step]["ids"]), None)
    weights = torch.load(root / "reference.weights"), torch.load(root / "killed.weights")
    same_weights = all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    print(f"steps compared:          {len(reference)} ({EPOCHS} epochs of {-(-1797 // BATCH)} batches)")
    if divergence is None:
        print(f"identical batches:       {len(reference)} of {len(reference)} (record ids, in order)")
    else:
        print(
            f"first divergence:        step {divergence}: expected ids {reference[divergence]['ids'][:6]}..., "
            f"got {merged.get(divergence, {}).get('ids', [])[:6]}..."
        )
    print(f"identical final weights: {'yes, bitwise' if same_weights else 'NO'}")
    equal = divergence is None and same_weights
    print(f"verdict:                 {'IDENTICAL' if equal else 'DIFFERENT'}")
    return equal


def kill_and_resume(root: Path) -> None:
    victim = start(root, "killed", stop_after=KILL_AFTER)
    assert victim.stdout is not None
    if victim.stdout.readline().strip() != "ready to be killed":
        raise RuntimeError(f"the training process ended before step {KILL_AFTER}: exit code {victim.wait()}")
    os.killpg(victim.pid, signal.SIGKILL)  # the trainer and its 2 DataLoader workers, no clean-up
    victim.wait()
    saved = torch.load(root / "killed.pt")["step"]
    print(
        f"killed with SIGKILL after step {KILL_AFTER} (epoch 1, batch {KILL_AFTER - 57} of 57); "
        f"resuming from the checkpoint at step {saved} ({KILL_AFTER - saved} steps replayed)"
    )
    if start(root, "killed").wait() != 0:
        raise RuntimeError("the resumed run failed")


# -- shuffle quality: how well does a window of k sorted shards mix the classes?


def buffer_shuffle(shard_labels: list[np.ndarray], memory: int, rng: np.random.Generator) -> np.ndarray:
    """A classic streaming shuffle: read shards (in a shuffled order) into a buffer of ``memory``
    records, emit a random one and put the next record read in its place."""
    stream = np.concatenate([shard_labels[i] for i in rng.permutation(len(shard_labels))])
    buffer, out = list(stream[:memory]), []
    for label in stream[memory:]:
        slot = int(rng.integers(len(buffer)))
        out.append(buffer[slot])
        buffer[slot] = label
    rng.shuffle(buffer)
    return np.array(out + buffer)


def quality(labels: np.ndarray, overall: np.ndarray, batches: int = 10) -> tuple[float, float]:
    """Total variation distance of the first ``batches`` batches' classes from the whole dataset's
    (0 = perfect, 1 = disjoint), and the mean number of distinct classes in a batch of the epoch."""
    first = np.bincount(labels[: batches * BATCH], minlength=10) / (batches * BATCH)
    per_batch = [len(np.unique(labels[i : i + BATCH])) for i in range(0, len(labels), BATCH)]
    return 0.5 * float(np.abs(first - overall).sum()), float(np.mean(per_batch))


def composition_table(root: Path) -> None:
    shards = sorted(str(path) for path in root.glob("digits-*.parquet"))
    reader = ParquetReader(columns=["label"])
    shard_labels = [np.array([r["label"] for r in reader.read(s, 0, pq.read_metadata(s).num_rows)]) for s in shards]
    overall = np.bincount(np.concatenate(shard_labels), minlength=10) / sum(map(len, shard_labels))
    all_labels = np.concatenate(shard_labels)
    print(
        f"\nclass mix of the first 10 batches of {BATCH} (total variation from the dataset's 10 classes; "
        f"0 is perfect) and distinct classes per batch, shards sorted by class, mean of epochs 0-4:"
    )
    print(f"{'k shards':>9} {'records held':>13}   {'window shuffle':>20}   {'buffer shuffle, same memory':>28}")
    for window in (1, 2, 4, 8, 16, 64):
        stream = ShardedStream(shards, reader, batch_size=BATCH, window=window, seed=SEED,
                               counts=[len(labels) for labels in shard_labels])  # fmt: skip
        memory = window * len(all_labels) // len(shards)
        ours, theirs = [], []
        for epoch in range(5):
            records = stream.order.epoch(epoch).records(np.arange(len(all_labels)))
            ours.append(quality(all_labels[records], overall))
            theirs.append(quality(buffer_shuffle(shard_labels, memory, np.random.default_rng(epoch)), overall))
        (tv, mix), (buffer_tv, buffer_mix) = np.mean(ours, axis=0), np.mean(theirs, axis=0)
        print(
            f"{window:>9} {memory:>13}   {tv:>6.2f} TV, {mix:4.1f} classes   {buffer_tv:>11.2f} TV, "
            f"{buffer_mix:4.1f} classes"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", metavar=("ROOT", "RUN"), help=argparse.SUPPRESS)
    parser.add_argument("--s3", metavar="ENDPOINT", help="read the shards from this S3-compatible server")
    args = parser.parse_args(argv)
    if args.train:
        root, run, *stop = args.train
        train(Path(root), run, int(stop[0]) if stop else None)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a 2.4K-parameter model: one thread per process is faster
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        paths = write_shards(root)
        shards = upload(paths, args.s3) if args.s3 else paths
        options = {"endpoint_url": args.s3} if args.s3 else None
        (root / "source.json").write_text(json.dumps({"shards": shards, "storage_options": options}))
        where = f"on {args.s3} as s3://digits/" if args.s3 else "locally"
        print(f"wrote {SHARDS} parquet shards of the digits {where}, sorted by class; window k={WINDOW}, 2 workers")
        reference = start(root, "reference")
        kill_and_resume(root)
        if reference.wait() != 0:
            raise RuntimeError("the uninterrupted run failed")
        equal = compare(root)
        if args.s3:
            stats = ShardCache(ParquetReader(), root / "cache", max_bytes=1).stats()
            size = sum(os.path.getsize(path) for path in paths)
            print(
                f"fetched from S3:         {stats.bytes} bytes in {stats.transfers} transfers for {size} bytes "
                f"of shards, 2 runs x 2 workers x {EPOCHS} epochs (footers, then each shard once)"
            )
        composition_table(root)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
