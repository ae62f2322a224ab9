"""The contract every format reader passes (tests/stream_readers.py lists them; a new reader gets the whole contract by
adding one line there): the stream delivers exactly the records of an eager read of each shard, in the stream's order,
read by path and through a ShardCache of file:// URLs; a run SIGKILLed at 2 workers and resumed at 0 (and the
reverse) is bit-exact; a resume from 2 ranks to 1 (and 1 to 2) delivers every unconsumed record exactly once, in equal
steps per rank; a changed shard is refused on resume; a truncated or corrupt shard is named in a ShardReadError."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stateful_sampler import IncompatibleStateError
from stateful_sampler.stream import ShardCache, ShardedStream, ShardReadError
from tests.stream_helpers import loop_batches
from tests.stream_readers import FORMATS

ROOT = Path(__file__).resolve().parents[2]
NAMES = list(FORMATS)


class Positions:
    """Shard ``s`` row ``r`` is ``(s, r)``: the stream's order over the same shards and counts."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def count(self, shard: str) -> int:
        return self.counts[shard]

    def read(self, shard: str, start: int, stop: int) -> list[tuple[str, int]]:
        return [(shard, row) for row in range(start, stop)]


def made(name: str, root: Path) -> tuple[list[str], Any]:
    root.mkdir(parents=True, exist_ok=True)
    FORMATS[name].write(root)
    return FORMATS[name].open(root)


def ids(name: str, batches: list[list[Any]]) -> list[list[int]]:
    return [[FORMATS[name].record_id(record) for record in batch] for batch in batches]


def as_url(shard: str) -> str:
    return Path(shard).resolve().as_uri()


@pytest.mark.parametrize("access", ["path", "url", "cached-url"])
@pytest.mark.parametrize("name", NAMES)
def test_the_stream_delivers_an_eager_read_of_each_shard_in_the_stream_order(
    name: str, access: str, tmp_path: Path, monkeypatch
) -> None:
    shards, reader = made(name, tmp_path / "shards")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # where TarReader keeps the index of a URL
    eager = {shard: reader.read(shard, 0, reader.count(shard)) for shard in shards}
    assert sum(map(len, eager.values())) == 26 and len(shards) >= 3
    if access != "path":  # fsspec's file://, read directly or through a node-local cache (which reads its copies)
        shards = [as_url(shard) for shard in shards]
        eager = {as_url(shard): [{**r, "__url__": as_url(shard)} if name == "tar" else r for r in records]
                 for shard, records in eager.items()}  # fmt: skip
        if access == "cached-url":
            reader = ShardCache(reader, tmp_path / "cache", max_bytes=1 << 20)
    config = {"batch_size": 4, "window": 2, "seed": 3}
    order = loop_batches(ShardedStream(shards, Positions({s: len(r) for s, r in eager.items()}), **config), 0)
    batches = loop_batches(ShardedStream(shards, reader, **config), 2)
    expected = [[eager[shard][row] for shard, row in batch] for batch in order]
    if name == "tar" and access == "cached-url":  # __url__ is the file the reader read: the cache's copy
        expected = [[{**record, "__url__": ""} for record in batch] for batch in expected]
        batches = [[{**record, "__url__": ""} for record in batch] for batch in batches]
    assert len(batches) == 7 and repr(batches) == repr(
        expected
    )  # repr: numpy scalars and arrays compare exactly, with their dtypes
    assert Counter(ident for batch in ids(name, batches) for ident in batch) == Counter(
        FORMATS[name].record_id(record) for records in eager.values() for record in records
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_an_elastic_resume_delivers_every_unconsumed_record_once_in_equal_steps(
    name: str, before: int, after: int, tmp_path: Path
) -> None:
    shards, reader = made(name, tmp_path)

    def ranks(world: int) -> list[ShardedStream]:
        return [ShardedStream(shards, reader, batch_size=2, window=2, seed=7, num_replicas=world, rank=rank,
                              yield_keys=True) for rank in range(world)]  # fmt: skip

    def delivered(batches: list[list[Any]]) -> list[int]:  # the ids of the records, padding left out
        return [FORMATS[name].record_id(record) for batch in batches for record, key in batch if not key.is_padding]

    consumed = 3
    first = ranks(before)
    taken = [loop_batches(stream, 0, limit=consumed) for stream in first]
    state = json.loads(json.dumps(first[0].state_dict(consumed_batches=consumed)))
    second = ranks(after)
    for stream in second:
        stream.load_state_dict(state)
    rest = [loop_batches(stream, 0) for stream in second]
    assert len({len(batches) for batches in rest}) == 1  # equal steps: DDP cannot hang
    every = Counter(
        FORMATS[name].record_id(record) for shard in shards for record in reader.read(shard, 0, reader.count(shard))
    )
    assert len(every) == 26 and set(every.values()) == {1}
    assert Counter(ident for part in (taken, rest) for batches in part for ident in delivered(batches)) == every


@pytest.mark.parametrize("name", NAMES)
def test_a_shard_changed_since_the_save_is_refused_on_resume(name: str, tmp_path: Path) -> None:
    shards, reader = made(name, tmp_path)
    state = ShardedStream(shards, reader, batch_size=2).state_dict(consumed_batches=2)
    shard = shards[1]
    data = Path(shard).read_bytes()
    assert b"record" in data
    Path(shard).write_bytes(data.replace(b"record", b"rEcord", 1))  # one byte, same size and count
    stat = os.stat(shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    _, reopened = FORMATS[name].open(tmp_path)
    changed = ShardedStream(shards, reopened, batch_size=2)
    with pytest.raises(IncompatibleStateError, match=re.escape(f"shard {shard!r} changed since the save")):
        changed.load_state_dict(state)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_truncated_or_corrupt_shard_is_named_in_a_shard_read_error(name: str, damage: str, tmp_path: Path) -> None:
    shards, _ = made(name, tmp_path)
    shard = shards[1]
    data = Path(shard).read_bytes()
    Path(shard).write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\xff" * 16 + data[16:])
    with pytest.raises(ShardReadError, match=re.escape(repr(shard))):
        _, reader = FORMATS[name].open(tmp_path)
        stream = ShardedStream(shards, reader, batch_size=2, window=len(shards))
        loop_batches(stream, 0)


def run(root: Path, shards: Path, name: str, workers: int, kill_after: int | None = None) -> int:
    command = [sys.executable, "-m", "tests.stream.stream_kill_run", "plain", str(root), "--workers", str(workers),
               "--reader", name, "--shards", str(shards)]  # fmt: skip
    if kill_after is not None:
        command += ["--kill-after", str(kill_after)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=environment, timeout=300, capture_output=True, check=False)
    assert done.returncode in (0, -9), done.stderr.decode()[-2000:]
    return done.returncode


def records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "record.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_run_killed_mid_epoch_resumes_bit_exactly_from_2_workers_to_0_and_from_0_to_2(
    name: str, tmp_path: Path
) -> None:
    """One run killed twice: at 2 workers (resumed at 0), then at 0 (resumed at 2); the uninterrupted run is
    the same loop at 0 workers, in this process."""
    from tests.stream.stream_kill_run import train

    shards = tmp_path / "shards"
    shards.mkdir()
    FORMATS[name].write(shards)
    whole = tmp_path / "whole"
    whole.mkdir()
    train("plain", whole, workers=0, reader=name, shards=shards)
    expected = records(whole)
    assert len(expected) == 18  # 26 records in batches of 3, two epochs
    cut = tmp_path / "cut"
    cut.mkdir()
    assert run(cut, shards, name, workers=2, kill_after=11) == -9  # epoch 1, batch 2 of 9
    assert len(records(cut)) == 11
    assert run(cut, shards, name, workers=0, kill_after=3) == -9  # epoch 1, batch 5 of 9
    assert len(records(cut)) == 14 and records(cut) == expected[:14]
    assert run(cut, shards, name, workers=2) == 0
    assert records(cut) == expected  # every batch, its records and their augmentation


@pytest.fixture(scope="module")
def s3():
    from tests.s3_server import s3_server

    with s3_server() as server:
        yield server


def on_s3(reader: Any, root_url: str, storage_options: dict[str, Any]) -> Any:
    """The same kind of reader over the copy of its shards at ``root_url``."""
    if hasattr(reader, "root"):  # MDS, LitData: opened on the dataset's directory
        return type(reader)(root_url, storage_options=storage_options)
    return type(reader)(storage_options=storage_options)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_s3_shards_read_directly_and_through_a_cache_as_the_local_ones(
    name: str, s3: Any, tmp_path: Path, monkeypatch
) -> None:
    """A real S3-compatible server on 127.0.0.1: identity by ETag, a tar's index in the user cache, ranges read."""
    root = tmp_path / "shards"
    shards, reader = made(name, root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    bucket = s3.bucket(f"readers-{name}")
    s3.filesystem().put(f"{root}/", f"{bucket.removeprefix('s3://')}/data/", recursive=True)
    urls = [f"{bucket}/data/{Path(shard).relative_to(root).as_posix()}" for shard in shards]
    config = {"batch_size": 4, "window": 2, "seed": 3}
    local = loop_batches(ShardedStream(shards, reader, **config), 0)
    remote = on_s3(reader, f"{bucket}/data", s3.storage_options)
    for through in (remote, ShardCache(remote, tmp_path / "cache", max_bytes=1 << 20)):
        batches = loop_batches(ShardedStream(urls, through, **config), 2)
        assert ids(name, batches) == ids(name, local)
        identity = through.identity(urls[0])
        assert "ETag=" in identity and identity != reader.identity(shards[0])
    if name == "tar":
        assert len(list((tmp_path / "xdg").rglob("*.tarindex"))) == len(urls)  # remote shards' indexes, once each


@pytest.mark.parametrize("name", NAMES)
def test_a_pickled_reader_reads_the_same_records(name: str, tmp_path: Path) -> None:
    """What a spawned DataLoader worker gets: the reader pickled after it counted every shard."""
    shards, reader = made(name, tmp_path)
    eager = [reader.read(shard, 0, reader.count(shard)) for shard in shards]
    copy = pickle.loads(pickle.dumps(reader))
    assert repr([copy.read(shard, 0, copy.count(shard)) for shard in shards]) == repr(eager)


@pytest.mark.parametrize("name", NAMES)
def test_read_rows_gives_the_records_at_the_rows_in_their_order_and_names_a_shard_that_holds_fewer(
    name: str, tmp_path: Path
) -> None:
    shards, reader = made(name, tmp_path)
    shard = shards[2]
    every = reader.read(shard, 0, reader.count(shard))
    rows = [len(every) - 1, 0, 3, 2]
    before = reader.stats.converted
    assert repr(reader.read_rows(shard, rows)) == repr([every[row] for row in rows])
    assert reader.stats.converted - before == len(rows) and reader.read_rows(shard, []) == []
    with pytest.raises(ShardReadError, match=re.escape(repr(shard))):
        reader.read_rows(shard, [1, len(every)])


@pytest.mark.parametrize("name", NAMES)
def test_a_resumes_first_batch_converts_only_its_own_records(name: str, tmp_path: Path) -> None:
    shards, reader = made(name, tmp_path)
    config = {"batch_size": 3, "window": 2, "seed": 1}
    uninterrupted = loop_batches(ShardedStream(shards, FORMATS[name].open(tmp_path)[1], **config), 0)
    resumed = ShardedStream(shards, reader, **config)
    resumed.load_state_dict(resumed.state_dict(consumed_batches=4))
    first = loop_batches(resumed, 0, limit=1)
    assert repr(first) == repr(uninterrupted[4:5]) and reader.stats.converted == 3
