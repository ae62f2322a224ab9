"""Streamed shards: shuffle quality against memory, and IO per record, for ``ShardedStream``.

Quality uses the worst case, shards sorted by class, and compares the window shuffle (at the
default spread, and of whole shards, spread 1) with a classic buffer shuffle holding the same number of records (the shuffle of HF ``datasets``'
``IterableDataset.shuffle(buffer_size)`` and webdataset: shards in a shuffled order stream into a
buffer; each step emits a random buffered record and puts the next one read in its place).

    python -m benchmarks.cases_stream --plot stream_quality.png    # the table, and quality against memory
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from stateful_sampler.order.shards import DEFAULT_SPREAD
from stateful_sampler.stream import ParquetReader, ShardedStream

Result = dict[str, Any]
CLASSES, SHARDS, SHARD_SIZE, BATCH, FIRST_BATCHES, EPOCHS = 10, 256, 100, 64, 10, 4
WINDOWS = (1, 2, 4, 8, 16, 32, 64, 256)


class OrderOnly:
    """The reader of the figures that measure the order alone, over shard names that are no files: the
    counts are given, no record is read, and without ``identity`` nothing is looked up (``ParquetReader``
    stats every shard for the state's identity)."""

    def count(self, shard: str) -> int:
        raise NotImplementedError(f"OrderOnly reads nothing: give the stream counts= (asked for {shard!r})")

    def read(self, shard: str, start: int, stop: int) -> list[Any]:
        raise NotImplementedError(f"OrderOnly reads nothing: the figure measures the order (asked for {shard!r})")


def sorted_shards() -> list[np.ndarray]:
    """SHARDS shards of SHARD_SIZE records; record i has class i * CLASSES // N (sorted by class)."""
    labels = np.arange(SHARDS * SHARD_SIZE) * CLASSES // (SHARDS * SHARD_SIZE)
    return np.split(labels, SHARDS)


def buffer_shuffle(shard_sizes: list[int], memory: int, rng: np.random.Generator) -> np.ndarray:
    """Record indices in the order a buffer of ``memory`` records emits them."""
    offsets = np.concatenate(([0], np.cumsum(shard_sizes)))
    incoming = np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in rng.permutation(len(shard_sizes))])
    buffer = incoming[:memory].copy()
    slots = rng.integers(0, memory, size=len(incoming) - memory)
    out = np.empty(len(incoming) - memory, dtype=np.int64)
    for step, slot in enumerate(slots.tolist()):
        out[step] = buffer[slot]
        buffer[slot] = incoming[memory + step]
    return np.concatenate((out, rng.permutation(buffer)))


def order_quality(orders: list[np.ndarray], labels: np.ndarray) -> Result:
    """Per-epoch orders of record indices -> the quality figures, averaged over the epochs.

    - ``first_tv``: total variation between the classes of the first FIRST_BATCHES batches and
      the whole dataset's (0 perfect, 1 disjoint): what an early loss curve sees.
    - ``same_class_mates``: the chance that two batch-mates share a class (the ideal is 1/CLASSES).
    - ``distinct_mates``: distinct batch-mates a record met over the epochs, over EPOCHS*(BATCH-1)
      (1 when no pair ever meets twice).
    """
    overall = np.bincount(labels, minlength=CLASSES) / len(labels)
    tvs, same = [], []
    pairs: set[tuple[int, int]] = set()
    for order in orders:
        batch_labels = labels[order[: len(order) // BATCH * BATCH]].reshape(-1, BATCH)
        first = np.bincount(batch_labels[:FIRST_BATCHES].ravel(), minlength=CLASSES) / (FIRST_BATCHES * BATCH)
        tvs.append(0.5 * float(np.abs(first - overall).sum()))
        counts = np.stack([np.bincount(row, minlength=CLASSES) for row in batch_labels])
        same.append(float((counts * (counts - 1)).sum() / (len(batch_labels) * BATCH * (BATCH - 1))))
        sample = order[: 64 * BATCH].reshape(-1, BATCH)  # the first 64 batches: enough to count repeats
        pairs.update((a, b) for row in sample.tolist() for a in row for b in row if a != b)
    tracked = 64 * BATCH * len(orders)
    return {
        "first_tv": float(np.mean(tvs)),
        "same_class_mates": float(np.mean(same)),
        "distinct_mates": len(pairs) / (tracked * (BATCH - 1)),
    }


def stream_quality(windows: list[int], epochs: int = EPOCHS) -> Result:
    """Quality of the window shuffle (default spread, and whole shards) and of a buffer shuffle holding the
    same records, per k."""
    shards = sorted_shards()
    labels = np.concatenate(shards)
    sizes = [len(shard) for shard in shards]
    names = [f"s{i}" for i in range(SHARDS)]
    rows: list[Result] = []
    for window in windows:
        row: Result = {"window": window, "memory": window * SHARD_SIZE}
        for name, spread in (("window_shuffle", DEFAULT_SPREAD), ("whole_shards", 1)):
            stream = ShardedStream(names, OrderOnly(), batch_size=BATCH, window=window, seed=1, counts=sizes,
                                   spread=spread)  # fmt: skip
            ours = [stream.order.epoch(epoch).records(np.arange(len(labels))) for epoch in range(epochs)]
            row[name] = order_quality(ours, labels)
        rng = np.random.default_rng(1)
        row["buffer_shuffle"] = order_quality(
            [buffer_shuffle(sizes, row["memory"], rng) for _ in range(epochs)], labels
        )
        rows.append(row)
    return {"rows": rows, "ideal_same_class_mates": 1 / CLASSES}


def stream_io(readers: list[int], window: int, row_group: int, spread: int) -> Result:
    """Parquet shards read through ``ShardedStream`` by ``readers`` readers (ranks x workers), one
    epoch: shards opened, rows and compressed bytes read per record delivered, and time per record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    result: Result = {"window": window, "spread": spread, "row_group": row_group, "per_readers": {}}
    with tempfile.TemporaryDirectory() as scratch:
        names = []
        for index, labels in enumerate(sorted_shards()[:64]):
            path = Path(scratch) / f"part-{index:03d}.parquet"
            table = pa.table({"label": labels, "features": list(np.ones((len(labels), 16), dtype=np.float32))})
            pq.write_table(table, path, row_group_size=row_group)
            names.append(str(path))
        counts = [pq.read_metadata(name).num_rows for name in names]
        for count in readers:
            opened = rows = read_bytes = delivered = 0
            start = perf_counter()
            for reader_index in range(count):
                reader = ParquetReader()
                stream = ShardedStream(names, reader, batch_size=BATCH, window=window, counts=counts, spread=spread,
                                       num_replicas=count, rank=reader_index)  # fmt: skip
                delivered += sum(1 for _ in stream)
                opened += reader.stats.opened
                rows += reader.stats.rows
                read_bytes += reader.stats.bytes
            seconds = perf_counter() - start
            result["per_readers"][str(count)] = {
                "shards_opened_per_epoch": opened,
                "rows_read_per_record": rows / delivered,
                "bytes_read_per_record": read_bytes / delivered,
                "seconds_per_record": seconds / delivered,
                "records": delivered,
            }
        result["shards"], result["dataset_bytes_per_record"] = len(names), _dataset_bytes(names) / sum(counts)
    return result


def _dataset_bytes(names: list[str]) -> int:
    import pyarrow.parquet as pq

    total = 0
    for name in names:
        metadata = pq.read_metadata(name)
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            total += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    return total


def stream_resume(records: int, shards: int, window: int) -> Result:
    """``load_state_dict`` at mid-epoch and the first batch's positions located: the epoch's O(S)
    set-up, then O(log S). Building the stream (hashing the shard list once) is not counted."""
    names = [f"s{i}" for i in range(shards)]
    counts = [records // shards] * shards
    stream = ShardedStream(names, OrderOnly(), batch_size=BATCH, window=window, counts=counts)
    state = stream.state_dict(consumed_batches=records // 2 // BATCH)
    fresh = ShardedStream(names, OrderOnly(), batch_size=BATCH, window=window, counts=counts)
    start = perf_counter()
    fresh.load_state_dict(state)
    windows = fresh.order.epoch(fresh.epoch)
    windows.locate(np.arange(fresh.position, fresh.position + BATCH))
    return {"seconds": perf_counter() - start, "state_json_bytes": len(json.dumps(state))}


def plot(quality: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = quality["rows"]
    memory = [row["memory"] for row in rows]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in (("window_shuffle", "o-"), ("whole_shards", "^-"), ("buffer_shuffle", "s--")):
        axes[0].plot(memory, [row[name]["first_tv"] for row in rows], style, label=name.replace("_", " "))
        axes[1].plot(memory, [row[name]["same_class_mates"] for row in rows], style, label=name.replace("_", " "))
    axes[1].axhline(quality["ideal_same_class_mates"], color="grey", linestyle=":", label="ideal (full shuffle)")
    axes[0].set_ylabel(f"class TV distance, first {FIRST_BATCHES} batches (0 = perfect)")
    axes[1].set_ylabel("P(two batch-mates share a class)")
    for axis in axes:
        axis.set_xscale("log")
        axis.set_xlabel(f"records held (window k x {SHARD_SIZE}-record shards)")
        axis.legend()
    figure.suptitle(f"{SHARDS} shards sorted by {CLASSES} classes, batch {BATCH}, mean of {EPOCHS} epochs")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def markdown(quality: Result) -> str:
    lines = [
        (
            f"| k | records held | class TV of the first 10 batches: spread {DEFAULT_SPREAD} | whole shards | buffer | "
            f"P(batch-mates share a class): spread {DEFAULT_SPREAD} | whole shards | buffer |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in quality["rows"]:
        ours, whole, theirs = row["window_shuffle"], row["whole_shards"], row["buffer_shuffle"]
        lines.append(
            f"| {row['window']} | {row['memory']} | {ours['first_tv']:.2f} | {whole['first_tv']:.2f} | "
            f"{theirs['first_tv']:.2f} | {ours['same_class_mates']:.2f} | {whole['same_class_mates']:.2f} | "
            f"{theirs['same_class_mates']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cases_stream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="write quality against memory here (PNG)")
    args = parser.parse_args(argv)
    quality = stream_quality(list(WINDOWS))
    print(markdown(quality))
    if args.plot:
        plot(quality, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
