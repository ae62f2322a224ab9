"""Remote shards through the node-local ``ShardCache``, against a real S3 server (moto) on 127.0.0.1.

- bytes fetched from storage per byte of shard data, for the node, at 1, 8 and 32 readers (each
  reader its own process, as ranks x workers are, all reading one epoch at once through one cache
  directory); the same without the cache (every reader reads its spans from S3 itself);
- decode work: rows decoded per record delivered (each reader decodes the row groups its
  positions fall in, so this grows with the readers; the cache does not change it);
- resume: ``load_state_dict`` and the first batch from a cold cache, against fetching one window;
- steady state: records per second from a warm cache against reading the same shards from local
  disk, sequentially, with the same reader.

    python -m benchmarks.cases_stream_remote            # about 2 minutes on 2 cores
    python -m benchmarks.cases_stream_remote --quick    # smaller shards (12 MiB in all)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream

Result = dict[str, Any]
WINDOW, BATCH, SEED = 4, 64, 0


def write_shards(root: Path, shards: int, rows: int) -> list[str]:
    """``shards`` parquet files of ``rows`` records (an id and 64 random float32s: incompressible)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    paths = []
    for shard in range(shards):
        ids = np.arange(shard * rows, (shard + 1) * rows)
        table = pa.table({"id": ids, "x": list(rng.random((rows, 64), dtype=np.float32))})
        path = root / f"part-{shard:03d}.parquet"
        pq.write_table(table, path, row_group_size=256)
        paths.append(str(path))
    return paths


def _reader(args: tuple[Any, ...]) -> Result:
    """One reader (a rank's worker): its share of epoch 0, read through the cache or straight from S3."""
    urls, options, cache_dir, readers, rank, barrier, counts, max_bytes = args
    inner = ParquetReader(storage_options=options)
    reader = ShardCache(inner, cache_dir, max_bytes=max_bytes) if cache_dir else inner
    stream = ShardedStream(urls, reader, batch_size=BATCH, window=WINDOW, seed=SEED, num_replicas=readers,
                           rank=rank, counts=counts)  # fmt: skip
    barrier.wait()
    from stateful_sampler.stream import remote

    before = remote.transferred[0]
    delivered = sum(1 for _ in stream.iter_worker(0, 1))
    return {"delivered": delivered, "rows": inner.stats.rows, "remote": remote.transferred[0] - before}


def node_io(
    urls: list[str], options: dict[str, Any], paths: list[str], readers: int, cached: bool, windows: int = 0
) -> Result:
    """All readers of one node at once; bytes from storage per byte of data, rows decoded per record.
    ``windows``: the cache's size in windows (0: unbounded). The readers are not kept in step."""
    counts = [ParquetReader().count(path) for path in paths]
    size = sum(os.path.getsize(path) for path in paths)
    max_bytes = windows * WINDOW * max(os.path.getsize(path) for path in paths) if windows else 1 << 40
    with tempfile.TemporaryDirectory() as cache_dir:
        context = multiprocessing.get_context("fork")
        barrier = context.Manager().Barrier(readers)
        started = time.perf_counter()
        with context.Pool(readers) as pool:
            jobs = [(urls, options, cache_dir if cached else None, readers, r, barrier, counts, max_bytes)
                    for r in range(readers)]  # fmt: skip
            results = pool.map(_reader, jobs)
        seconds = time.perf_counter() - started
        # With the cache, the log has every transfer of the node (downloads and footers); without
        # it, each reader counts what it read.
        if cached:
            fetched = ShardCache(ParquetReader(), cache_dir, max_bytes=1).stats().bytes
        else:
            fetched = sum(result["remote"] for result in results)
    delivered = sum(result["delivered"] for result in results)
    return {
        "readers": readers,
        "cached": cached,
        "cache_windows": windows,
        "bytes_per_byte": fetched / size,
        "rows_per_record": sum(result["rows"] for result in results) / delivered,
        "seconds": seconds,
    }


def resume_cost(urls: list[str], options: dict[str, Any], counts: list[int]) -> Result:
    """A resume mid-epoch on a cold cache: state load, then the first batch (one window's fetch)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        live = ShardedStream(urls, ParquetReader(storage_options=options), batch_size=BATCH, window=WINDOW,
                             seed=SEED, counts=counts)  # fmt: skip
        state = live.state_dict(consumed_batches=len(live) // BATCH // 2)
        cache = ShardCache(ParquetReader(storage_options=options), cache_dir, max_bytes=1 << 40, prefetch=False)
        stream = ShardedStream(urls, cache, batch_size=BATCH, window=WINDOW, seed=SEED, counts=counts)
        started = time.perf_counter()
        stream.load_state_dict(state)
        loaded = time.perf_counter()
        iterator = iter(stream.loader(num_workers=0))
        next(iterator)
        first = time.perf_counter()
        del iterator
    with tempfile.TemporaryDirectory() as cache_dir:  # one window's fetch alone, for comparison
        cache = ShardCache(ParquetReader(storage_options=options), cache_dir, max_bytes=1 << 40, prefetch=False)
        for url in urls[:WINDOW]:
            cache._key(url)
        fetch_started = time.perf_counter()
        for url in urls[:WINDOW]:
            cache.fetch(url)
        window_fetch = time.perf_counter() - fetch_started
    return {"load_ms": (loaded - started) * 1e3, "first_batch_ms": (first - started) * 1e3,
            "window_fetch_ms": window_fetch * 1e3}  # fmt: skip


def steady_state(urls: list[str], options: dict[str, Any], paths: list[str], counts: list[int]) -> Result:
    """Records per second: one epoch from a warm cache, against reading the local files in order."""
    reader = ParquetReader()
    local_rate = cached_rate = 0.0
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = ShardCache(ParquetReader(storage_options=options), cache_dir, max_bytes=1 << 40)
        for url in urls:
            cache.fetch(url)  # warm
        stream = ShardedStream(urls, cache, batch_size=BATCH, window=WINDOW, seed=SEED, counts=counts)
        for _ in range(3):  # alternated, best of 3: the machine is shared
            started = time.perf_counter()
            sequential = sum(len(reader.read(path, 0, count)) for path, count in zip(paths, counts))
            local_rate = max(local_rate, sequential / (time.perf_counter() - started))
            started = time.perf_counter()
            delivered = sum(1 for _ in stream.iter_worker(0, 1))
            cached_rate = max(cached_rate, delivered / (time.perf_counter() - started))
    return {"local_sequential": local_rate, "warm_cache": cached_rate, "ratio": cached_rate / local_rate}


def run(quick: bool, reader_counts: tuple[int, ...] = (1, 8, 32)) -> list[tuple[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.s3_server import s3_server

    shards, rows = (16, 2048) if quick else (16, 8192)
    out: list[tuple[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch, s3_server() as server:
        paths = write_shards(Path(scratch), shards, rows)
        fs = server.filesystem()
        fs.mkdir("bench")
        for path in paths:
            fs.put(path, f"bench/{Path(path).name}")
        urls = [f"s3://bench/{Path(path).name}" for path in paths]
        options = server.storage_options
        counts = [rows] * shards
        size = sum(os.path.getsize(path) for path in paths)
        out.append(("data", {"shards": shards, "rows": rows, "MiB": size / 2**20, "window": WINDOW}))
        for readers in reader_counts:
            out.append(("node_io", node_io(urls, options, paths, readers, cached=True)))
        out.append(("node_io", node_io(urls, options, paths, 8, cached=True, windows=3)))
        out.append(("node_io", node_io(urls, options, paths, 8, cached=False)))
        out.append(("node_io", node_io(urls, options, paths, reader_counts[-1], cached=False)))
        out.append(("resume", resume_cost(urls, options, counts)))
        out.append(("steady", steady_state(urls, options, paths, counts)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cases_stream_remote", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    for name, result in run(args.quick):
        print(name, {key: round(value, 4) if isinstance(value, float) else value for key, value in result.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())


def figure(full: bool, run_case: Any, figures: Any) -> None:
    """``python -m benchmarks --only stream-remote``: the rows and the issue's targets."""
    from benchmarks.figures import Check, Row

    name = "stream from S3 (moto on 127.0.0.1), node-local cache"
    for kind, result in run(not full, (1, 8, 32) if full else (1, 8)):  # make bench's quick mode: under a minute
        if kind == "node_io":
            bound = f" of {result['cache_windows']} windows" if result["cache_windows"] else ""
            system = f"ours, ShardCache{bound}" if result["cached"] else "ours, no cache (each reader reads S3)"
            case = f"{result['readers']} readers"
            figures.rows.append(Row(name, case, system, result["bytes_per_byte"], "B fetched / B data",
                                    note=f"{result['rows_per_record']:.2f} rows decoded per record"))  # fmt: skip
            if result["cached"] and not result["cache_windows"]:
                figures.checks.append(Check(f"bytes fetched per byte ≤ 1.05 per node, {case}",
                                            f"{result['bytes_per_byte']:.3f}", result["bytes_per_byte"] <= 1.05))  # fmt: skip
        elif kind == "resume":
            figures.rows.append(Row(name, "resume, cold cache", "ours, first batch", result["first_batch_ms"], "ms",
                                    note=f"load_state_dict {result['load_ms']:.2f} ms; one window's fetch "
                                    f"{result['window_fetch_ms']:.0f} ms"))  # fmt: skip
            extra = result["first_batch_ms"] - result["window_fetch_ms"]
            figures.checks.append(Check("resume ≤ 10 ms + one window's fetch", f"{extra:.1f} ms + fetch", extra <= 10))
        elif kind == "steady":
            figures.rows.append(Row(name, "steady state, 1 reader", "ours, warm cache", result["warm_cache"], "rec/s"))
            figures.rows.append(Row(name, "steady state, 1 reader", "sequential local reads", result["local_sequential"],
                                    "rec/s"))  # fmt: skip
            figures.checks.append(Check("warm cache within 10% of sequential local reads",
                                        f"{result['ratio']:.2f}×", result["ratio"] >= 0.9))  # fmt: skip
