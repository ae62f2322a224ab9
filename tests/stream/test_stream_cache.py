"""ShardCache: one fetch per shard per node whatever the readers, bounded by its size, evicting done
windows first, fetching the next window ahead; the stream's order unchanged through it."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream
from tests.stream.test_stream_remote import write_parquet


def shards(tmp_path: Path, count: int = 6, rows: int = 20) -> list[str]:
    (tmp_path / "src").mkdir(exist_ok=True)
    return [
        write_parquet(tmp_path / "src" / f"{i}.parquet", list(range(i * rows, (i + 1) * rows))) for i in range(count)
    ]


def fetched(directory: Path) -> list[str]:
    log = directory / "fetched.log"
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()] if log.exists() else []


def cached(directory: Path) -> int:
    return len(list(directory.glob("*.shard")))


def test_a_fetch_is_a_complete_copy_and_a_second_fetch_reads_no_storage(tmp_path: Path) -> None:
    paths = shards(tmp_path, 2)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    local = cache.fetch(paths[0])
    assert local.read_bytes() == Path(paths[0]).read_bytes()
    assert cache.fetch(paths[0]) == local
    assert fetched(tmp_path / "cache") == [paths[0]]
    assert cache.read(paths[1], 2, 4) == [{"x": 22}, {"x": 23}]
    assert cache.stats().transfers == 2 and cache.stats().bytes == sum(os.path.getsize(p) for p in paths)


def test_count_and_identity_are_read_once_per_node_and_match_the_reader(tmp_path: Path) -> None:
    paths = shards(tmp_path, 1)
    first = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert (first.count(paths[0]), first.identity(paths[0])) == (20, ParquetReader().identity(paths[0]))
    second = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)  # another process's view
    assert (second.count(paths[0]), second.identity(paths[0])) == (20, ParquetReader().identity(paths[0]))
    assert fetched(tmp_path / "cache") == [paths[0]]  # the footer, once


def test_a_changed_shard_is_fetched_again_not_served_stale(tmp_path: Path) -> None:
    paths = shards(tmp_path, 1)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert cache.read(paths[0], 0, 1) == [{"x": 0}]
    write_parquet(Path(paths[0]), [7] * 20)
    fresh = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert fresh.read(paths[0], 0, 1) == [{"x": 7}]


def test_done_shards_are_evicted_first_and_pinned_ones_never(tmp_path: Path) -> None:
    paths = shards(tmp_path, 6)
    size = max(os.path.getsize(p) for p in paths)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=3 * size, prefetch=False)
    cache.enter_window(paths[0:2], paths[2:3])
    for path in paths[0:3]:
        cache.fetch(path)
    cache.enter_window(paths[2:3], paths[3:5])  # 0 and 1 are done
    cache.fetch(paths[3])
    cache.fetch(paths[4])
    names = {p.name for p in (tmp_path / "cache").glob("*.shard")}
    assert names == {cache.fetch(p).name for p in paths[2:5]}
    assert cached(tmp_path / "cache") == 3
    # Everything pinned: a read still gets its shard (the size is passed), nothing pinned is lost.
    cache.enter_window(paths[2:5], paths[5:6])
    cache.fetch(paths[5])
    assert cached(tmp_path / "cache") == 4
    assert fetched(tmp_path / "cache") == paths


def test_the_next_window_is_fetched_ahead_but_not_past_the_size(tmp_path: Path) -> None:
    paths = shards(tmp_path, 4)
    size = max(os.path.getsize(p) for p in paths)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=2 * size)
    cache.enter_window(paths[0:1], paths[1:2])
    cache.wait()
    assert fetched(tmp_path / "cache") == [paths[1]]
    cache.fetch(paths[0])
    cache.enter_window(paths[0:2], paths[2:4])  # no room while 0 and 1 are pinned: the prefetch waits
    cache.wait()
    assert fetched(tmp_path / "cache") == [paths[1], paths[0]]


def test_pins_and_downloads_of_dead_processes_are_ignored(tmp_path: Path) -> None:
    paths = shards(tmp_path, 3)
    size = max(os.path.getsize(p) for p in paths)
    directory = tmp_path / "cache"
    cache = ShardCache(ParquetReader(), directory, max_bytes=2 * size, prefetch=False)
    for path in paths[:2]:
        cache.fetch(path)
    dead = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    dead.start()
    dead.join()
    keys = [cache.fetch(p).name[: -len(".shard")] for p in paths[:2]]
    (directory / "pins" / f"{dead.pid}-0.json").write_text(json.dumps(keys))
    (directory / f"{keys[0]}.part-{dead.pid}-0").write_bytes(b"\0" * size)
    cache.fetch(paths[2])
    assert not (directory / "pins" / f"{dead.pid}-0.json").exists()
    assert not (directory / f"{keys[0]}.part-{dead.pid}-0").exists()
    assert cached(directory) == 2


class PrefetchHeld(ShardCache):
    """Its prefetch thread waits for ``release`` before each background fetch: the thread falls behind the
    reader, as it does on a loaded machine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def _fetch(self, shard: str, demand: bool) -> Path | None:
        if not demand:
            assert self.release.wait(timeout=60)
        return super()._fetch(shard, demand)


def test_a_pin_left_behind_the_reads_never_replaces_a_later_windows_pin(tmp_path: Path) -> None:
    # Seen under load: window 1's pin, left to the prefetch thread behind window 0's fetches, was written
    # after window 2's, unpinning windows 2 and 3 while the reader read them; a fetch evicted one.
    paths = shards(tmp_path, 8)
    cache = PrefetchHeld(ParquetReader(), tmp_path / "cache", max_bytes=1 << 30)
    cache.enter_window(paths[0:2], paths[2:4])  # pinned at once; shards 1-3 wait in the prefetch thread
    for path in paths[0:2]:
        cache.read_span(path, 0, 20)
    cache.enter_window(paths[2:4], paths[4:6])  # already pinned: its pin goes behind the prefetches
    cache.enter_window(paths[4:6], paths[6:8])  # not pinned yet: pinned at once
    cache.release.set()
    cache.wait()
    [pin] = (tmp_path / "cache" / "pins").glob("*.json")
    assert json.loads(pin.read_text()) == [cache.fetch(path).stem for path in paths[4:8]]


class EvictedBeforeOpen(ParquetReader):
    """Its first read finds the local copy gone (evicted by a process that does not pin it)."""

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, Any]]:
        self._evict_once(shard)
        return super().read(shard, start, stop)

    def read_span(self, shard: str, start: int, stop: int) -> Any:
        self._evict_once(shard)
        return super().read_span(shard, start, stop)

    def _evict_once(self, shard: str) -> None:
        if not getattr(self, "evicted", False):
            self.evicted = True
            os.unlink(shard)


@pytest.mark.parametrize("method", ["read", "read_span"])
def test_a_copy_evicted_between_fetch_and_open_is_fetched_again(tmp_path: Path, method: str) -> None:
    paths = shards(tmp_path, 1)
    cache = ShardCache(EvictedBeforeOpen(), tmp_path / "cache", max_bytes=1 << 20, prefetch=False)
    assert list(getattr(cache, method)(paths[0], 3, 5)) == [{"x": 3}, {"x": 4}]
    assert fetched(tmp_path / "cache") == paths * 2


def _fetch_all(directory: str, paths: list[str], order: int) -> None:
    cache = ShardCache(ParquetReader(), directory, max_bytes=1 << 30, prefetch=False)
    for path in paths[order:] + paths[:order]:
        cache.read(path, 0, 20)


@pytest.mark.slow
def test_concurrent_processes_download_each_shard_once(tmp_path: Path) -> None:
    paths = shards(tmp_path, 6)
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_fetch_all, args=(str(tmp_path / "cache"), paths, i % 3)) for i in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    assert [process.exitcode for process in processes] == [0] * 6
    assert sorted(fetched(tmp_path / "cache")) == sorted(paths)
    assert not list((tmp_path / "cache").glob("*.part-*"))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_the_order_through_the_cache_is_the_reader_order_and_each_shard_is_fetched_once(
    tmp_path: Path, workers: int
) -> None:
    paths = shards(tmp_path, 8, rows=12)
    size = max(os.path.getsize(p) for p in paths)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=5 * size)  # two windows and one spare
    kwargs = {"batch_size": 4, "window": 2, "seed": 5, "spread": 1}  # whole shards: a window pins 2 of them
    expected = [b["x"].tolist() for b in ShardedStream(paths, ParquetReader(), **kwargs).loader(num_workers=0)]
    stream = ShardedStream(paths, cache, **kwargs)
    got = [b["x"].tolist() for b in stream.loader(num_workers=workers)]
    assert got == expected
    downloads = fetched(tmp_path / "cache")[len(paths) :]  # after the footers
    assert sorted(downloads) == sorted(paths)  # once each, for every reader
    assert cached(tmp_path / "cache") <= 5


class WindowLog:
    """A reader that records the windows the stream announces and the shards it then reads."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.events: list[tuple[str, list[str], list[str]]] = []

    def count(self, shard: str) -> int:
        return self.counts[shard]

    def read(self, shard: str, start: int, stop: int) -> list[int]:
        self.events.append(("read", [shard], []))
        return list(range(start, stop))

    def enter_window(self, shards: list[str], next_shards: list[str]) -> None:
        self.events.append(("enter", list(shards), list(next_shards)))


@pytest.mark.parametrize(("epoch", "resume_at"), [(0, 0), (1, 0), (1, 37)])
def test_the_stream_announces_each_window_and_the_next_before_reading_it(epoch: int, resume_at: int) -> None:
    names = [f"s{i}" for i in range(7)]
    reader = WindowLog(dict(zip(names, [10, 3, 8, 10, 5, 10, 9])))
    stream = ShardedStream(names, reader, batch_size=4, window=3, seed=2)
    stream.set_epoch(epoch)
    if resume_at:
        stream.load_state_dict({**stream.state_dict(consumed_batches=0), "position": resume_at})
    list(stream)
    windows = stream.order.epoch(epoch)
    first = int(windows.window_of(np.array([resume_at]))[0])
    expected = [[names[s] for s in windows.window_shards(w).tolist()] for w in range(first, windows.windows)]
    entered = [event for event in reader.events if event[0] == "enter"]
    assert [shards for _, shards, _ in entered] == expected
    assert [following for _, _, following in entered] == expected[1:] + [[]]
    current: list[str] = []
    for kind, shards, _ in reader.events:  # every read is of a shard of the window last announced
        if kind == "enter":
            current = shards
        else:
            assert shards[0] in current
