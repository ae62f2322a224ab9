"""ShardCache serves only what it downloaded, of the version the run identified: a copy that was replaced,
rewritten, truncated or swapped for a symbolic link is fetched again; an origin rewritten inside a live run
is refused, never mixed; errors name the shard's URL, not the cache's hashed file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stateful_sampler.stream import ParquetReader, ShardCache, ShardedStream, ShardReadError
from stateful_sampler.stream import cache as cache_module
from tests.stream.test_stream_cache import fetched, shards
from tests.stream.test_stream_remote import write_parquet

KWARGS = {"batch_size": 4, "window": 2, "seed": 3, "spread": 1}  # whole shards: windows evict each other
OTHER = [3 * x for x in range(20)]  # other records, encoded in as many bytes as shard 0's


def records(paths: list[str], reader: object) -> list[int]:
    return [record["x"] for record in ShardedStream(paths, reader, **KWARGS)]  # type: ignore[arg-type]


def poison(copy: Path, tmp_path: Path, damage: str) -> None:
    """Put other bytes where the cache's copy of shard 0 (records 0..19) is."""
    other = Path(write_parquet(tmp_path / "other.parquet", OTHER))
    if damage == "replaced, same size":
        assert other.stat().st_size == copy.stat().st_size  # a valid parquet file of other records, same size
        os.replace(other, copy)
    elif damage == "replaced, other size":
        longer = Path(write_parquet(tmp_path / "longer.parquet", [1000 + x for x in range(25)]))
        assert longer.stat().st_size != copy.stat().st_size
        os.replace(longer, copy)
    elif damage == "rewritten in place, same size":
        data = other.read_bytes()
        assert len(data) == copy.stat().st_size
        with open(copy, "r+b") as file:  # the same inode, other bytes
            file.write(data)
    elif damage == "truncated":
        with open(copy, "r+b") as file:
            file.truncate(copy.stat().st_size // 2)
    elif damage == "symbolic link":
        copy.unlink()
        copy.symlink_to(other)
    else:
        raise AssertionError(damage)


@pytest.mark.parametrize(
    "damage",
    ["replaced, same size", "replaced, other size", "rewritten in place, same size", "truncated", "symbolic link"],
)
def test_a_copy_that_is_not_the_one_downloaded_is_fetched_again_not_served(tmp_path: Path, damage: str) -> None:
    paths = shards(tmp_path, 2)
    expected = records(paths, ParquetReader())
    warm = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    assert records(paths, warm) == expected
    copy = warm.fetch(paths[0])
    poison(copy, tmp_path, damage)
    fresh = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)  # the next job on the node
    assert records(paths, fresh) == expected
    assert fetched(tmp_path / "cache").count(paths[0]) == 3  # its footer, its download, and the download again
    assert not copy.is_symlink() and copy.read_bytes() == Path(paths[0]).read_bytes()
    if damage == "symbolic link":
        other = ParquetReader().read(str(tmp_path / "other.parquet"), 0, 20)
        assert [record["x"] for record in other] == OTHER  # the link was removed, not written through


def test_a_copy_with_the_downloaded_bytes_but_a_new_inode_is_kept_without_a_download(tmp_path: Path) -> None:
    paths = shards(tmp_path, 1)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    copy = cache.fetch(paths[0])
    shutil.copy2(copy, tmp_path / "restored")  # as `cp -a` of the directory would: same bytes, another inode
    os.replace(tmp_path / "restored", copy)
    assert cache.read(paths[0], 0, 2) == [{"x": 0}, {"x": 1}]
    assert fetched(tmp_path / "cache") == [paths[0]]  # hashed and sealed again, not downloaded again


def test_an_origin_rewritten_between_epochs_of_a_live_run_is_refused_never_mixed(tmp_path: Path) -> None:
    paths = shards(tmp_path, 8)  # shard i holds 20 * i .. 20 * i + 19
    size = max(os.path.getsize(path) for path in paths)
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=3 * size, prefetch=False)  # holds 3 of 8
    stream = ShardedStream(paths, cache, **KWARGS)
    assert sorted(record["x"] for record in stream) == list(range(160))  # epoch 0
    for i, path in enumerate(paths):  # a new version of the data set: same names, same counts
        write_parquet(Path(path), [1000 + x for x in range(20 * i, 20 * i + 20)])
    delivered: list[int] = []
    with pytest.raises(ShardReadError, match=r"shard '.*/src/\d\.parquet' changed on storage during this run: the run "
                                             r"identified it as 'size=\d+;mtime_ns=\d+', storage now holds"):  # fmt: skip
        for record in stream:  # epoch 1: the evicted shards would be fetched anew
            delivered.append(record["x"])
    assert all(x < 1000 for x in delivered)  # what was delivered is the version the run identified
    # A new run (a new stream) identifies the new version and reads it whole.
    assert sorted(records(paths, ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=3 * size))) == list(
        range(1000, 1160)
    )


def test_a_corrupt_shard_read_through_the_cache_names_its_url_not_the_cached_file(tmp_path: Path) -> None:
    path = Path(shards(tmp_path, 1)[0])
    data = bytearray(path.read_bytes())
    data[4:40] = b"\xff" * 36  # the first page's header: the footer still reads
    path.write_bytes(bytes(data))
    url = f"file://{path}"
    with pytest.raises(ShardReadError, match=r"could not read rows 0\.\.3 of shard 'file://.*/0\.parquet'"):
        ParquetReader().read(url, 0, 4)  # the origin's own error
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    with pytest.raises(ShardReadError) as raised:
        cache.read(url, 0, 4)
    message = str(raised.value)
    assert message.startswith(f"could not read rows 0..3 of shard {url!r}: ")
    assert ".shard" not in message and f"from a verified copy of the bytes downloaded from {url!r}" in message


def test_a_directory_every_user_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(ValueError, match=r"directory '.*/shared' may be written by every user of the machine \(mode "
                                         r"0o1777\).*chmod o-w"):  # fmt: skip
        ShardCache(ParquetReader(), shared, max_bytes=1 << 20)


def test_the_cache_never_writes_through_a_symbolic_link_it_finds(tmp_path: Path, monkeypatch) -> None:
    paths = shards(tmp_path, 1)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    cache = ShardCache(ParquetReader(), tmp_path / "cache", max_bytes=1 << 20)
    key = cache._key(paths[0])[0]
    (tmp_path / "cache" / f"{key}.lock").symlink_to(victim)
    with pytest.raises(ShardReadError, match=rf"'.*/{key}\.lock' is a symbolic link: the cache never follows one"):
        cache.fetch(paths[0])
    (tmp_path / "cache" / f"{key}.lock").unlink()
    monkeypatch.setattr(cache_module.secrets, "token_hex", lambda size: "0" * 2 * size)  # a download's name, planted
    planted = tmp_path / "cache" / f"{key}.part-{'0' * 16}"
    planted.symlink_to(victim)
    monkeypatch.setattr(cache_module, "_abandoned", lambda path: False)  # as if a live download held it
    with pytest.raises(FileExistsError):  # O_EXCL: the reservation is a new file or nothing
        cache.fetch(paths[0])
    monkeypatch.undo()
    assert cache.read(paths[0], 0, 1) == [{"x": 0}]  # the link is nobody's download: removed, not followed
    assert not planted.is_symlink() and victim.read_bytes() == b"keep"
