"""Remote shards through the node-local ``ShardCache``, against a real S3 server (moto) on 127.0.0.1.

- metadata requests per shard per node at a start, at 1, 8 and 32 rank processes (each builds its own
  stream over one cache directory, all at once, as torchrun's ranks do; S3 requests counted where
  botocore sends them): a cold node (no manifest: the footers are read), then a restart (every process
  of that start exited: the next start looks the shards up again);
- bytes fetched from storage per byte of shard data, for the node, at 1, 8 and 32 readers (each
  reader its own process, as ranks x workers are, all reading one epoch at once through one cache
  directory); the same without the cache (every reader reads its spans from S3 itself);
- decode work: rows decoded (columnar, whole row groups) per record delivered (each reader decodes
  the row groups its positions fall in, so this grows with the readers; the cache does not change
  it), and records converted to Python per record delivered (1: each once, a batch at a time);
- resume: ``load_state_dict`` and the first batch from a cold cache (prefetch on, the default, and
  off), against fetching the same window's shards into another cold cache (alternated, median of 5),
  and what the first batch decoded and converted;
- steady state: records per second of one epoch from a warm cache, against reading the same local
  files in order with the same reader (``ParquetReader.read(path, 0, n)``: the same columns, the same
  decode and the same conversion to dicts), both counted by the same loop over their records;
  alternated, best of 7, the garbage collector kept out of the timings, in wall-clock and in CPU
  time (this process's threads, prefetch included);
  and, as the floor a shuffled order costs, the same files with each one's rows converted in a random
  order (``read_span`` and ``records_at``, 1,024 at a time), no stream; and the same stream over the
  local files without the cache (the cache's own cost).

    python -m benchmarks.cases_stream_remote            # about 2 minutes on 2 cores
    python -m benchmarks.cases_stream_remote --quick    # smaller shards (12 MiB in all)
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
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
    delivered = _count(stream.iter_worker(0, 1))
    return {"delivered": delivered, "rows": inner.stats.rows, "converted": inner.stats.converted,
            "remote": remote.transferred[0] - before}  # fmt: skip


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
        "converted_per_record": sum(result["converted"] for result in results) / delivered,
        "seconds": seconds,
    }


def resume_cost(urls: list[str], options: dict[str, Any], counts: list[int], repeats: int = 5) -> Result:
    """A resume mid-epoch on a cold cache: state load, then the first batch (one window's fetch), with the
    cache's default prefetch and without, against fetching that window's shards alone, one after another,
    into another cold cache; alternated, medians of ``repeats``."""
    live = ShardedStream(urls, ParquetReader(storage_options=options), batch_size=BATCH, window=WINDOW, seed=SEED,
                         counts=counts)  # fmt: skip
    state = live.state_dict(consumed_batches=len(live) // BATCH // 2)
    windows = live.order.epoch(state["epoch"])
    window = int(windows.window_of(np.array([state["position"]]))[0])
    shards = [urls[s] for s in windows.window_shards(window).tolist()]
    times: dict[str, list[float]] = {"load": [], "first": [], "first_no_prefetch": [], "fetch": [], "extra": []}
    for _ in range(repeats):
        for prefetch in (True, False):
            with tempfile.TemporaryDirectory() as cache_dir:
                inner = ParquetReader(storage_options=options)
                cache = ShardCache(inner, cache_dir, max_bytes=1 << 40, prefetch=prefetch)
                stream = ShardedStream(urls, cache, batch_size=BATCH, window=WINDOW, seed=SEED, counts=counts)
                started = time.perf_counter()
                stream.load_state_dict(state)
                loaded = time.perf_counter()
                iterator = iter(stream.loader(num_workers=0))
                next(iterator)
                first = time.perf_counter()
                del iterator
                decoded, converted = inner.stats.rows, inner.stats.converted
                cache.wait()  # the next window's prefetch, before its directory goes
            times["first" if prefetch else "first_no_prefetch"].append((first - started) * 1e3)
            if prefetch:
                times["load"].append((loaded - started) * 1e3)
                first_prefetch = (decoded, converted)
        with tempfile.TemporaryDirectory() as cache_dir:  # the same window's fetch alone, one shard after another
            cache = ShardCache(ParquetReader(storage_options=options), cache_dir, max_bytes=1 << 40, prefetch=False)
            for url in shards:
                cache._key(url)  # known before the timer, as the stream's cache knows them from its identities
            fetch_started = time.perf_counter()
            for url in shards:
                cache.fetch(url)
            times["fetch"].append((time.perf_counter() - fetch_started) * 1e3)
        times["extra"].append(times["first"][-1] - times["fetch"][-1])
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"load_ms": median["load"], "first_batch_ms": median["first"],
            "first_batch_no_prefetch_ms": median["first_no_prefetch"], "window_fetch_ms": median["fetch"],
            "extra_ms": median["extra"], "rows_decoded": first_prefetch[0], "records_converted": first_prefetch[1],
            "window_records": sum(counts[urls.index(url)] for url in shards)}  # fmt: skip


def metadata_requests(urls: list[str], options: dict[str, Any], readers: int) -> Result:
    """S3 requests per shard per node while every rank process of the node builds its stream, cold and at a
    restart; by kind (HEAD, ranged GET) as well."""
    from tests.s3_requests import node_start

    kwargs = {"batch_size": BATCH, "window": WINDOW, "seed": SEED}
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = node_start(urls, options, Path(cache_dir), readers, None, **kwargs)
        restart = node_start(urls, options, Path(cache_dir), readers, None, **kwargs)
    return {"readers": readers, "shards": len(urls), "cold": sum(cold.values()) / len(urls),
            "restart": sum(restart.values()) / len(urls), "cold_kinds": dict(cold), "restart_kinds": dict(restart)}  # fmt: skip


def _count(records: Any) -> int:
    """The consumer of both sides of the steady-state comparison: a loop over the records."""
    return sum(1 for _ in records)


def steady_state(urls: list[str], options: dict[str, Any], paths: list[str], counts: list[int]) -> Result:
    """Records per second: one epoch from a warm cache, against reading the local files in order."""
    reader = ParquetReader()
    local: list[tuple[float, float]] = []
    cached: list[tuple[float, float]] = []
    shuffled: list[float] = []
    direct: list[float] = []
    rng = np.random.default_rng(SEED)
    orders = [rng.permutation(count) for count in counts]
    with tempfile.TemporaryDirectory() as cache_dir:
        inner = ParquetReader(storage_options=options)
        cache = ShardCache(inner, cache_dir, max_bytes=1 << 40)
        for url in urls:
            cache.fetch(url)  # warm
        stream = ShardedStream(urls, cache, batch_size=BATCH, window=WINDOW, seed=SEED, counts=counts)
        on_disk = ShardedStream(paths, ParquetReader(), batch_size=BATCH, window=WINDOW, seed=SEED, counts=counts)
        for _ in range(7):  # alternated, best of 7: the machine is shared
            # Both sides build the same 32k dicts of 64 floats: the garbage collector's passes over them land
            # on either side by chance, so they are kept out of the timings (as timeit does).
            gc.collect()
            gc.disable()
            wall, cpu = time.perf_counter(), time.process_time()
            sequential = _count(record for path, count in zip(paths, counts) for record in reader.read(path, 0, count))
            local.append((sequential / (time.perf_counter() - wall), sequential / (time.process_time() - cpu)))
            converted = inner.stats.converted
            wall, cpu = time.perf_counter(), time.process_time()
            delivered = _count(stream.iter_worker(0, 1))
            cached.append((delivered / (time.perf_counter() - wall), delivered / (time.process_time() - cpu)))
            converted = inner.stats.converted - converted
            wall = time.perf_counter()  # no stream: each local file's rows converted in a random order
            gathered = _count(record for path, count, order in zip(paths, counts, orders)
                              for records in _chunked(reader.read_span(path, 0, count), order) for record in records)  # fmt: skip
            shuffled.append(gathered / (time.perf_counter() - wall))
            wall = time.perf_counter()  # the same stream over the local files: what the cache itself costs
            direct.append(_count(on_disk.iter_worker(0, 1)) / (time.perf_counter() - wall))
            gc.enable()
    local_rate, cached_rate = max(rate for rate, _ in local), max(rate for rate, _ in cached)
    local_cpu, cached_cpu = max(rate for _, rate in local), max(rate for _, rate in cached)
    return {"local_sequential": local_rate, "warm_cache": cached_rate, "ratio": cached_rate / local_rate,
            "cpu_ratio": cached_cpu / local_cpu, "random_order_ratio": max(shuffled) / local_rate,
            "stream_on_local_disk": max(direct), "cache_ratio": cached_rate / max(direct),
            "converted_per_record": converted / delivered}  # fmt: skip


def _chunked(span: Any, order: np.ndarray, chunk: int = 1024) -> Any:
    """The span's records in ``order``, built ``chunk`` at a time as the stream builds them (``take``)."""
    return (span.records_at(order[begin : begin + chunk]) for begin in range(0, len(order), chunk))


def run(quick: bool, reader_counts: tuple[int, ...] = (1, 8, 32), smoke: bool = False) -> list[tuple[str, Any]]:
    """``smoke``: 4 shards of 256 rows, to check that the figure runs (``python -m benchmarks --smoke``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.s3_server import s3_server

    shards, rows = (4, 256) if smoke else (16, 2048) if quick else (16, 8192)
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
        for readers in (1, 2) if smoke else (1, 8, 32):  # cheap at any size: the start alone
            out.append(("metadata", metadata_requests(urls, options, readers)))
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


def figure(mode: Any, run_case: Any, figures: Any) -> None:
    """``python -m benchmarks --only stream-remote``: the rows and the issue's targets."""
    from benchmarks.figures import Check, Row

    name = "stream from S3 (moto on 127.0.0.1), node-local cache"
    readers = mode.pick(quick=(1, 8), full=(1, 8, 32), smoke=(1, 2))  # make bench's quick mode: under a minute
    for kind, result in run(not mode.full, readers, smoke=mode.smoke):
        if kind == "metadata":
            case = f"start, {result['readers']} rank processes"
            for start in ("cold", "restart"):
                per_shard = sorted(result[f"{start}_kinds"].items())
                kinds = ", ".join(f"{count / result['shards']:g} {kind}" for kind, count in per_shard)
                system = "ours, ShardCache, cold node" if start == "cold" else "ours, ShardCache, restart"
                figures.rows.append(Row(name, case, system, result[start], "metadata requests / shard / node",
                                        note=kinds))  # fmt: skip
            figures.checks.append(Check(f"metadata requests per shard per node ≤ 1.1 at a restart, {case}",
                                        f"{result['restart']:.2f}", result["restart"] <= 1.1))  # fmt: skip
        elif kind == "node_io":
            bound = f" of {result['cache_windows']} windows" if result["cache_windows"] else ""
            system = f"ours, ShardCache{bound}" if result["cached"] else "ours, no cache (each reader reads S3)"
            case = f"{result['readers']} readers"
            figures.rows.append(Row(name, case, system, result["bytes_per_byte"], "B fetched / B data",
                                    note=f"{result['rows_per_record']:.2f} rows decoded, "
                                    f"{result['converted_per_record']:.2f} converted per record"))  # fmt: skip
            if result["cached"] and not result["cache_windows"]:
                figures.checks.append(Check(f"bytes fetched per byte ≤ 1.05 per node, {case}",
                                            f"{result['bytes_per_byte']:.3f}", result["bytes_per_byte"] <= 1.05))  # fmt: skip
        elif kind == "resume":
            figures.rows.append(Row(name, "resume, cold cache", "ours, first batch", result["first_batch_ms"], "ms",
                                    note=f"load_state_dict {result['load_ms']:.2f} ms; without prefetch "
                                    f"{result['first_batch_no_prefetch_ms']:.0f} ms; that window's fetch "
                                    f"{result['window_fetch_ms']:.0f} ms; {result['records_converted']} of its "
                                    f"{result['window_records']} records converted"))  # fmt: skip
            extra = result["extra_ms"]
            figures.checks.append(Check("resume ≤ 10 ms + one window's fetch", f"{extra:.1f} ms + fetch", extra <= 10))
        elif kind == "steady":
            figures.rows.append(Row(name, "steady state, 1 reader", "ours, warm cache", result["warm_cache"], "rec/s",
                                    note=f"CPU-time ratio {result['cpu_ratio']:.2f}; the same rows converted in a "
                                    f"random order, no stream: {result['random_order_ratio']:.2f}"))  # fmt: skip
            figures.rows.append(Row(name, "steady state, 1 reader", "sequential local reads", result["local_sequential"],
                                    "rec/s"))  # fmt: skip
            figures.rows.append(Row(name, "steady state, 1 reader", "ours on the local files, no cache",
                                    result["stream_on_local_disk"], "rec/s",
                                    note=f"warm cache / this: {result['cache_ratio']:.2f}"))  # fmt: skip
            figures.checks.append(Check("warm cache within 10% of sequential local reads",
                                        f"{result['ratio']:.2f}×", result["ratio"] >= 0.9))  # fmt: skip
